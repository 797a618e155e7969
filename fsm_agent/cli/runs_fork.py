"""``runs fork RUN --at N``: a new run that takes a stored run's history up to transition N and goes on from there.

The fork (``Agent.fork``) is stored beside its source, which it names
(``runs list`` and ``runs show`` say ``forked from RUN at N``), and is run
to its end or its pause, reported as ``runs resume`` reports.  A tool call
the source completed after N is not made again when the fork asks for the
same tool and arguments: its recorded result is reused, unless named with
``--rerun ID`` (or all of them, ``--rerun-all``).
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from fsm_agent import RunExistsError, RunLeasedError
from fsm_agent.cli import SetupError
from fsm_agent.cli.runs_agent import add_agent_arguments, agent_of, closing_model, finish
from fsm_agent.cli.terminal import printable


def add_parser(actions: Any) -> argparse.ArgumentParser:
    """Register the ``fork`` action of ``runs``; the caller adds ``--store``."""
    parser: argparse.ArgumentParser = actions.add_parser(
        "fork",
        help="run again from one transition of a stored run, as a new run",
        description="Make a new run whose history is a stored run's up to and including transition --at "
        "(the numbers runs show prints), store it beside its source and run it to its end or its pause. "
        "A tool call the source completed after there is not made again when the fork asks for the same tool "
        "and arguments: its recorded result is reused, unless named with --rerun.",
    )
    parser.add_argument("run_id", help="the stored run to fork")
    parser.add_argument("--at", type=int, required=True, metavar="N", help="the source's transition to fork after")
    add_agent_arguments(parser)
    again = parser.add_mutually_exclusive_group()
    again.add_argument(
        "--rerun",
        action="append",
        default=[],
        metavar="CALL_ID",
        help="make this tool call of the source again instead of reusing its result; repeatable",
    )
    again.add_argument("--rerun-all", action="store_true", help="make every tool call of the source again")
    parser.add_argument("--run-id", dest="fork_id", metavar="NEW", help="the fork's run id (default: a fresh one)")
    parser.add_argument("--quiet", action="store_true", help="no live status on stderr")
    return parser


def main(store: Any, args: argparse.Namespace) -> int:
    """Fork ``args.run_id`` at ``args.at`` in ``store`` and run the fork; a missing run is the caller's ``KeyError``."""
    if args.at < 0:
        msg = f"--at must be a transition number, 0 or more, got {args.at}"
        raise SetupError(msg)
    agent = agent_of(args)
    with closing_model(agent):
        rerun = "all" if args.rerun_all else set(args.rerun) or None
        try:
            run = agent.fork(args.run_id, args.at, store=store, run_id=args.fork_id, rerun=rerun)
        except RunExistsError as exc:
            taken = f"--run-id: run {exc.run_id!r} already exists in the store"
            msg = f"{taken}; give the fork another --run-id, or leave it out for a fresh one"
            raise SetupError(msg) from None
        except (ValueError, TypeError, IndexError, RunLeasedError) as exc:
            raise SetupError(str(exc)) from None
        print(printable(f"forked {args.run_id} at {args.at} as {run.run_id}"), file=sys.stderr)
        return finish(run, agent, args)
