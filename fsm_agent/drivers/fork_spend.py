"""What a recorded sub-agent outcome brings a fork: all its child's run spent, and every tool call below it, once.

Why: a sub-agent call's recorded outcome brings its parent what the child's
run did beyond what the parent had counted already, a cut's share: the cut
of the call in flight, when the child's stored run was taken back
(``cut_spend.shared``), and the outcomes the child took from a store-less
cut's hand-down (``prepaid``), which that cut counted.  A fork's rebuild
reads no child in flight at its cuts: it counts each cut's share where the
source did (``cut_shares``, ``drivers.recorded_outside``), and once the fork
goes on, what cuts counted of calls still unanswered there is taken back
(``ledger.uncount_cuts``).  So each outcome a fork is given past its fork
point (carried, handed down to a new sub-agent run), and each rebuilt one of
a recording that kept no shares, brings what its source counted of the call:
the outcome, and what the call's cuts counted (its ``cut``, kept on its
exchange, a snapshot's too), exactly; a rebuilt one of a recording that kept
them brings the outcome alone.  A
call recorded without a ``cut`` (none counted any, or exported before it
was kept) brings its child's whole run as the source's recording of that
run says.  Its tokens
(each part), dollars and priced and unpriced model calls are the run's own
counters (``spent``, kept in its recording), which hold everything it and
the runs below it spent, what their cuts counted included.  Its tool calls
are counted from what it recorded: each call, and each of its sub-agent
calls' runs (nested in the recording) counted the same way; not from its
counters, which leave out the calls its sub-agents took from a cut's
hand-down (``prepaid``: their outcomes brought none of them) though the
cut that counted them was another run's.  Each figure is never less than
the outcome brought (a run that kept outcomes it had not recorded yet,
counted in what it brought).  Where the recording nests no run of the call
(a snapshot or a ``RunResult``, which keep none), or the run's recording
has no ``spent`` (exported before it was kept), the outcome brings what it
brought of those.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fsm_agent.core.ledger import plus
from fsm_agent.records import ChildOutcome, child_outcome, plain

SPENT_COUNTS = {
    "input_tokens": "input_tokens",
    "output_tokens": "output_tokens",
    "cache_read_tokens": "cache_read_tokens",
    "cache_write_tokens": "cache_write_tokens",
    "reasoning_tokens": "reasoning_tokens",
    "priced": "priced_calls",
    "unpriced": "unpriced_calls",
}
"""The whole counts of a recording's ``spent`` a fork takes, by the ``ChildOutcome`` field each is (cost aside)."""


def whole_result(
    call: Mapping[str, Any], run: Mapping[str, Any] | None, *, cuts_counted: bool = False
) -> dict[str, Any]:
    """The result of ``call`` (a recording's ``tool_calls`` entry), bringing all its sub-agent's runs spent.

    Where cuts of the call counted some of it (its ``cut``), the result
    brings that too: what its source counted of the call, exactly; unless
    the run given it counted them itself (``cuts_counted``: a rebuild meets
    each cut's share where the source counted it).  Else ``run``, the
    recording of the call's sub-agent run (a recording's ``children`` entry
    for the call), says what that run spent in all; None: the result as it
    is.
    """
    result: dict[str, Any] = call["result"]
    child = result.get("child")
    if call.get("cut") is not None:
        return result if cuts_counted else counted_result(call)
    if run is None or not isinstance(child, Mapping):
        return result
    brought = child_outcome(dict(child))
    assert brought is not None  # a mapping: made an outcome
    whole = _with_spent(brought, run.get("spent"))
    return {**result, "child": {**plain(whole), "tool_calls": _with_below(child, run)}}


def counted_result(call: Mapping[str, Any]) -> dict[str, Any]:
    """The result of ``call`` (a recording's ``tool_calls`` entry) bringing what its source counted of the call.

    That is the sub-agent spend the result brought and what the call's cuts
    counted before it (its ``cut``); the result as it is where either is
    missing.  A replay takes it too: its cuts read no child in flight, so
    they count none.
    """
    result: dict[str, Any] = call["result"]
    child, cut = result.get("child"), call.get("cut")
    if not isinstance(child, Mapping) or cut is None:
        return result
    brought = child_outcome(dict(child))
    assert brought is not None  # a mapping: made an outcome
    whole = attrs.evolve(plus(brought, ChildOutcome(**cut)), run_id=brought.run_id, stop=brought.stop)
    return {**result, "child": plain(whole)}


def _with_spent(brought: ChildOutcome, spent: Any) -> ChildOutcome:
    """``brought``, each count raised to what the run's ``spent`` says it spent in all; its cost unknown where
    either is (``Counts.usage``: a run with an unpriced call has no known cost).

    ``spent`` is a recording's (checked as it was read), or None for one
    exported before it was kept: then ``brought`` as it is.
    """
    if not isinstance(spent, Mapping):
        return brought
    counts = {field: max(getattr(brought, field), spent.get(name, 0)) for name, field in SPENT_COUNTS.items()}
    known = spent.get("cost", 0.0)
    unknown = brought.cost is None or known is None or counts["unpriced_calls"] > 0
    return attrs.evolve(brought, cost=None if unknown else max(brought.cost, known), **counts)


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
        if isinstance(spent, Mapping) and call.get("cut") is not None:
            total += _brought(spent) + _brought(call["cut"])
        elif isinstance(spent, Mapping):
            total += _brought(spent) if nested is None else _with_below(spent, nested)
    answered = {call["id"] for call in run["tool_calls"]}
    return total + sum(whole_tool_calls(nested) for call_id, nested in children.items() if call_id not in answered)
