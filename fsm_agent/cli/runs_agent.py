"""The agent a stored run goes on with, and that run driven to its end: shared by ``runs resume`` and ``runs fork``.

``--model`` builds an agent with the built-in tools; ``--agent
MODULE:FUNCTION`` is the application's own (its model and tools).  The run
is driven with a live status on stderr and reported as ``run`` reports it:
the answer and exit 0, a stop with its evidence and exit 2, or, paused, the
calls it waits on and exit 2.  The new limits ``runs resume`` gives a run
are checked here too, each refused by its flag's name.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from fsm_agent import Agent
from fsm_agent.cli import SetupError, model_flags
from fsm_agent.cli import batch as batch_command
from fsm_agent.cli import run as run_command
from fsm_agent.cli.terminal import Status, drive, report_pause
from fsm_agent.definition.limits import Limits
from fsm_agent.drivers.agent_run import AgentRun


def add_agent_arguments(parser: argparse.ArgumentParser) -> None:
    """``--model`` (with the flags that reach it) or ``--agent``, one of them required; and ``--files``."""
    model_flags.add_model_arguments(
        parser,
        agent_help="your own agent (its model and tools): a function with no arguments returning an Agent; "
        "instead of --model, which goes on with the built-in tools",
    )
    parser.add_argument("--files", type=Path, metavar="DIR", help="let the model read text files under DIR")


def agent_of(args: argparse.Namespace) -> Agent:
    """The agent ``--agent`` builds, or the ``--model`` agent with the built-in tools (argparse allows one)."""
    if args.agent is not None:
        return batch_command.built(batch_command.imported(args.agent))
    args.system = run_command.DEFAULT_SYSTEM
    args.max_consecutive_failures = 3
    model = model_flags.build_model(args.model, args.base_url, args.api_key_env, args.max_retries)
    args.max_steps = 8
    try:
        return run_command.agent_for(args, model)
    except SetupError:
        model.close()
        raise


RESUME_LIMITS = (
    ("--max-steps", "max_steps"),
    *((flag, keyword) for flag, keyword, _, _ in run_command.LIMIT_FLAGS if keyword != "cycle_window"),
)
"""The new limits ``runs resume`` takes: each flag with its ``Agent.resume`` keyword."""


def new_limits(args: argparse.Namespace) -> dict[str, Any]:
    """The new limits given, by ``Agent.resume`` keyword (``None``: the stored one stays).

    Read before :func:`agent_of`, which sets ``args.max_steps`` for the ``--model`` agent.
    """
    return {keyword: getattr(args, keyword, None) for _, keyword in RESUME_LIMITS}


def check_limits(new: dict[str, Any]) -> None:
    """Refuse a new limit out of range before the run is resumed; a ``SetupError`` naming its flag.

    ``agent.resume`` checks a new limit together with the stored ones, and
    its error would read as if the stored run were at fault.  The ranges are
    the engine's own (``Limits``), checked one flag at a time.  Checked once
    the decisions are recorded, which are kept whether the resume goes on or
    not (see ``runs._decide``).
    """
    for flag, keyword in RESUME_LIMITS:
        if new[keyword] is None:
            continue
        try:
            Limits(**{keyword: new[keyword]})
        except (TypeError, ValueError) as exc:
            msg = f"{flag}: {exc}"
            raise SetupError(msg) from None


@contextlib.contextmanager
def closing_model(agent: Agent) -> Iterator[None]:
    """Close the agent's model when the command is done (every adapter has ``close``; a user's model may not)."""
    with contextlib.ExitStack() as closing:
        close = getattr(agent.model, "close", None)
        if callable(close):
            closing.callback(close)
        yield


def finish(run: AgentRun, agent: Agent, args: argparse.Namespace) -> int:
    """Drive ``run`` to its end and report it as ``run`` does; a run that is (or comes to be) paused says on what.

    A pause is exit 2 with the calls awaiting a decision, which
    ``runs resume --approve`` or ``--reject`` give.
    """
    held = run.paused
    if not held:
        drive(run, Status(sys.stderr, enabled=not args.quiet))
    if run.paused:
        return report_pause(run, sys.stderr, run_command.DECIDE, held=held)
    server = f"the model server at {model_flags.endpoint(agent.model, args.base_url)}"
    return run_command.report(run.result, sys.stdout, sys.stderr, server)
