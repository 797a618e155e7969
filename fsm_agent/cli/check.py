"""python -m fsm_agent check MODULE:FUNCTION: prove an agent always stops, and write a test per stop path.

Prints the bound, the reachable and unreachable stop reasons and the rows no
run takes; then drives each stop path through the engine whole, cut after
every transition and resumed, and with every call held for a decision.
Exits 0 when every run stops and no call ran twice, went missing or ran
before its decision; 1 with the counterexample or the fault otherwise (or on
a set-up error).  --write-tests DIR writes those runs as pytest tests.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, SetupError, import_named


def main(args: argparse.Namespace) -> int:
    """Check the agent the factory builds; print the proof; write the tests if asked."""
    from fsm_agent.cli.stop_tests import plans, write_tests
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.proof import check
    from fsm_agent.proof.driving import exercise

    try:
        found, tests_dir = _set_up(args)
        proof = check(found, calls_per_reply=args.calls_per_reply, every=args.every)
    except (SetupError, ValueError, TypeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SETUP
    print(proof.report())
    if args.draw is not None and not proof.ok:
        print(f"wrote {_draw(found, proof, Path(args.draw))}: the counterexample drawn on the machine")
    if not isinstance(found, Agent):
        return EXIT_DONE if proof.ok and proof.crash_safe else EXIT_SETUP
    try:
        exercised = exercise(found, plans(proof))
    except Exception as exc:  # noqa: BLE001 - a fault in driving the paths is told in one line, after the proof
        print(f"error: cannot drive the stop paths through the engine: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_SETUP
    print(
        f"driven through the engine: {len(exercised.taken)} stop path(s) as proven, cut and resumed at "
        f"{exercised.cuts} transition(s), every call held for a decision: "
        + ("each call ran once, none before its decision" if exercised.ok else "FAULTS")
    )
    for reason, why in (exercised.crash_faults | exercised.gate_faults).items():
        print(f"  fault: {reason}: {why}")
    if tests_dir is not None:
        try:
            written = write_tests(proof, found, args.agent, tests_dir, exercised)
        except OSError as exc:
            print(f"error: cannot write --write-tests {tests_dir}: {exc}", file=sys.stderr)
            return EXIT_SETUP
        print(f"wrote {written.path}: the {len(written.tested)} stop path(s) the engine takes, three tests each")
        for reason, why in written.left_out.items():
            print(f"  not written: {reason}: {why}")
    return EXIT_DONE if proof.ok and proof.crash_safe and exercised.ok else EXIT_SETUP


def _set_up(args: argparse.Namespace) -> tuple[Any, Path | None]:
    """The agent (or table) to check and the ``--write-tests`` directory, both refused before the proof if unusable.

    The proof and the runs driven may take a while: a wrong flag is told at once, not after them.
    """
    from fsm_agent.drivers.agent import Agent

    tests_dir = _tests_dir(args.write_tests)
    found = _target(args.agent)
    if tests_dir is not None and not isinstance(found, Agent):
        msg = "--write-tests needs an agent factory, not a table"
        raise SetupError(msg)
    return found, tests_dir


def _tests_dir(given: str | None) -> Path | None:
    """The ``--write-tests`` directory; a ``SetupError`` naming the flag if it, or a folder above it, is a file."""
    if given is None:
        return None
    directory = Path(given)
    for there in (directory, *directory.parents):
        if there.exists():
            if not there.is_dir():
                what = f"the file {given}" if there == directory else f"{given}: {there} is a file"
                msg = f"--write-tests wants a directory to write test_stop_paths.py in, not {what}"
                raise SetupError(msg)
            break
    return directory


def _draw(found: Any, proof: Any, path: Path) -> Path:
    """The counterexample drawn over the machine as a run's path (the loop's edges counted as often as taken)."""
    from fsm_agent.definition.table import Table
    from fsm_agent.records import RunResult
    from fsm_agent.render.dot import to_dot, write_picture

    table = found if isinstance(found, Table) else found.settings.table
    endless = RunResult((), (), "", "endless_loop", proof.counterexample)
    return write_picture(to_dot(table, endless), path)


def _target(spec: str) -> Any:
    """The agent (or table) ``MODULE:NAME`` names: a function returning an Agent or a Table, or a Table itself."""
    from fsm_agent.definition.table import Table
    from fsm_agent.drivers.agent import Agent

    found = import_named(spec, "check", lambda found: isinstance(found, Table) or callable(found))
    if isinstance(found, Table):
        return found
    try:
        built = found()
    except Exception as exc:  # noqa: BLE001 - the user's factory failing is a set-up error, in one line
        msg = f"cannot build the agent: {type(exc).__name__}: {exc}"
        raise SetupError(msg) from None
    if not isinstance(built, Agent | Table):
        msg = f"{spec} must return an Agent or a Table, got {type(built).__name__}"
        raise SetupError(msg)
    return built


def add_command(commands: Any) -> None:
    """Register ``check`` with the top-level parser."""
    parser = commands.add_parser(
        "check",
        help="prove an agent always stops, within what; write one test per stop path",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "agent",
        metavar="MODULE:FUNCTION",
        help="a function with no arguments returning an Agent (or a Table, or a Table itself)",
    )
    parser.add_argument(
        "--calls-per-reply",
        type=int,
        default=None,
        metavar="N",
        help="take a reply to ask for at most N tool calls (for a bound in transitions without max_tool_calls)",
    )
    parser.add_argument(
        "--every",
        choices=("transition", "call", "turn"),
        default="call",
        help="judge crash safety under this store setting (when the run is written)",
    )
    parser.add_argument(
        "--draw", metavar="FILE", default=None, help="when a run can go on forever, draw its loop on the machine"
    )
    parser.add_argument(
        "--write-tests", metavar="DIR", default=None, help="write test_stop_paths.py, one test per reachable stop path"
    )
    parser.set_defaults(handler=main)
