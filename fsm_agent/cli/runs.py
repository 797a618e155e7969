"""The ``runs`` command: list, show and resume the runs checkpointed in a ``SqliteStore`` file.

``python -m fsm_agent runs list --store runs.db`` lists them; ``show RUN_ID``
prints a run's trace and stop reason (and draws its path with
``--diagram``); ``resume RUN_ID --model ...`` continues it, with new limits
(``--max-steps``...) for a run stopped on one, or ``--approve ID=yes|no|why``
decisions for a run paused for approval.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from fsm_agent import TABLE, RunResult, SnapshotError, SqliteStore
from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, EXIT_STOPPED, SetupError
from fsm_agent.cli import run as run_command


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent runs list|show|resume``."""
    parser: argparse.ArgumentParser = commands.add_parser("runs", help="list, show or resume checkpointed runs")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="every run in the store, latest first")
    show = actions.add_parser("show", help="a run's trace, state and stop reason")
    show.add_argument("run_id")
    show.add_argument("--diagram", type=Path, metavar="FILE", help="draw the run's path (.svg, .png, .dot, .mmd)")
    resume = actions.add_parser("resume", help="continue a stopped or paused run")
    resume.add_argument("run_id")
    run_command.add_model_arguments(resume)
    resume.add_argument("--files", type=Path, metavar="DIR", help="let the model read text files under DIR")
    resume.add_argument("--max-steps", type=int, help="a new max_steps (lifts a max_steps stop)")
    resume.add_argument("--retry", action="store_true", help="call the model again after a model_error")
    resume.add_argument(
        "--approve", action="append", default=[], metavar="ID=yes|no|WHY", help="a decision on a paused call"
    )
    resume.add_argument("--quiet", action="store_true", help="no live status on stderr")
    for flag, keyword, kind, text in run_command.LIMIT_FLAGS:
        if keyword != "cycle_window":
            resume.add_argument(flag, dest=keyword, type=kind, default=None, help=f"a new limit: {text}")
    for sub in (listing, show, resume):
        sub.add_argument("--store", type=Path, required=True, metavar="FILE", help="the SqliteStore file")
    parser.set_defaults(handler=main)


def _decisions(pairs: list[str]) -> dict[str, bool | str]:
    decisions: dict[str, bool | str] = {}
    for pair in pairs:
        call_id, sep, answer = pair.partition("=")
        if not sep or not call_id:
            msg = f"--approve wants ID=yes|no|reason, got {pair!r}"
            raise SetupError(msg)
        decisions[call_id] = {"yes": True, "no": False}.get(answer.lower(), answer)
    return decisions


def _as_result(snapshot: dict[str, Any]) -> RunResult:
    """The parts of a stored snapshot a person reads, as a result (reason ``running`` while it is not over)."""
    return RunResult.from_dict(
        {
            "format": "fsm_agent.RunResult",
            "version": 1,
            "messages": snapshot["messages"],
            "steps": snapshot["steps"],
            "final": snapshot["final"],
            "reason": snapshot["reason"] or ("paused" if snapshot.get("paused") else "running"),
            "trace": snapshot["trace"],
            "evidence": snapshot["evidence"],
            "usage": {
                "input_tokens": snapshot["counters"]["input_tokens"],
                "output_tokens": snapshot["counters"]["output_tokens"],
            },
            "pending": snapshot["pending"],
        }
    )


def _show(store: SqliteStore, args: argparse.Namespace) -> int:
    snapshot = store.load(args.run_id)
    result = _as_result(snapshot)
    lines = [f"run {args.run_id}: {snapshot['state']}, reason {result.reason}"]
    for i, edge in enumerate(result.trace):
        label = edge.reason or edge.guard
        lines.append(f"  {i:3} {edge.source} -> {edge.dest}" + (f" [{label}]" if label else ""))
    if result.evidence:
        lines.append(f"evidence: {json.dumps(result.evidence, ensure_ascii=False, default=str)}")
    if result.pending:
        lines.append("pending: " + ", ".join(f"{c.name} ({c.id})" for c in result.pending))
    if result.final:
        lines.append(f"final: {result.final}")
    # Evidence, pending calls and the final text came from the model: escaped like every model text shown.
    print(run_command.printable("\n".join(lines)))
    if args.diagram is not None:
        print(run_command.write_diagram(TABLE, result, args.diagram), file=sys.stderr)
    return EXIT_DONE


def _resume(store: SqliteStore, args: argparse.Namespace) -> int:
    args.system = run_command.DEFAULT_SYSTEM
    args.max_consecutive_failures = 3
    snapshot = store.load(args.run_id)
    model = run_command.build_model(args.model, args.base_url, args.api_key_env, args.max_retries)
    with contextlib.closing(model):
        new_steps, args.max_steps = args.max_steps, 8
        agent = run_command.agent_for(args, model)
        try:
            run = agent.resume(
                snapshot,
                approvals=_decisions(args.approve) or None,
                retry=args.retry,
                store=store,
                max_steps=new_steps,
                timeout=args.timeout,
                token_budget=args.token_budget,
                max_tool_calls=args.max_tool_calls,
            )
        except (ValueError, TypeError) as exc:
            raise SetupError(str(exc)) from None
        if run.paused:
            waiting = ", ".join(f"{c.name} ({c.id})" for c in run.awaiting())
            print(f"still paused, waiting for decisions on: {waiting} (--approve ID=yes|no|why)", file=sys.stderr)
            return EXIT_STOPPED
        result = run_command.drive(run, run_command.Status(sys.stderr, enabled=not args.quiet))
    server = f"the model server at {run_command.endpoint(model, args.base_url)}"
    return run_command.report(result, sys.stdout, sys.stderr, server)


def main(args: argparse.Namespace) -> int:
    """Run the chosen action; 0 done, 1 for a missing or unusable store, run or flag, 2 if a resumed run stopped."""
    if not args.store.exists():
        print(f"error: no store at {args.store}", file=sys.stderr)
        return EXIT_SETUP
    try:
        with run_command.open_store(args.store) as store:
            if args.action == "list":
                for run in store.list_runs():
                    flag = " (paused)" if run.paused else ""
                    print(run_command.printable(f"{run.run_id}\t{run.state}{flag}\t{run.reason or '-'}"))
                return EXIT_DONE
            if args.action == "show":
                return _show(store, args)
            return _resume(store, args)
    except sqlite3.Error as exc:  # an SQLite file whose tables are not a store's
        print(f"error: --store {args.store}: {exc}", file=sys.stderr)
        return EXIT_SETUP
    except (KeyError, SnapshotError, SetupError) as exc:
        print(f"error: {str(exc).strip(chr(39))}", file=sys.stderr)
        return EXIT_SETUP
