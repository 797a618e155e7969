"""What a recorded sub-agent outcome brings a fork: every tool call of its child's run, and of the runs below, once.

Why: a sub-agent call's recorded outcome brings its parent what the child's
run did beyond what the parent had counted already, a cut's share: the cut
of the call in flight, when the child's stored run was taken back
(``cut_spend.shared``), and the outcomes the child took from a store-less
cut's hand-down (``prepaid``), which that cut counted.  A fork counts no cut:
it rebuilds its source calling nothing, and its new sub-agent runs take the
source's outcomes.  So each outcome a fork is given (rebuilt before the fork
point, carried past it, handed down to a new sub-agent run) brings its
child's tool calls as the source's recording of that run says: each call it
recorded, and each of its sub-agent calls' runs (nested in the recording)
counted the same way, never less than the outcome brought (a run that kept
outcomes it had not recorded yet, counted in what it brought).  Where the
recording nests no run of the call (a snapshot or a ``RunResult``, which
keep none), the outcome brings what it brought.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


def whole_result(result: dict[str, Any], run: Mapping[str, Any] | None) -> dict[str, Any]:
    """``result``, a recorded outcome in plain form, bringing every tool call of its sub-agent's recorded ``run``.

    ``run`` is the recording of the call's sub-agent run (a recording's
    ``children`` entry for the call), or None: then ``result`` as it is.
    """
    spent = result.get("child")
    if run is None or not isinstance(spent, Mapping):
        return result
    return {**result, "child": {**spent, "tool_calls": _with_below(spent, run)}}


def _with_below(spent: Mapping[str, Any], run: Mapping[str, Any]) -> int:
    """The tool calls an outcome whose child's run is ``run`` brings a fork: the run's whole, or what it brought."""
    return max(_brought(spent), whole_tool_calls(run))


def _brought(spent: Mapping[str, Any]) -> int:
    """The tool calls a recorded outcome's sub-agent spend ``spent`` brought its parent (0 where it says none)."""
    brought = spent.get("tool_calls")
    return brought if isinstance(brought, int) and not isinstance(brought, bool) and brought > 0 else 0


def whole_tool_calls(run: Mapping[str, Any]) -> int:
    """The tool calls of the recorded ``run`` and of its sub-agents' runs, each once: what a fork counts of it.

    Its recorded calls, each one of its tool calls; a sub-agent call's run
    nested in the recording counted the same way (what the outcome brought
    where none is nested); and a sub-agent call's run the recording nests
    without an outcome (cut in flight, its call never answered: ``run``'s
    cut counted it), the same way.
    """
    children = run.get("children") or {}
    total = 0
    for call in run["tool_calls"]:
        spent = call["result"].get("child")
        nested = children.get(call["id"])
        total += 1
        if isinstance(spent, Mapping):
            total += _brought(spent) if nested is None else _with_below(spent, nested)
    answered = {call["id"] for call in run["tool_calls"]}
    return total + sum(whole_tool_calls(nested) for call_id, nested in children.items() if call_id not in answered)
