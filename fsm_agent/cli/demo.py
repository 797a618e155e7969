"""The demonstration ``make demo`` runs: every way a run ends, with scripted models.

Scenarios A to C are the three stops the package was first written to make
visible (too many steps, a repeated call, a cut-off reply); D shows
consecutive tool failures with the last error, E a natural finish.  The
lines are in English; ``--original-text`` prints them, and has the scripted
models speak, in the Chinese of the text the package started from, with the
same stops and figures.  Each
run's path is drawn into ``--out DIR``, or into a fresh temporary directory
whose name is printed: the demo never writes into whatever directory it was
started from.  The runs are also checkpointed into a store file (``--store``,
else ``runs.db`` in a fresh temporary directory), and the last line printed is
the ``ui`` command that shows them in a browser, written so that it runs as
printed in a fresh shell (no virtual environment active).
"""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from fsm_agent import TABLE, Agent, AgentLoopError, Model, RunResult, SqliteStore, ToolCall
from fsm_agent.cli import EXIT_DONE, EXIT_SETUP
from fsm_agent.persist import StoreError
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, edges, reply, tool_call, tool_turn


def _scenario(label: str, go: Callable[[], RunResult], describe: Callable[[AgentLoopError], str]) -> RunResult:
    try:
        result = go()
    except AgentLoopError as exc:
        print(f"{label}) {exc.reason}: {describe(exc)}")
        return exc.result
    print(f"{label}) done: {result.final}")
    return result


ENGLISH = {
    "start": "Start.",
    "question": "Please work out (2+3)*4.",
    "cut_off": "First I add, which gives",
    "first_step": "Adding first.",
    "steps": lambda n: f"{n} step{'' if n == 1 else 's'} done",
    "kept": lambda text: f"text kept {text!r}",
    "failed": lambda n, error: f"{n} failures in a row, last error {error}",
}
"""What the demo prints and its scripted models say, by default."""

ORIGINAL = {
    "start": "开始",
    "question": "请计算 (2+3)*4",
    "cut_off": "我先算加法得",
    "first_step": "先算加法。",
    "steps": lambda n: f"已完成 {n} 步",
    "kept": lambda text: f"保留文本 {text!r}",
    "failed": lambda n, error: f"连续失败 {n} 次, 最后错误 {error}",
}
"""The same, in the Chinese of the text the package started from (``--original-text``)."""


def scenarios(store: SqliteStore | None = None, words: dict[str, Any] = ENGLISH) -> list[tuple[str, RunResult]]:
    """Run the five scenarios, print one line each, and return their results by name (checkpointed into ``store``).

    ``words`` is the language of the prompts, the scripted replies and the
    printed lines: ``ENGLISH`` or ``ORIGINAL``; the stops and figures are the same in both.
    """
    registry = demo_registry()
    results: list[tuple[str, RunResult]] = []

    def run(model: Model, prompt: str, *, name: str, max_steps: int = 8) -> RunResult:
        # An id per scenario, replaced on a second demo into the same store.
        agent = Agent(model, registry, max_steps=max_steps)
        return agent.run(prompt, store=store, run_id=name if store is not None else None, overwrite=True)

    def keep(name: str, result: RunResult) -> None:
        results.append((name, result))
        print(f"   path: {' '.join(edges(result)[-3:])}")

    keep(
        "A_max_steps",
        _scenario(
            "A",
            lambda: run(CounterModel(), words["start"], name="A_max_steps", max_steps=3),
            lambda exc: words["steps"](len(exc.result.steps)),
        ),
    )
    same = ToolCall(id="c1", name="echo", arguments={"text": "ping"})
    keep(
        "B_repeated_action",
        _scenario(
            "B",
            lambda: run(LoopingModel(same), words["start"], name="B_repeated_action", max_steps=8),
            lambda exc: words["steps"](len(exc.result.steps)),
        ),
    )
    truncated = reply(words["cut_off"], stop_reason="max_tokens")
    keep(
        "C_max_tokens",
        _scenario(
            "C",
            lambda: run(FakeModel([truncated]), words["question"], name="C_max_tokens"),
            lambda exc: words["kept"](exc.result.final),
        ),
    )
    # Three different mistakes in a row: a string for a number, an unknown tool, a tool that reports an error.
    stuck = FakeModel(
        [
            tool_turn(tool_call("add", a="2", b=3)),
            tool_turn(tool_call("multiply", a=2, b=3)),
            tool_turn(tool_call("fail", reason="quota exceeded")),
        ]
    )
    keep(
        "D_tool_failures",
        _scenario(
            "D",
            lambda: run(stuck, words["question"], name="D_tool_failures"),
            lambda exc: words["failed"](exc.evidence["failures"], exc.evidence["last_error"]),
        ),
    )
    solved = FakeModel(
        [
            tool_turn(tool_call("add", a=2, b=3), content=words["first_step"]),
            tool_turn(tool_call("add", a=5, b=5), tool_call("add", a=10, b=10)),
            reply("(2+3)*4 = 20"),
        ]
    )
    keep(
        "E_done",
        _scenario("E", lambda: run(solved, words["question"], name="E_done"), lambda exc: exc.reason),
    )
    return results


def command() -> str:
    """How to start this package's command line from the current directory, in a shell with no venv active.

    The ``fsm-agent`` script next to the running interpreter (``.venv/bin/fsm-agent``
    in the clone, shown relative to the current directory when it is under it),
    else this interpreter with ``-m fsm_agent``.
    """
    here = Path(sys.executable).parent
    script = here / ("fsm-agent.exe" if os.name == "nt" else "fsm-agent")
    chosen = script if script.is_file() else Path(sys.executable)
    try:
        shown = str(chosen.absolute().relative_to(Path.cwd()))
    except ValueError:
        shown = str(chosen.absolute())
    shown = shlex.quote(shown)
    return shown if chosen == script else f"{shown} -m fsm_agent"


def main(args: argparse.Namespace) -> int:
    """Print every scenario, draw its path and checkpoint it into a store; exit 0 if all ended as meant.

    The pictures go into ``--out``, the runs into ``--store``; whichever is
    not given goes into one new temporary directory.  The last line printed
    is the ``ui`` command that shows the runs in a browser.
    """
    out: Path | None = args.out
    store_path: Path | None = args.store
    if out is None or store_path is None:
        scratch = Path(tempfile.mkdtemp(prefix="fsm_agent-demo-"))
        out = out or scratch
        store_path = store_path or scratch / "runs.db"
    try:
        store = SqliteStore(store_path)
    except StoreError as exc:
        print(f"error: demo: --store: {exc}", file=sys.stderr)
        return EXIT_SETUP
    with store:
        named = scenarios(store, ORIGINAL if args.original_text else ENGLISH)
    results = dict(named)
    # Imported here so importing the demo (tests reuse its scenarios) does not load the diagram code.
    from fsm_agent.render.dot import INSTALL_HINT, write_runs

    try:
        written = write_runs(named, out, TABLE)
    except OSError as exc:
        # The pictures are a by-product; the demo's verdict is about how the runs ended.
        print(f"run-path pictures not written: {exc}", file=sys.stderr)
    else:
        if all(path.suffix == ".svg" for path in written):
            print(f"run paths drawn in {out}/")
        else:
            print(f"run paths written as DOT text in {out}/; {INSTALL_HINT}", file=sys.stderr)
    print(f"see the runs in a browser: {command()} ui --store {shlex.quote(str(store_path))}")
    expected = {
        "A_max_steps": "max_steps",
        "B_repeated_action": "repeated_action",
        "C_max_tokens": "max_tokens",
        "D_tool_failures": "tool_failures",
        "E_done": "done",
    }
    wrong = [name for name, reason in expected.items() if results[name].reason != reason]
    if wrong:
        print(f"unexpected outcome in: {', '.join(wrong)}", file=sys.stderr)
        return 1  # no documented outcome fits: the package itself is broken
    return EXIT_DONE


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent demo``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "demo",
        help="run the scripted demonstration: four stops and a natural finish",
        description="Run five runs with scripted models (no API key): four stops (max_steps, repeated_action, "
        "max_tokens, tool_failures) and a natural finish, one line each, each run's path drawn and checkpointed, "
        "then the ui command that shows them in a browser.",
    )
    where = "draw each run's path into DIR (default: a new temporary directory, named on stdout)"
    parser.add_argument("--out", type=Path, metavar="DIR", help=where)
    keep = "checkpoint the runs into this SQLite file (default: runs.db in a new temporary directory)"
    parser.add_argument("--store", type=Path, metavar="FILE", help=keep)
    original = "print the lines, and have the scripted models speak, in the Chinese of the original text"
    parser.add_argument("--original-text", action="store_true", help=original)
    parser.set_defaults(handler=main)
