"""A stored run read back as a result: the result its live run returned, nothing dropped on the way.

A finished sub-agent's answer, a batch's run found over (a batch run again,
a run cancelled on Ray) and a paused turn's spend are each a snapshot a
store holds, read back under the agent that ran it.  Loading it into a run
and building the result as the drivers do keeps what a field-by-field copy
of the snapshot loses: the usage's cost, the typed output, ``prior``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core import snapshot
from fsm_agent.core.output_kinds import Invalid
from fsm_agent.core.result import make_result, pause_of
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import Done
from fsm_agent.definition.table import TABLE
from fsm_agent.records import RunResult

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent


def stored_result(agent: Agent | None, data: dict[str, Any], reason: str | None = None, **evidence: Any) -> RunResult:
    """The result the stored run ``data`` gave when it ran, read back under ``agent``'s table and output type.

    As ``Agent.run`` returned it: a run that ended in ``Done`` has its typed
    output (the value its run kept, read by ``agent``'s output type; its
    answer checked again only if none was kept) and no snapshot; any
    other keeps ``data`` as its snapshot, so it can be resumed; a paused one
    is reason ``paused``, pending the calls that await a decision.
    ``reason`` and ``evidence`` override the run's own: a batch reports a
    run it cut off as ``cancelled``, saying why.  Without an ``agent`` (one
    that cannot be made here), the run is read under the default table
    (every table has the same states) and a ``Done`` run has no typed output.
    """
    table = TABLE if agent is None else agent.table
    run = Run(snapshot.limits_of(data), [], table=table, policies={} if agent is None else agent.on_stop)
    snapshot.load(run, data, table.states)
    if data.get("paused"):
        own = "paused"
        facts, pending = pause_of(run)
    else:
        own, facts, pending = run.at.reason or "running", run.at.evidence, tuple(run.calls.pending)
    done = run.at.state is Done
    result = make_result(run, reason or own, {**facts, **evidence}, pending, None if done else data)
    if done and agent is not None and agent.output is not None:
        value = agent.output.restored(run.talk.output_plain)  # as the run returned it, its validators not run again
        if isinstance(value, Invalid):  # none kept (an older snapshot), or the type no longer reads it
            value = agent.output.check(run.at.final)
        result = attrs.evolve(result, output=None if isinstance(value, Invalid) else value)
    return result
