"""The command line keeps its promises: distinct exit codes, one-line set-up errors, escaped model text, safe writes.

Each test pins one item of the command line's hardening list, through
``main([...])`` or a real ``python -m fsm_agent`` process, against the
loopback provider server or a loopback port nothing listens on.
"""

from __future__ import annotations

import argparse
import copy
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body, openai_tool_call

from fsm_agent import TABLE, RunResult, SqliteStore
from fsm_agent.__main__ import main
from fsm_agent.cli.main import build_parser
from fsm_agent.cli.terminal import printable
from fsm_agent.render.dot import to_dot
from fsm_agent.render.mermaid import to_mermaid

KEY = "sk-test-hardening-9f8e7d6c5b4a"
ESCAPES = "\x1b]0;owned\x07\x1b[2J\x9b31m"
"""A retitle (OSC ... BEL), a clear screen and a C1 CSI: what a hostile reply would send to a terminal."""
SHOWN = "\\x1b]0;owned\\x07\\x1b[2J\\x9b31m"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every in-process run finds the key where the SDK looks for it."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _model(url: str) -> list[str]:
    return ["--model", "openai:gpt-4o-mini", "--base-url", f"{url}/v1", "--max-retries", "0"]


def _answer(content: str, finish_reason: str = "stop") -> dict[str, Any]:
    data = copy.deepcopy(body("openai", "final_answer"))
    data["choices"][0]["message"]["content"] = content
    data["choices"][0]["finish_reason"] = finish_reason
    return data


def _calculate(expression: str) -> dict[str, Any]:
    """The recorded OpenAI tool-call body, asking the built-in calculator."""
    return openai_tool_call("calculate", {"expression": expression})


def _main(argv: list[str]) -> int:
    """``main`` with an escaping Ctrl-C turned into a failure, so it cannot end the whole test session."""
    try:
        return main(argv)
    except KeyboardInterrupt:
        pytest.fail("KeyboardInterrupt escaped the command instead of becoming exit 130")


def _stopped_run(server: ProviderServer, store: Path) -> None:
    """Leave run ``r1`` in ``store`` stopped on max_steps after one calculator call."""
    server.queue(_calculate("2+3"))
    assert main(["run", "q", *_model(server.url), "--max-steps", "1", "--store", str(store), "--run-id", "r1"]) == 2


# --- exit codes: 0 done, 1 set-up or usage, 2 a stop, 130 interrupted ------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [
        [],
        ["nonsense"],
        ["run"],
        ["run", "q", "--model", "openai:m", "--max-steps", "many"],
        ["runs"],
        ["runs", "list"],
        ["runs", "resume", "r1", "--store", "x.db"],
        ["diagram", "--format", "gif"],
        ["demo", "--colour"],
    ],
    ids=lambda argv: " ".join(argv) or "no command",
)
def test_a_usage_error_exits_1_in_one_line_for_every_command(
    argv: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """argparse's own errors are set-up errors (1), not its default 2, which here means a stop."""
    assert _main(argv) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: python -m fsm_agent")
    assert line.endswith("(see --help)")


@pytest.mark.subprocess
def test_a_bad_flag_exits_1_as_a_real_process() -> None:
    """The exit status the shell sees for a bad flag value is 1, and stderr is one line naming the flag."""
    done = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "run", "q", "--model", "openai:m", "--max-steps", "many"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 1
    assert done.stderr.splitlines() == [
        "error: python -m fsm_agent run: argument --max-steps: invalid int value: 'many' (see --help)"
    ]


def test_help_still_exits_0(capsys: pytest.CaptureFixture[str]) -> None:
    """--help is not an error: argparse prints it and exits 0."""
    with pytest.raises(SystemExit) as info:
        main(["diagram", "--help"])
    assert info.value.code == 0
    assert "--update-readme" in capsys.readouterr().out


def _parsers() -> list[argparse.ArgumentParser]:
    """The program's parser and every command's and subcommand's, each once."""
    found, waiting = [], [build_parser()]
    while waiting:
        parser = waiting.pop()
        found.append(parser)
        for action in parser._actions:  # argparse keeps a parser's subcommands only in its actions
            if isinstance(action, argparse._SubParsersAction):
                waiting.extend(action.choices.values())
    return found


def test_no_help_shows_docstring_markup() -> None:
    """No --help, of the program, a command or a subcommand, shows double backticks from a docstring."""
    shown = {parser.prog: parser.format_help() for parser in _parsers()}
    assert len(shown) == 14  # the program, seven commands, six `runs` actions
    assert [prog for prog, text in shown.items() if "``" in text] == []


def test_every_command_and_subcommand_has_a_description() -> None:
    """Each --help says what the command does above its options, not only its usage line."""
    assert [parser.prog for parser in _parsers() if not (parser.description or "").strip()] == []


def test_the_top_level_help_lists_the_exit_codes(capsys: pytest.CaptureFixture[str]) -> None:
    """`python -m fsm_agent --help` lists 0, 1, 2 and 130 with what each means, as its description promises."""
    with pytest.raises(SystemExit):
        main(["--help"])
    text = capsys.readouterr().out
    listed = text[text.index("exit codes") :]
    for code, meaning in (("0", "done"), ("1", "set-up or usage error"), ("2", "stopped"), ("130", "interrupted")):
        assert re.search(rf"^ +{code} +.*{meaning}", listed, re.MULTILINE), (code, listed)


class _Interrupting:
    """A model the user interrupts while it is being called."""

    def complete(self, messages: object, tools: object) -> object:
        raise KeyboardInterrupt

    def close(self) -> None:
        """Nothing to release."""


def test_ctrl_c_in_run_exits_130(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """An interrupt during the model call ends `run` with 130 and one word on stderr."""
    monkeypatch.setattr("fsm_agent.cli.run.build_model", lambda *args: _Interrupting())
    assert _main(["run", "q", "--model", "openai:m", "--quiet"]) == 130
    assert capsys.readouterr().err == "\ninterrupted\n"


def test_ctrl_c_in_runs_resume_exits_130(
    provider_server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An interrupt while a resumed run calls the model ends `runs resume` with 130, not a traceback."""
    store = tmp_path / "runs.db"
    _stopped_run(provider_server, store)
    monkeypatch.setattr("fsm_agent.cli.model_flags.build_model", lambda *args: _Interrupting())
    resume = ["runs", "resume", "r1", "--model", "openai:m", "--store", str(store), "--max-steps", "4", "--quiet"]
    assert _main(resume) == 130


def _interrupt(*args: object, **kwargs: object) -> Any:
    raise KeyboardInterrupt


@pytest.mark.parametrize(
    ("target", "argv"),
    [
        ("fsm_agent.cli.diagram.write_all", ["diagram"]),
        ("fsm_agent.cli.demo.scenarios", ["demo"]),
    ],
    ids=["diagram", "demo"],
)
def test_ctrl_c_in_the_other_commands_exits_130(
    target: str, argv: list[str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Every command turns Ctrl-C into 130, as shells report a SIGINT."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(target, _interrupt)
    assert _main(argv) == 130


def test_ctrl_c_in_runs_list_exits_130(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`runs list` interrupted while reading the store exits 130."""
    store = tmp_path / "runs.db"
    SqliteStore(store).close()
    monkeypatch.setattr(SqliteStore, "list_runs", _interrupt)
    assert _main(["runs", "list", "--store", str(store)]) == 130


def test_done_is_0_and_a_stop_is_2_for_runs_resume(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A resumed run that stops again exits 2; one that answers exits 0 (the run command is pinned in test_cli)."""
    store = tmp_path / "runs.db"
    _stopped_run(provider_server, store)
    provider_server.queue(_calculate("5*4"))
    resume = ["runs", "resume", "r1", *_model(provider_server.url), "--store", str(store), "--quiet"]
    assert main([*resume, "--max-steps", "2"]) == 2
    provider_server.queue(body("openai", "final_answer"))
    assert main([*resume, "--max-steps", "3"]) == 0
    assert capsys.readouterr().out == "(2+3)*4 = 20\n"


# --- one line naming the thing at fault ---------------------------------------------------------------------------


def test_an_unreachable_server_is_exit_1_naming_its_url(unused_port: int, capsys: pytest.CaptureFixture[str]) -> None:
    """Nothing listening at --base-url: one line with that URL, exit 1 (a set-up error, not a stop)."""
    url = f"http://127.0.0.1:{unused_port}"
    assert main(["run", "q", *_model(url), "--quiet"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot reach the model server at {url}/v1 (APIConnectionError")


def test_the_unreachable_url_is_shown_without_its_password(
    unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Credentials written into --base-url do not reach stderr with the URL."""
    assert main(["run", "q", *_model(f"http://me:hunter2@127.0.0.1:{unused_port}"), "--quiet"]) == 1
    err = capsys.readouterr().err
    assert f"127.0.0.1:{unused_port}/v1" in err
    assert "hunter2" not in err


def test_resuming_against_an_unreachable_server_names_its_url(
    provider_server: ProviderServer, tmp_path: Path, unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs resume` reports a server it cannot reach like `run` does: one line, exit 1."""
    store = tmp_path / "runs.db"
    _stopped_run(provider_server, store)
    capsys.readouterr()
    url = f"http://127.0.0.1:{unused_port}"
    resume = ["runs", "resume", "r1", *_model(url), "--store", str(store), "--max-steps", "4", "--quiet"]
    assert main(resume) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: cannot reach the model server at {url}/v1 ")


@pytest.fixture
def not_sqlite(tmp_path: Path) -> Path:
    """A text file given as --store."""
    path = tmp_path / "notes.txt"
    path.write_text("these are my notes, not a database\n" * 100, encoding="utf-8")
    return path


def test_run_with_a_store_that_is_not_sqlite_is_one_line_naming_it(
    provider_server: ProviderServer, not_sqlite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A --store file SQLite cannot open is one line naming the file, exit 1, before any model call."""
    assert main(["run", "q", *_model(provider_server.url), "--store", str(not_sqlite)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: --store {not_sqlite} is not a usable SQLite database (file is not a database)"
    assert provider_server.requests == []
    assert not_sqlite.read_text(encoding="utf-8").startswith("these are my notes")


@pytest.mark.parametrize("action", [["list"], ["show", "r1"]])
def test_runs_with_a_store_that_is_not_sqlite_is_one_line_naming_it(
    action: list[str], not_sqlite: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`runs list` and `runs show` on a non-SQLite file: one line naming it, exit 1, no traceback."""
    assert main(["runs", *action, "--store", str(not_sqlite)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: --store {not_sqlite} is not a usable SQLite database")


BAD_URL = "postgresql://me:hunter2@[::1:5/db"
"""A store URL that does not parse (an unclosed IPv6 bracket), with a password the error must not show."""


@pytest.mark.parametrize(
    "command",
    [["runs", "list"], ["runs", "show", "r1"], ["ui"], ["run", "q", "MODEL"], ["batch", "INPUTS", "MODEL", "--local"]],
    ids=lambda command: " ".join(command[:2]),
)
def test_a_store_url_that_does_not_parse_is_one_line_naming_store(
    command: list[str], tmp_path: Path, unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """Every command taking --store: exit 1, one line naming --store (not --table), the password not shown."""
    inputs = tmp_path / "in.jsonl"
    inputs.write_text('"q"\n', encoding="utf-8")
    model = _model(f"http://127.0.0.1:{unused_port}")
    argv = [part for arg in command for part in ({"MODEL": model, "INPUTS": [str(inputs)]}.get(arg) or [arg])]
    assert _main([*argv, "--store", BAD_URL]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: ")
    assert "--store" in line
    assert "--table" not in line
    assert "hunter2" not in line


# --- model text on a terminal -------------------------------------------------------------------------------------


def test_printable_escapes_controls_but_keeps_newlines_tabs_and_unicode() -> None:
    """ESC, BEL, CR, DEL and C1 controls become visible escapes; layout characters and other scripts stay."""
    assert printable(f"a{ESCAPES}\r\x7f") == f"a{SHOWN}\\x0d\\x7f"
    assert printable("line 1\n\tline 2: 已完成 ✓") == "line 1\n\tline 2: 已完成 ✓"
    # A right-to-left override (or any bidi control) would reorder the rest of the line: it is shown, not obeyed.
    assert printable("run-\u202eevil\u2066x\u2069") == "run-\\u202eevil\\u2066x\\u2069"


def test_the_final_answer_is_printed_with_escapes_visible(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A reply carrying escape sequences reaches stdout escaped; its newline and tab are kept."""
    provider_server.queue(_answer(f"20{ESCAPES}\n\tdone"))
    assert main(["run", "q", *_model(provider_server.url), "--quiet"]) == 0
    assert capsys.readouterr().out == f"20{SHOWN}\n\tdone\n"


def test_a_partial_answer_and_its_evidence_are_printed_escaped(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """On a stop, the stop line and the partial text on stderr carry no raw control character."""
    provider_server.queue(_answer(f"half{ESCAPES}", finish_reason="length"))
    assert main(["run", "q", *_model(provider_server.url), "--quiet"]) == 2
    err = capsys.readouterr().err
    assert f"partial answer: half{SHOWN}\n" in err
    assert not any(ch in err for ch in "\x1b\x07\x9b")


def test_the_status_line_shows_tool_arguments_escaped(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A tool call whose arguments hold escapes is shown in the per-edge status line with them visible."""
    provider_server.queue(_calculate(f"1+1{ESCAPES}"), body("openai", "final_answer"))
    assert main(["run", "q", *_model(provider_server.url)]) == 0
    err = capsys.readouterr().err
    assert "ExecuteTool -> AwaitModel  calculate(" in err
    assert "\\x9b31m" in err  # JSON escapes the C0 controls of the arguments; the C1 one is left to printable
    assert not any(ch in err for ch in "\x1b\x07\x9b")


def test_runs_show_prints_the_stored_answer_escaped(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The final text read back from a store is escaped like a live one."""
    store = tmp_path / "runs.db"
    provider_server.queue(_answer(f"20{ESCAPES}"))
    assert main(["run", "q", *_model(provider_server.url), "--quiet", "--store", str(store), "--run-id", "r9"]) == 0
    capsys.readouterr()
    assert main(["runs", "show", "r9", "--store", str(store)]) == 0
    out = capsys.readouterr().out
    assert f"final: 20{SHOWN}\n" in out
    assert "\x1b" not in out


# --- the documented pairing: run --trace, then diagram --run ------------------------------------------------------


def test_diagram_draws_what_run_trace_wrote(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`run --trace run.json` then `diagram --run run.json` draws that run's path, in DOT and in Mermaid."""
    trace = tmp_path / "run.json"
    provider_server.queue(_calculate("2+3"), body("openai", "final_answer"))
    assert main(["run", "q", *_model(provider_server.url), "--quiet", "--trace", str(trace)]) == 0
    result = RunResult.from_json(trace.read_text(encoding="utf-8"))
    for suffix, render in ((".dot", to_dot), (".mmd", to_mermaid)):
        out = tmp_path / f"path{suffix}"
        assert main(["diagram", "--run", str(trace), "--out", str(out)]) == 0, capsys.readouterr().err
        assert out.read_text(encoding="utf-8") == render(TABLE, result)
    assert "replied ×2" in (tmp_path / "path.mmd").read_text(encoding="utf-8")


# --- writing only where told --------------------------------------------------------------------------------------


README_WITH_MARKERS = "# my project\n\n<!-- machine:start -->\nmine\n<!-- machine:end -->\n"


@pytest.mark.parametrize("readme", ["# my project\n", README_WITH_MARKERS], ids=["plain", "with markers"])
def test_diagram_without_out_writes_only_its_default_files(
    readme: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """In a user's project, `diagram` writes diagrams/agent_loop.* and leaves the project's README alone."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "README.md").write_text(readme, encoding="utf-8")
    assert main(["diagram"]) == 0
    assert (tmp_path / "README.md").read_text(encoding="utf-8") == readme
    written = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*") if p.is_file())
    drawings = ("agent_loop.dot", "agent_loop.mmd", "agent_loop.svg")
    compact = ("agent_loop_compact.dot", "agent_loop_compact.svg")
    expected = {"README.md", *(f"diagrams/{name}" for name in (*drawings, *compact))}
    assert set(written) <= expected
    assert {"diagrams/agent_loop.dot", "diagrams/agent_loop.mmd"} <= set(written)
    assert "README" not in capsys.readouterr().out


def test_update_readme_rewrites_only_the_named_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--update-readme FILE fills that file's blocks from the table, which is what `make diagram` asks for."""
    readme = tmp_path / "DOC.md"
    blocks = "".join(f"<!-- {name}:start -->\n<!-- {name}:end -->\n" for name in ("machine", "stops", "reasons"))
    readme.write_text(f"# doc\n{blocks}", encoding="utf-8")
    out = tmp_path / "m.mmd"
    assert main(["diagram", "--out", str(out), "--update-readme", str(readme)]) == 0
    text = readme.read_text(encoding="utf-8")
    assert to_mermaid(TABLE, compact=True).rstrip() in text
    assert "`ExecuteTool->Failed[max_steps]` on `tool_done`" in text
    assert f"updated the rendered blocks of {readme}" in capsys.readouterr().out


def test_update_readme_without_markers_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A README lacking the marker comments is left as it was, with one line naming it, exit 1."""
    readme = tmp_path / "README.md"
    readme.write_text("# nothing to fill\n", encoding="utf-8")
    assert main(["diagram", "--out", str(tmp_path / "m.dot"), "--update-readme", str(readme)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: diagram: {readme}: ")
    assert readme.read_text(encoding="utf-8") == "# nothing to fill\n"


def test_update_readme_takes_several_files_each_with_any_blocks(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--update-readme is repeatable, and a file may carry only some of the blocks (the README keeps the drawing)."""
    drawing, reference = tmp_path / "README.md", tmp_path / "cli.md"
    drawing.write_text("# r\n<!-- machine:start -->\n<!-- machine:end -->\n", encoding="utf-8")
    reference.write_text("# c\n<!-- cli:start -->\n<!-- cli:end -->\n", encoding="utf-8")
    args = [
        "diagram",
        "--out",
        str(tmp_path / "m.dot"),
        "--update-readme",
        str(drawing),
        "--update-readme",
        str(reference),
    ]
    assert main(args) == 0
    assert to_mermaid(TABLE, compact=True).rstrip() in drawing.read_text(encoding="utf-8")
    assert "Failed(max_steps)" not in drawing.read_text(encoding="utf-8")
    assert "### `runs resume`" in reference.read_text(encoding="utf-8")
    out = capsys.readouterr().out
    assert f"updated the rendered blocks of {drawing}" in out
    assert f"updated the rendered blocks of {reference}" in out
    assert main(args) == 0
    assert "updated the rendered blocks" not in capsys.readouterr().out  # nothing changed the second time


def test_update_docs_fills_every_marked_page_under_a_directory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """--update-docs DIR fills each page with blocks and leaves the pages without any alone."""
    docs = tmp_path / "docs"
    (docs / "concepts").mkdir(parents=True)
    (docs / "index.md").write_text("# home, nothing rendered\n", encoding="utf-8")
    stops = docs / "concepts" / "stops.md"
    stops.write_text("# stops\n<!-- reasons:start -->\n<!-- reasons:end -->\n", encoding="utf-8")
    assert main(["diagram", "--out", str(tmp_path / "m.dot"), "--update-docs", str(docs)]) == 0
    assert "| `max_steps` |" in stops.read_text(encoding="utf-8")
    assert (docs / "index.md").read_text(encoding="utf-8") == "# home, nothing rendered\n"
    assert capsys.readouterr().out.splitlines()[-1] == f"updated the rendered blocks of {stops}"


@pytest.mark.parametrize(
    ("pages", "named"),
    [
        ({"a.md": "# nothing\n"}, "docs: no page under it has a rendered block"),
        (
            {"a.md": "<!-- stops:start -->\n<!-- stops:end -->\n", "b.md": "<!-- reasons:start -->\n"},
            "b.md: the reasons",
        ),
    ],
    ids=["no page with blocks", "a half-marked page"],
)
def test_update_docs_at_fault_writes_nothing_and_names_it(
    pages: dict[str, str], named: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A directory without blocks, or one page with half a block, is one line naming it; no page is written."""
    docs = tmp_path / "docs"
    docs.mkdir()
    for name, text in pages.items():
        (docs / name).write_text(text, encoding="utf-8")
    assert main(["diagram", "--out", str(tmp_path / "m.dot"), "--update-docs", str(docs)]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: diagram: ")
    assert named in line
    assert {name: (docs / name).read_text(encoding="utf-8") for name in pages} == pages


@pytest.mark.subprocess
def test_demo_writes_into_a_temporary_directory_it_names(tmp_path: Path) -> None:
    """As a real process, `demo` leaves the directory it runs in untouched and names where the pictures went."""
    env = {**os.environ, "TMPDIR": str(tmp_path / "tmp")}
    (tmp_path / "tmp").mkdir()
    (tmp_path / "work").mkdir()
    done = subprocess.run(
        [sys.executable, "-m", "fsm_agent", "demo"],
        cwd=tmp_path / "work",
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert list((tmp_path / "work").iterdir()) == []
    (made,) = (tmp_path / "tmp").iterdir()
    assert made.name.startswith("fsm_agent-demo-")
    assert f"run paths drawn in {made}/" in done.stdout or f"as DOT text in {made}/" in done.stderr
    assert sorted(p.suffix for p in made.iterdir()) == [".db", *[".svg" if shutil.which("dot") else ".dot"] * 5]
    # Started from outside the clone, the command is named by its absolute path: it runs as printed.
    command = Path(sys.executable).parent / "fsm-agent"
    assert done.stdout.endswith(f"see the runs in a browser: {command} ui --store {made / 'runs.db'}\n")


def test_demo_prints_the_readme_lines_unchanged(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The A) to E) lines are the README's, word for word, wherever the pictures go."""
    assert main(["demo", "--out", str(tmp_path)]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:2] in ("A)", "B)", "C)", "D)", "E)")]
    readme = (Path(__file__).resolve().parents[2] / "README.md").read_text(encoding="utf-8")
    assert lines == [line for line in readme.splitlines() if line[:2] in ("A)", "B)", "C)", "D)", "E)")]
    assert len(lines) == 5
