"""The ``runs`` command: list, show, resume, prune, export and fork the runs checkpointed in a store.

``python -m fsm_agent runs list --store runs.db`` (or ``--store
postgresql://...``) lists them, filtered by ``--state``, ``--reason`` and
``--since``, a page at a time; ``show RUN_ID`` prints a run's trace and stop
reason (and draws its path with ``--diagram``); ``resume RUN_ID --model ...``
continues it, with new limits (``--max-steps``...) for a run stopped on one,
or ``--approve ID`` / ``--reject ID=WHY`` decisions for a run paused for approval;
``prune --older-than 7d`` forgets finished runs; ``export RUN_ID --out
FILE.json`` writes a run as a recording to replay in tests; ``fork RUN_ID
--at N`` runs it again from one of its transitions, as a new run.  A store
that cannot be opened (no such file, a text file, a server nobody answers)
is one line and exit 1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

from fsm_agent import TABLE, Agent, PostgresStore, RunLeasedError, RunResult, SnapshotError, SqliteStore
from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, SetupError, runs_agent, runs_export, runs_fork, runs_list
from fsm_agent.cli import run as run_command
from fsm_agent.cli.terminal import printable
from fsm_agent.core import snapshot as snapshots
from fsm_agent.core.approval import check_decision, describe_decision, reads_as_approval
from fsm_agent.definition.run import Run
from fsm_agent.persist import is_url
from fsm_agent.persist.summary import fork_origin

AnyStore = SqliteStore | PostgresStore


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent runs list|show|resume|prune|export|fork``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "runs",
        help="list, show, resume, prune, export or fork checkpointed runs",
        description="List, show, resume, prune, export and fork the runs checkpointed in a store: a SQLite file or a "
        "postgresql:// database (--store, after the action).",
    )
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = runs_list.add_parser(actions)
    prune = actions.add_parser(
        "prune",
        help="forget finished (Done or Failed) runs",
        description="Delete the finished (Done or Failed) runs last saved longer ago than --older-than.",
    )
    prune.add_argument(
        "--older-than",
        type=runs_list.seconds,
        required=True,
        metavar="AGE",
        help="last saved this long ago: 30d, 12h, 0 for all",
    )
    show = actions.add_parser(
        "show",
        help="a run's trace, state and stop reason",
        description="Print a run's state, stop reason and trace, its evidence, its pending calls (with where "
        "each decision stands) and its final text.",
    )
    show.add_argument("run_id")
    show.add_argument("--diagram", type=Path, metavar="FILE", help="draw the run's path (.svg, .png, .dot, .mmd)")
    resume = actions.add_parser(
        "resume",
        help="continue a stopped or paused run",
        description="Continue a stored run: with new limits after a stop on one, with --retry after a "
        "model_error, with --approve and --reject decisions when it is paused for approval.",
    )
    resume.add_argument("run_id")
    runs_agent.add_agent_arguments(resume)
    resume.add_argument("--max-steps", type=int, help="a new max_steps (lifts a max_steps stop)")
    resume.add_argument("--retry", action="store_true", help="call the model again after a model_error")
    resume.add_argument(
        "--approve",
        dest="decisions",
        action="append",
        default=[],
        type=_approval,
        metavar="ID[=yes|=no[:WHY]]",
        help="approve the paused call ID (ID or ID=yes), or reject it (ID=no, ID=no:WHY)",
    )
    resume.add_argument(
        "--reject",
        dest="decisions",
        action="append",
        type=_rejection,
        metavar="ID[=WHY]",
        help="reject the paused call ID, with the reason the model is told (as given, spaces and all)",
    )
    resume.add_argument("--quiet", action="store_true", help="no live status on stderr")
    for flag, keyword, kind, text in run_command.LIMIT_FLAGS:
        if keyword != "cycle_window":
            resume.add_argument(flag, dest=keyword, type=kind, default=None, help=f"a new limit: {text}")
    exporting = runs_export.add_parser(actions)
    forking = runs_fork.add_parser(actions)
    for sub in (listing, show, resume, prune, exporting, forking):
        sub.add_argument("--store", required=True, metavar="FILE|URL", help="a SQLite file or a postgresql:// URL")
    parser.set_defaults(handler=main)


DECISION_FORMS = "--approve ID, --approve ID=yes, --approve ID=no[:WHY] or --reject ID[=WHY]"
"""Every way to give a decision; a text that is none of them is refused, never read as a rejection's reason."""


def _approval(text: str) -> tuple[str, bool | str]:
    """``--approve ID`` or ``ID=yes``: approved; ``ID=no`` or ``ID=no:WHY``: rejected, with the reason if given.

    Anything else (``ID=maybe``, ``ID=y``, ``ID=true``) is a usage error:
    read as a reason, it would reject the call the person meant to approve.
    """
    call_id, sep, answer = text.partition("=")
    verdict, colon, why = answer.partition(":")
    if call_id and (not sep or answer.lower() == "yes"):
        return call_id, True
    if call_id and verdict.lower() == "no" and (colon or not why) and not reads_as_approval(why):
        return call_id, why or False
    raise _not_a_decision(text, why if verdict.lower() == "no" else answer)


def _rejection(text: str) -> tuple[str, bool | str]:
    """``--reject ID``: rejected; ``ID=WHY``: rejected with the reason the model is told, unless it reads as a yes."""
    call_id, _, why = text.partition("=")
    if not call_id or reads_as_approval(why):
        raise _not_a_decision(text, why)
    return call_id, why or False


def _not_a_decision(text: str, said: str) -> argparse.ArgumentTypeError:
    """The usage error for ``text``, naming a reason that reads as a yes (``reads_as_approval``, as Python's API)."""
    approving = f": {said!r} reads as an approval, not a rejection's reason" if reads_as_approval(said) else ""
    return argparse.ArgumentTypeError(f"not a decision: {text!r}{approving}; write {DECISION_FORMS}")


def _decisions(given: list[tuple[str, bool | str]]) -> dict[str, bool | str]:
    """The decisions by call id; one call given two different decisions is a usage error."""
    decisions: dict[str, bool | str] = {}
    for call_id, decision in given:
        if decisions.setdefault(call_id, decision) != decision:
            msg = f"two different decisions on {call_id!r}: give one --approve or --reject per call"
            raise SetupError(msg)
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


def _checked(run_id: str, snapshot: dict[str, Any]) -> dict[str, Any]:
    """The stored snapshot once it passed the checks a resume makes; ``SnapshotError`` naming the run and the field.

    A store refuses to save such a run, but one written by an older version
    or by hand may hold it (a negative counter, a malformed step).
    """
    try:
        data = snapshots.parse(snapshot)
        snapshots.load(Run(snapshots.limits_of(data), [], table=TABLE), data, TABLE.states)
    except SnapshotError as exc:
        msg = f"stored run {run_id!r} is corrupted: {exc}"
        raise SnapshotError(msg) from exc
    return data


def _show(store: AnyStore, args: argparse.Namespace) -> int:
    if args.diagram is not None:  # before anything is printed: the run is shown only if it can be drawn too
        from fsm_agent.cli.diagram import diagram_format  # only with --diagram: no drawing code otherwise

        diagram_format(args.diagram)
    snapshot = _checked(args.run_id, store.load(args.run_id))
    result = _as_result(snapshot)
    paused = bool(snapshot.get("paused"))
    lines = [f"run {args.run_id}: {runs_list.where(snapshot['state'], paused=paused)}, reason {result.reason}"]
    if (origin := fork_origin(snapshot.get("forked_from"))) is not None:
        lines.append(runs_list.origin(origin))
    for i, edge in enumerate(result.trace):
        label = edge.reason or edge.guard
        lines.append(f"  {i:3} {edge.source} -> {edge.dest}" + (f" [{label}]" if label else ""))
    if result.evidence:
        lines.append(f"evidence: {json.dumps(result.evidence, ensure_ascii=False, default=str)}")
    if result.pending:
        # Each call with its arguments and where its decision stands, so nobody approves a call blind.
        approvals, waiting = snapshot.get("approvals") or {}, set(snapshot.get("to_approve") or ())
        lines.append("pending:")
        for call in result.pending:
            arguments = call.canonical_arguments or repr(call.arguments)  # keys that do not sort: shown as Python
            if call.id in approvals:
                state = describe_decision(approvals[call.id])
            else:
                state = "awaiting a decision" if call.id in waiting else "not run yet"
            lines.append(f"  {call.name} ({call.id}) {arguments}: {state}")
    if result.final:
        lines.append(f"final: {result.final}")
    # Evidence, pending calls and the final text came from the model: escaped like every model text shown.
    print(printable("\n".join(lines)))
    if args.diagram is not None:
        from fsm_agent.cli.diagram import draw_run

        print(draw_run(TABLE, result, args.diagram), file=sys.stderr)
    return EXIT_DONE


def _check_tools(agent: Agent, snapshot: dict[str, Any], run_id: str) -> None:
    """Refuse, before any decision is used, a run whose pending calls name tools this agent does not have."""
    names = {str(call.get("name")) for call in snapshot.get("pending") or []}
    missing = sorted(name for name in names if agent.registry.get(name) is None)
    if missing:
        msg = (
            f"run {run_id!r} waits on calls to {', '.join(missing)}, which this agent's tools do not have: "
            "resume it with the agent that has them (--agent MODULE:FUNCTION)"
        )
        raise SetupError(msg)


def _decide(store: AnyStore, run_id: str, snapshot: dict[str, Any], given: dict[str, bool | str]) -> dict[str, Any]:
    """Record each ``--approve`` with the store's own checked write (as the viewer does); the run as stored after.

    Every decision is checked against the run as loaded before any is
    stored, so a command with one mistake (an unknown call, a call another
    person decided otherwise) stores none.  A decision the store already
    holds is not given again, so a retried command goes on.  Decisions are
    kept even if the resume then fails.
    """
    planned = {**snapshot, "approvals": dict(snapshot.get("approvals") or {})}
    new: dict[str, bool | str] = {}
    for call_id, decision in given.items():
        if check_decision(run_id, planned, call_id, decision):
            planned["approvals"][call_id] = new[call_id] = decision
    for call_id, decision in new.items():
        snapshot = store.decide(run_id, call_id, decision)
    return snapshot


def _resume(store: AnyStore, args: argparse.Namespace) -> int:
    snapshot = store.load(args.run_id)
    new = runs_agent.new_limits(args)  # before agent_of, which sets args.max_steps for the --model agent
    agent = runs_agent.agent_of(args)
    with runs_agent.closing_model(agent):
        _check_tools(agent, snapshot, args.run_id)
        try:
            snapshot = _decide(store, args.run_id, snapshot, _decisions(args.decisions))
            runs_agent.check_limits(new)
            run = agent.resume(snapshot, retry=args.retry, store=store, **new)
        except (ValueError, TypeError, RunLeasedError) as exc:  # DecisionError is a ValueError
            raise SetupError(str(exc)) from None
        return runs_agent.finish(run, agent, args)


def _prune(store: AnyStore, args: argparse.Namespace) -> int:
    gone = store.delete_finished(older_than=args.older_than)
    print(f"deleted {gone} finished run{'' if gone == 1 else 's'}")
    return EXIT_DONE


ACTIONS = {
    "list": runs_list.main,
    "show": _show,
    "resume": _resume,
    "prune": _prune,
    "export": runs_export.main,
    "fork": runs_fork.main,
}


def main(args: argparse.Namespace) -> int:
    """Run the chosen action; 0 done, 1 for a missing or unusable store, run or flag, 2 if a resumed run stopped."""
    if not is_url(args.store) and "://" not in args.store and not Path(args.store).exists():
        # Opening a missing path would create an empty store: a typo would look like a store without runs.
        print(f"error: no store at {args.store}", file=sys.stderr)
        return EXIT_SETUP
    try:
        with contextlib.closing(run_command.open_store(args.store)) as store:
            return ACTIONS[args.action](store, args)
    except (KeyError, SnapshotError, SetupError) as exc:
        # Run and call ids in the message came from the model or the store: escaped like every such text.
        # A KeyError's str() is its key quoted; its own text is args[0].  Other messages keep their quotes.
        text = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
        print(f"error: {printable(text)}", file=sys.stderr)
        return EXIT_SETUP
    except Exception as exc:
        if isinstance(exc, sqlite3.Error) or type(exc).__module__.startswith("psycopg"):
            # The database failed under us (locked, dropped connection): its location is what to look at.
            print(f"error: --store {args.store}: {type(exc).__name__}: {exc}".splitlines()[0], file=sys.stderr)
            return EXIT_SETUP
        raise
