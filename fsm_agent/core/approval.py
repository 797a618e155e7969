"""Who decides which tool calls run: an agent's ``approve=`` rule, and the rules a person's decision follows.

A call the rule holds back waits in the run (``Run.to_approve``) until a
person decides on it; the stepper applies decisions to a live run, a store
(``check_decision``) to a stored one, by the same rules: only a pending call
that has not run, and a decision holds once taken.
"""

from __future__ import annotations

from collections.abc import Callable, Collection
from typing import Any

from fsm_agent.errors import DecisionError
from fsm_agent.records import ToolCall


def approval_rule(approve: Collection[str] | Callable[[ToolCall], bool] | None) -> Callable[[ToolCall], bool] | None:
    """Normalise ``approve``: a set of tool names or a predicate on the call becomes a predicate."""
    if approve is None or callable(approve):
        return approve
    if isinstance(approve, str):
        approve = {approve}
    names = frozenset(approve)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        msg = f"approve must be tool names or a predicate on the tool call, got {bad!r}"
        raise TypeError(msg)

    def needs_approval(call: ToolCall) -> bool:
        return call.name in names

    return needs_approval


def describe_decision(decision: bool | str) -> str:
    """A stored decision in words: ``approved``, or ``rejected`` with the reason given."""
    if decision is True:
        return "approved"
    return f"rejected: {decision}" if isinstance(decision, str) and decision else "rejected"


def check_decision(run_id: str, data: dict[str, Any], call_id: str, decision: bool | str) -> None:
    """Check that ``decision`` on ``call_id`` may be taken on the stored run ``data``; ``DecisionError`` if not.

    A decision is taken only on a run that is paused, for a call of its
    current turn that has not run and has no decision yet: a decision holds,
    so a second person cannot overturn the first.
    """
    if not isinstance(decision, bool | str):
        msg = f"a decision is True, False or a reason text, got {decision!r}"
        raise TypeError(msg)
    pending = [call.get("id") for call in data.get("pending") or [] if isinstance(call, dict)]
    approvals: dict[str, Any] = data.get("approvals") or {}
    if not data.get("paused"):
        raise DecisionError(run_id, call_id, f"the run is not paused for approval (it is in {data.get('state')})")
    if call_id not in pending:
        known = ", ".join(map(str, pending)) or "none"
        raise DecisionError(run_id, call_id, f"it is not a pending call of the run (pending: {known})")
    if call_id in (data.get("ran") or {}):
        raise DecisionError(run_id, call_id, "it has already run")
    if call_id in approvals:
        raise DecisionError(run_id, call_id, f"it was already decided ({describe_decision(approvals[call_id])})")
