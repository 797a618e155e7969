"""What of its parent's limits a sub-agent call may spend: its share of the tokens, tool calls and dollars left.

A sub-agent call may spend its share of what the parent has left of its
token budget, cost budget and tool calls (``shares``): the children of one
turn draw on the parent's limits together.  A child taking its stored run
back after a cut of its call counts against its limits from its stored
counts on, so what the cut counted of those is added back to its shares
(``with_lent_back``): the parent's budget is not spent twice on it.  What a
child's run spent, and what a cut counted of it, is ``drivers.cut_spend``'s.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.batch import unrun
from fsm_agent.drivers.cut_spend import count_of
from fsm_agent.records import ToolCall

if TYPE_CHECKING:
    from fsm_agent.drivers.base import RunBase


def lent_back(parent: RunBase, call: ToolCall, run_id: str, data: Mapping[str, Any] | None) -> tuple[int, int, float]:
    """The tokens, tool calls and dollars of the stored child run ``data`` the parent counted at a cut of ``call``.

    Why: the child taking its stored run up gets its share of what the
    parent has left as its limits, and counts against them from its stored
    counts on; the part both count (``shared``, as far as ``data`` holds it)
    would be held against the parent's limits twice, so it is added back.
    What ``data`` holds is its counters and the outcomes it kept that came
    back but were not recorded yet (``ran``: the cut counted them, and the
    run counts them as it records them), as ``spent_by`` reads a live run.
    Dollars of a cut whose cost was unknown the parent never counted: none.
    """
    cut = parent.position.calls.cut_children.get(call.id)
    if cut is None or cut.run_id != run_id or data is None:
        return 0, 0, 0.0
    counters = data.get("counters")
    if not isinstance(counters, Mapping):
        return 0, 0, 0.0
    read, written, calls = (count_of(counters, name) for name in ("input_tokens", "output_tokens", "tool_calls"))
    dollars = _dollars(counters)
    for outcome in _come_back(data):
        read, written = read + count_of(outcome, "input_tokens"), written + count_of(outcome, "output_tokens")
        calls, dollars = calls + 1 + count_of(outcome, "tool_calls"), dollars + _dollars(outcome)
    tokens = min(cut.input_tokens, read) + min(cut.output_tokens, written)
    return tokens, min(cut.tool_calls, calls), 0.0 if cut.cost is None else min(cut.cost, round(dollars, 12))


def _dollars(spent: Mapping[str, Any]) -> float:
    """The dollars > 0 of ``spent`` (a snapshot's ``counters`` or a sub-agent's outcome); 0 where none is known."""
    cost = spent.get("cost")
    return float(cost) if isinstance(cost, int | float) and not isinstance(cost, bool) and cost > 0 else 0.0


def _come_back(data: Mapping[str, Any]) -> list[Mapping[str, Any]]:
    """Each outcome the stored run ``data`` kept unrecorded (``ran``), as its sub-agent's spend (a plain tool's: {})."""
    ran = data.get("ran")
    if not isinstance(ran, Mapping):
        return []
    kept = [outcome for outcome in ran.values() if isinstance(outcome, Mapping)]
    return [child if isinstance(child := outcome.get("child"), Mapping) else {} for outcome in kept]


@attrs.frozen
class Shares:
    """What of the parent's limits one sub-agent call may spend: tokens, tool calls, US dollars (None: no limit)."""

    tokens: int | None = None
    calls: int | None = None
    dollars: float | None = None


def shares(parent: RunBase) -> Shares:
    """The tokens, tool calls and dollars of the parent's limits this sub-agent call may spend.

    What the parent has not spent (its own calls, and the calls whose
    outcomes it holds but has not recorded yet, a child's with all its
    tokens, dollars and tool calls) is shared equally among the turn's
    sub-agent calls still to finish, this one included: children run in
    parallel draw on the parent's limits together, never each on all of
    them.  Each of those calls is one of the parent's tool calls itself, so
    it is set aside first, and so is each ordinary call planned to run
    beside them (the async driver's batch, ``core.batch``) that has not run
    yet: it runs whatever the children make.  A child stops after the model
    call that reaches its token or dollar share, so the parent's budgets are
    passed by at most one model call per child in flight; its tool-call
    share it never passes.  Dollars are shared to a millionth of a cent, as
    they are counted (``core.ledger.count_cost``).
    """
    run = parent.position
    limits = run.limits
    budget, cap, dollars_budget = limits.token_budget, limits.total_tool_calls, limits.cost_budget
    if budget is None and cap is None and dollars_budget is None:
        return Shares()
    children = parent._children  # noqa: SLF001 - the parent's driver hands over its own run
    held = [outcome.child for outcome in run.calls.ran.values() if outcome.child is not None]
    to_finish = sum(1 for call in run.calls.pending if call.name in children and call.id not in run.calls.ran)
    tokens = calls = dollars = None
    if budget is not None:
        spent = run.counts.tokens + sum(child.input_tokens + child.output_tokens for child in held)
        tokens = max(budget - spent, 0) // max(to_finish, 1)
    if cap is not None:
        made = run.counts.tool_calls + len(run.calls.ran) + sum(child.tool_calls for child in held)
        cleared = parent.stepper._cleared  # noqa: SLF001 - the batch was planned with the stepper's own rule
        beside = sum(1 for call in unrun(run, cleared) if call.name not in children)
        calls = max(cap - made - to_finish - beside, 0) // max(to_finish, 1)
    if dollars_budget is not None:
        paid = run.counts.cost + sum(child.cost or 0.0 for child in held)  # an unknown cost adds no known dollar
        dollars = round(max(dollars_budget - paid, 0.0) / max(to_finish, 1), 12)
    return Shares(tokens, calls, dollars)


def with_lent_back(
    parent: RunBase, call: ToolCall, run_id: str, data: Mapping[str, Any] | None, share: Shares
) -> Shares:
    """The child's shares, with what its stored run holds that a cut counted already.

    The child counts against its limits from its stored counts on; what a
    cut of this call counted of those is the parent's already, so it is no
    part of what the parent has left (``lent_back``).
    """
    lent_tokens, lent_calls, lent_dollars = lent_back(parent, call, run_id, data)
    return Shares(
        None if share.tokens is None else share.tokens + lent_tokens,
        None if share.calls is None else share.calls + lent_calls,
        None if share.dollars is None else round(share.dollars + lent_dollars, 12),
    )
