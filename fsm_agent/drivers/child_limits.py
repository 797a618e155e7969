"""What a sub-agent call's run may use: the child's limits, cut to what its parent has left, or nothing at all.

The parent's remaining deadline, and what it has left of its token and
cost budgets and its tool calls shared among the sub-agent calls of its
turn (``child_spend.shares``), become the child's limits, each no larger
than the child agent's own; a call a used-up budget leaves nothing is
answered with a stop of that budget's reason, and no child run starts
(``drivers.child_runs``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.snapshot_fields import seconds
from fsm_agent.definition.limits import Limits
from fsm_agent.records import ChildOutcome
from fsm_agent.tools.registry import ToolResult

if TYPE_CHECKING:
    from fsm_agent.drivers.base import RunBase
    from fsm_agent.drivers.child import ChildTool
    from fsm_agent.drivers.child_spend import Shares


def limits_for(parent: RunBase, own: Limits, share: Shares, used: float = 0.0) -> Limits:
    """``own``, the child agent's limits, each cut to what the parent has left (time, tokens, calls, dollars).

    ``used``: the seconds a stored child's run has used already
    (``time_used``).  Its clock goes on from them when it is resumed, so its
    timeout is those plus the parent's time left: it stops at its parent's
    deadline, not that long before it.
    """
    timeout, budget, caps, dollars = own.timeout, own.token_budget, own.max_tool_calls, own.cost_budget
    remaining = parent._remaining()  # noqa: SLF001 - the parent's driver hands over its own run
    if remaining is not None:
        remaining += used
        timeout = remaining if timeout is None else min(timeout, remaining)
    if share.tokens is not None:
        budget = share.tokens if budget is None else min(budget, share.tokens)
    if share.calls is not None:
        calls = share.calls
        if isinstance(caps, dict):
            caps = {**caps, "*": min(caps.get("*", calls), calls)}
        else:
            caps = calls if caps is None else min(caps, calls)
    if share.dollars is not None:
        dollars = share.dollars if dollars is None else min(dollars, share.dollars)
    # A parent already out of time still asks: the child then stops at once, saying so (no tokens or dollars: not
    # asked; no tool calls left: it may still answer, and stops at its first call).
    return attrs.evolve(
        own,
        timeout=max(timeout, 1e-9) if timeout is not None else None,
        token_budget=budget,
        max_tool_calls=caps,
        cost_budget=dollars,
    )


def time_used(data: Mapping[str, Any] | None) -> float:
    """The seconds the stored child run ``data`` has used (0.0 for a child not stored yet)."""
    return 0.0 if data is None else seconds(data.get("counters") or {})


def budget_used_up(share: Shares) -> str | None:
    """The budget of the parent's that leaves this call nothing (``token_budget``, ``cost_budget``), or None."""
    if share.tokens == 0:
        return "token_budget"
    if share.dollars is not None and share.dollars <= 0:
        return "cost_budget"
    return None


def not_run(child: ChildTool, run_id: str, parent: RunBase, reason: str) -> ToolResult:
    """A sub-agent call the parent's ``reason`` budget leaves nothing for: a stop of that reason, never run."""
    run = parent.position
    if reason == "token_budget":
        evidence: dict[str, Any] = {"token_budget": run.limits.token_budget, "tokens": run.counts.tokens, "share": 0}
        spent = "token budget"
    else:
        evidence = {"cost_budget": run.limits.cost_budget, "cost": run.counts.cost, "share": 0}
        spent = "cost budget"
    facts = {"reason": reason, "evidence": evidence}
    message = f"sub-agent {child.name!r} not run: the parent's {spent} is used up (run {run_id!r})"
    content = json.dumps({"error": message, **facts}, ensure_ascii=False)
    stop = facts if child.on_child_stop == "raise" else None
    return ToolResult(content, message, child=ChildOutcome(run_id, 0, 0, stop))
