"""The ``run`` command: ask a real model a question with the built-in tools, and watch the machine decide.

``python -m fsm_agent run "question" --model openai:gpt-4o-mini`` (or
``--agent MODULE:FUNCTION``, your own agent) drives the run one transition
at a time (``AgentRun.advance``), so the current state and the counters
can be shown while the model or a tool is working.  The answer goes to
stdout (exit 0); a stop goes to stderr as its reason and evidence (exit 2).
Anything that prevents the run from starting or reaching its model (no API
key, no SDK, a bad flag value, an unreachable server, a store file that is
not SQLite) is one line on stderr naming what is at fault, and exit 1, never
a traceback.  Text that came from the model is printed with its control
characters escaped, so a reply cannot drive the terminal.
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import shlex
import sqlite3
import sys
from pathlib import Path
from typing import IO, Any

from fsm_agent import (
    Agent,
    PostgresStore,
    RunExistsError,
    RunLeasedError,
    RunResult,
    SqliteStore,
    persist,
)
from fsm_agent.cli import EXIT_DONE, EXIT_INTERRUPTED, EXIT_SETUP, EXIT_STOPPED, SetupError, described, out_file
from fsm_agent.cli.model_flags import PRICE_FLAG, UNREACHABLE, add_model_arguments, build_model, endpoint
from fsm_agent.cli.terminal import Status, TextPrinter, drive, one_field, printable, report_pause
from fsm_agent.core.pricing import UnpricedModelError
from fsm_agent.jsontext import dumps
from fsm_agent.models.provider import ProviderModel
from fsm_agent.persist import StoreError
from fsm_agent.persist.postgres import redact
from fsm_agent.tools.builtin import builtin_registry

DEFAULT_SYSTEM = (
    "You are a careful assistant. Use the tools for arithmetic, the current time and reading files "
    "instead of guessing, then answer briefly."
)

LIMIT_FLAGS: tuple[tuple[str, str, type, str], ...] = (
    ("--timeout", "timeout", float, "stop the run after this many seconds"),
    ("--token-budget", "token_budget", int, "stop once the run used this many tokens"),
    ("--max-tool-calls", "max_tool_calls", int, "stop after this many tool calls"),
    ("--cycle-window", "cycle_window", int, "recent tool calls the cycle guard looks back over (0: off)"),
    ("--cost-budget", "cost_budget", float, "stop once the model calls cost this many US dollars (see --price)"),
)
"""Limit flags offered only when ``Agent`` accepts the keyword, so the command follows the engine's limits."""

DECIDE = "--approve ID or --reject ID[=WHY]"
"""The flags of ``runs resume`` that decide on the calls a paused run waits on, as a pause names them."""


def _agent_keywords() -> set[str]:
    return set(inspect.signature(Agent.__init__).parameters)


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent run``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "run",
        help="run an agent against a real model",
        description=described(__doc__),
    )
    parser.add_argument("question", help="what to ask the model")
    add_model_arguments(
        parser,
        agent_help="your own agent (its model, tools, prompt and limits): a function with no arguments returning an "
        "Agent; instead of --model, which runs the built-in tools",
    )
    parser.add_argument("--system", default=DEFAULT_SYSTEM, help="the system prompt")
    parser.add_argument("--files", type=Path, metavar="DIR", help="let the model read text files under DIR")
    parser.add_argument("--max-steps", type=int, default=8, help="model turns before the run stops (default 8)")
    parser.add_argument(
        "--max-consecutive-failures", type=int, default=3, help="failed tool calls in a row before stopping (default 3)"
    )
    accepted = _agent_keywords()
    for flag, keyword, kind, text in LIMIT_FLAGS:
        if keyword in accepted:
            parser.add_argument(flag, dest=keyword, type=kind, default=None, help=text)
    parser.add_argument("--trace", type=Path, metavar="FILE", help="write the run's result and trace as JSON")
    parser.add_argument(
        "--diagram", type=Path, metavar="FILE", help="draw the run's path over the machine (.svg, .png, .dot, .mmd)"
    )
    parser.add_argument("--quiet", action="store_true", help="no live status on stderr")
    parser.add_argument(
        "--stream",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="print the model's text as it is written (default: when stdout is a terminal)",
    )
    parser.add_argument(
        "--store", metavar="FILE|URL", help="checkpoint the run in this SQLite file or postgresql:// database"
    )
    parser.add_argument(
        "--run-id", metavar="ID", help="the run's id in --store, not one already there (default: a fresh one, printed)"
    )
    parser.set_defaults(handler=main)


def trace_json(result: RunResult) -> str:
    """The whole result as indented ``RunResult`` JSON, which ``diagram --run`` and ``RunResult.from_json`` read."""
    return dumps(result.to_dict(), indent=2) + "\n"  # lone surrogates escaped: the file is valid UTF-8, read back exact


def open_store(target: str | Path) -> SqliteStore | PostgresStore:
    """The ``--store`` file or URL as a store; ``SetupError`` naming it if it cannot be one.

    Every command that takes ``--store`` opens it here, so each says the
    same one line for the same mistake.
    """
    try:
        return persist.open_store(target)
    except StoreError as exc:
        if "://" in str(target) and not persist.is_url(target):  # a URL of a kind no store has
            msg = f"--store {exc.reason}"
            raise SetupError(msg) from None
        kind = "database" if persist.is_url(target) else "SQLite database"
        # The driver may quote the URL it could not parse, password and all: shown as redacted as `where`.
        reason = exc.reason.replace(str(target), exc.where)
        msg = f"--store {exc.where} is not a usable {kind} ({reason})"
        raise SetupError(msg) from None
    except ImportError as exc:
        msg = f"--store: {exc}"
        raise SetupError(msg) from None
    except ValueError as exc:
        # A URL that does not parse (an unclosed IPv6 bracket) or a path with a NUL in it.  The text given
        # is not repeated: a password in a URL that does not parse cannot be found to be redacted.
        kind = "database URL" if persist.is_url(target) else "file path"
        msg = f"--store: not a usable {kind} ({exc})"
        raise SetupError(msg) from None


def agent_for(args: argparse.Namespace, model: ProviderModel) -> Agent:
    """The agent the flags describe: the built-in tools, the system prompt and the limits."""
    try:
        registry = builtin_registry(args.files)
    except OSError as exc:
        msg = f"--files: {exc}"
        raise SetupError(msg) from None
    limits = {
        keyword: getattr(args, keyword) for _, keyword, _, _ in LIMIT_FLAGS if getattr(args, keyword, None) is not None
    }
    try:
        return Agent(
            model,
            registry,
            args.system,
            max_steps=args.max_steps,
            max_consecutive_failures=args.max_consecutive_failures,
            prices=args.price,
            **limits,
        )
    except UnpricedModelError as exc:  # its own words say prices=, which a command-line user cannot pass
        raise SetupError(exc.explain(PRICE_FLAG)) from None
    except (ValueError, TypeError) as exc:
        raise SetupError(str(exc)) from None


_BUILT_IN_FLAGS = (
    ("--system", "system", DEFAULT_SYSTEM),
    ("--files", "files", None),
    ("--max-steps", "max_steps", 8),
    ("--max-consecutive-failures", "max_consecutive_failures", 3),
    *((flag, keyword, None) for flag, keyword, _, _ in LIMIT_FLAGS),
    ("--base-url", "base_url", None),
    ("--api-key-env", "api_key_env", None),
    ("--max-retries", "max_retries", 2),
    ("--price", "price", None),
)
"""The flags that set up the ``--model`` agent (flag, attribute, default), which an ``--agent`` sets up itself."""


def refuse_model_flags(args: argparse.Namespace) -> None:
    """A ``SetupError`` naming the flags given that only set up the ``--model`` agent, beside ``--agent``."""
    given = [flag for flag, keyword, default in _BUILT_IN_FLAGS if getattr(args, keyword, default) != default]
    if given:
        msg = f"--agent brings its own model, prompt, tools and limits: drop {', '.join(given)}"
        raise SetupError(msg)


def own_agent(args: argparse.Namespace) -> Agent:
    """The agent ``--agent MODULE:FUNCTION`` builds (as ``batch`` and ``runs resume`` do); ``SetupError`` if it cannot.

    A flag that only sets up the ``--model`` agent is refused rather than
    silently ignored: the user's agent brings its own model, tools and limits.
    """
    refuse_model_flags(args)
    from fsm_agent.cli import batch as batch_command  # which imports this module: loaded by --agent alone

    return batch_command.built(batch_command.imported(args.agent))


def _how_to_decide(args: argparse.Namespace, run_id: str) -> str:
    """The command that decides on the calls a run paused for approval waits on, or why there is none."""
    if args.store is None:
        return f"not kept without --store: run it again with --store FILE, then runs resume RUN_ID {DECIDE}"
    store = redact(args.store) if persist.is_url(args.store) else args.store
    agent = f"--agent {shlex.quote(args.agent)}" if args.agent is not None else f"--model {shlex.quote(args.model)}"
    command = f"python -m fsm_agent runs resume {shlex.quote(run_id)} --store {shlex.quote(store)} {agent}"
    return f"decide with: {command} {DECIDE}"


def report(
    result: RunResult, out: IO[str], err: IO[str], server: str = "the model server", *, shown: bool = False
) -> int:
    """Print the answer (exit 0), the server that could not be reached (exit 1) or the stop and its evidence (exit 2).

    A ``model_error`` whose cause is a failed connection is a set-up
    problem, not something the run did, so it is one line naming ``server``.
    ``shown``: the answer was already printed as it streamed in.
    """
    if result.ok:
        if not shown:
            print(printable(result.final), file=out)
        return EXIT_DONE
    if result.reason == "model_error" and result.evidence.get("type") in UNREACHABLE:
        cause = printable(f"{result.evidence['type']}: {result.evidence.get('error')}")
        print(f"error: cannot reach {server} ({cause})", file=err)
        return EXIT_SETUP
    evidence = json.dumps(result.evidence, ensure_ascii=False, default=str)
    print(printable(f"stopped: {result.reason} {evidence}"), file=err)
    if result.final:
        print(f"partial answer: {printable(result.final)}", file=err)
    return EXIT_STOPPED


def main(args: argparse.Namespace) -> int:
    """Run the question to the end; the exit code says how it ended (0 answer, 1 set-up, 2 stopped, 130 Ctrl-C)."""
    out, err = sys.stdout, sys.stderr
    try:
        if args.diagram is not None:  # before the run: a suffix no format has would be found out after it
            from fsm_agent.cli.diagram import diagram_format  # only with --diagram: no drawing code otherwise

            diagram_format(args.diagram)
        if args.trace is not None:  # before the run too: a trace that cannot be written would be lost after it
            out_file(args.trace, "--trace")
        if args.agent is not None:
            agent = own_agent(args)
            model: Any = agent.model
        else:
            model = build_model(args.model, args.base_url, args.api_key_env, args.max_retries)
        closing = contextlib.closing(model) if callable(getattr(model, "close", None)) else contextlib.nullcontext()
        with closing:
            if args.agent is None:
                agent = agent_for(args, model)
            store = None if args.store is None else open_store(args.store)
            try:
                try:
                    run = agent.start(args.question, store=store, run_id=args.run_id)
                except RunExistsError as exc:  # its advice (overwrite=True) is Python's: name what the command has
                    again = f"runs resume {shlex.quote(exc.run_id)} goes on with it if it has not ended, runs fork"
                    msg = f"--run-id: run {exc.run_id!r} already exists in the store; {again} runs it again from a step"
                    raise SetupError(f"{msg}; or give another --run-id, or leave it out for a fresh one") from None
                except (RunLeasedError, ValueError) as exc:  # --run-id names a leased stored run, or is empty
                    msg = f"--run-id: {exc}"
                    raise SetupError(msg) from None
                if store is not None:
                    print(f"run id {one_field(run.run_id)} (in {one_field(str(args.store))})", file=err)
                status = Status(err, enabled=not args.quiet)
                wanted = args.stream if args.stream is not None else out.isatty()
                printer = TextPrinter(out, status) if wanted else None
                result = drive(run, status, printer)
                if result is None:  # paused for approval: the result so far, for --trace and --diagram
                    result = run.finish()
            except KeyboardInterrupt:
                print("\ninterrupted", file=err)
                return EXIT_INTERRUPTED
            except sqlite3.Error as exc:  # the store broke while checkpointing: its file is at fault
                msg = f"--store {args.store}: {exc}"
                raise SetupError(msg) from None
            finally:
                if store is not None:
                    store.close()
    except SetupError as exc:
        print(f"error: {exc}", file=err)
        return EXIT_SETUP
    # The outcome is reported even when a file cannot be written (the run itself already happened), never as exit 0.
    unwritten = False
    if args.trace is not None:
        try:
            args.trace.write_text(trace_json(result), encoding="utf-8")
        except OSError as exc:
            print(f"error: cannot write --trace: {exc}", file=err)
            unwritten = True
    if args.diagram is not None:
        from fsm_agent.cli.diagram import draw_run

        try:
            print(draw_run(agent.table, result, args.diagram), file=err)
        except SetupError as exc:
            print(f"error: {exc}", file=err)
            unwritten = True
    if run.paused:
        return report_pause(run, err, _how_to_decide(args, run.run_id))
    shown = printer is not None and result.ok and printer.last == result.final
    code = report(result, out, err, f"the model server at {endpoint(model, args.base_url)}", shown=shown)
    return EXIT_SETUP if unwritten and code == EXIT_DONE else code
