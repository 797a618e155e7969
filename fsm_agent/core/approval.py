"""Who decides which tool calls run: an agent's ``approve=`` rule, and the rules a person's decision follows.

A call the rule holds back waits in the run (``Run.to_approve``) until a
person decides on it; the stepper applies decisions to a live run, a store
(``check_decision``) to a stored one, by the same rules: only a pending call
that has not run and that needs approval, and a decision holds once taken.
``False`` and an empty reason are one decision, a rejection with no reason
given: both are kept as ``False`` (``settled``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from typing import Any

import attrs

from fsm_agent.core import ledger
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL, State
from fsm_agent.definition.stops import CONDITION_ERROR
from fsm_agent.definition.table import Row, Table
from fsm_agent.definition.triggers import REPLIED
from fsm_agent.errors import DecisionError
from fsm_agent.records import ToolCall
from fsm_agent.tools import ToolResult


@attrs.frozen
class HeldBack:
    """An ``approve=`` of tool names: a call of one of them waits for a person's decision.

    The names stay readable (not a closure) so the agent can check, as its
    tools are found, that each names one of them: a misspelt name would
    hold nothing back.
    """

    names: frozenset[str]

    def __call__(self, call: ToolCall) -> bool:
        return call.name in self.names


def approval_rule(approve: Collection[str] | Callable[[ToolCall], bool] | None) -> Callable[[ToolCall], bool] | None:
    """Normalise ``approve``: a set of tool names (``HeldBack``) or a predicate on the call, as a predicate."""
    if inspect.iscoroutinefunction(approve):
        # Its coroutine, never awaited, is truthy: every call would wait for a person.
        msg = "approve is an async def, which is called, not awaited: make it a plain def"
        raise TypeError(msg)
    if approve is None or callable(approve):
        return approve
    if isinstance(approve, str):
        approve = {approve}
    if not isinstance(approve, Iterable):
        msg = f"approve must be tool names or a predicate on the tool call, got {type(approve).__name__}"
        raise TypeError(msg)
    names = frozenset(approve)
    bad = [name for name in names if not isinstance(name, str)]
    if bad:
        msg = f"approve must be tool names or a predicate on the tool call, got {bad!r}"
        raise TypeError(msg)
    return HeldBack(names)


RULE_RAISED = Row(State.AwaitModel, REPLIED, State.Failed, CONDITION_ERROR.guard, CONDITION_ERROR.reason)
"""The edge an ``approve=`` predicate that raised takes once the reply that asked is kept: ``stop_condition_error``."""


def approval_checked(table: Table, rule: Callable[[ToolCall], bool] | None) -> Table:
    """``table`` with ``RULE_RAISED`` for an agent whose ``approve=`` is a predicate; else ``table`` itself.

    Why: the predicate is the user's code, asked as each reply arrives, and
    it can raise like a ``StopCondition``'s check; it stops the run the same
    way, the reply and its calls kept, rather than escaping the driver with
    the run half-written.  A set of tool names cannot raise: its agents'
    tables (and diagrams) stay as they were.
    """
    if rule is None or isinstance(rule, HeldBack) or RULE_RAISED in table.rows:
        return table
    reasons = () if CONDITION_ERROR.reason in table.reasons else (CONDITION_ERROR.reason,)
    placed = table.with_rows([RULE_RAISED], reasons)
    return placed if CONDITION_ERROR in table.stops else attrs.evolve(placed, stops=(*table.stops, CONDITION_ERROR))


def rule_name(rule: Callable[[ToolCall], bool]) -> str:
    """How a ``stop_condition_error`` names an ``approve=`` predicate: ``approve=`` and its function's name."""
    return f"approve={getattr(rule, '__qualname__', None) or type(rule).__name__}"


def settled(decision: bool | str) -> bool | str:
    """``decision`` as it is kept: an empty reason text is ``False``, the one spelling of "rejected, no reason".

    Why: ``False`` and ``""`` both mean that, so they must be one decision
    wherever it is compared (given again, it is taken as given) or shown.
    A reason of white space only is a text the person wrote: it is kept.
    """
    return False if isinstance(decision, str) and not decision else decision


def same_decision(kept: bool | str, given: bool | str) -> bool:
    """Whether ``given`` is the decision ``kept`` (True, False and ``""``, or the same reason text)."""
    kept, given = settled(kept), settled(given)
    return type(kept) is type(given) and kept == given


NO_REASON = "no reason given"
ENDED = frozenset(str(state) for state in TERMINAL)
"""The states of a run that ended (``Done``, ``Failed``), as a snapshot names them: no decision is taken there."""


def rejection_text(tool: str, decision: bool | str) -> str:
    """The error a rejected call of ``tool`` is answered with: the model reads it, and so do forks and late deciders."""
    why = decision if isinstance(decision, str) and decision else NO_REASON
    return f"a person rejected this call to {tool!r}: {why}"


def rejection_in(tool: str, error: str) -> bool | str | None:
    """The decision a call of ``tool`` answered with ``error`` records: its reason, False (none given), or None.

    Why: a finished run no longer holds its decisions, only its messages;
    a fork and a late decider read back from them what a person decided.
    """
    start = rejection_text(tool, "")[: -len(NO_REASON)]
    if not error.startswith(start):
        return None
    why = error[len(start) :]
    return False if why == NO_REASON else why


def describe_decision(decision: bool | str) -> str:
    """A stored decision in words: ``approved``, or ``rejected`` with the reason given."""
    if decision is True:
        return "approved"
    return f"rejected: {decision}" if isinstance(decision, str) and decision else "rejected"


APPROVING = frozenset({"yes", "y", "true", "ok", "okay", "approve", "approved", "allow", "1"})
"""Texts that read as an approval: as a decision each would be kept as a rejection's reason, so each is refused."""


def reads_as_approval(decision: object) -> bool:
    """Whether ``decision`` is a text that reads as an approval (``"yes"``, ``"true"``), case and spaces aside.

    Why: a text is a rejection's reason, so ``decide(run, call, "yes")``
    would reject the call the person meant to approve; the command line's
    ``--approve`` and ``--reject`` and the Python API refuse it alike.
    """
    return isinstance(decision, str) and decision.strip().lower() in APPROVING


def _approving_text(decision: str) -> str:
    return f"{decision!r} reads as an approval, but a text decision is a rejection's reason: pass True to approve"


def check_decision_value(decision: object) -> None:
    """A ``TypeError`` unless ``decision`` is True, False or a reason text: checked before the run is looked at.

    Why first: a wrong value is the caller's mistake whatever the run's
    state, and blaming a lease or a missing run would send them to wait.
    A text that reads as an approval is a ``ValueError`` (``reads_as_approval``).
    """
    if not isinstance(decision, bool | str):
        msg = f"a decision is True, False or a reason text, got {decision!r}"
        raise TypeError(msg)
    if reads_as_approval(decision):
        raise ValueError(_approving_text(str(decision)))


def check_approvals(approvals: object) -> None:
    """A ``TypeError`` unless ``approvals`` maps call ids to True, False or a reason text: checked before the run is.

    Why first: as ``check_decision_value``, a wrong value is the caller's
    mistake whatever the run's state (an ended run's included); a text that
    reads as an approval is a ``ValueError`` there too.
    """
    if not isinstance(approvals, Mapping):
        msg = f"approvals must map call ids to True, False or a reason text, got {type(approvals).__name__}"
        raise TypeError(msg)
    for call_id, decision in approvals.items():
        if not isinstance(decision, bool | str):
            msg = f"approval for {call_id!r} must be True, False or a reason text, got {decision!r}"
            raise TypeError(msg)
        if reads_as_approval(decision):
            msg = f"approval for {call_id!r}: {_approving_text(str(decision))}"
            raise ValueError(msg)


def check_decision(run_id: str, data: dict[str, Any], call_id: str, decision: bool | str) -> bool:
    """Check that ``decision`` on ``call_id`` may be taken on the stored run ``data``; ``DecisionError`` if not.

    A decision is taken only on a run that is paused, for a call of its
    current turn that has not run, that the run holds back for approval
    (``to_approve``) and that has no other decision yet: a decision holds,
    so a second person cannot overturn the first.  The same decision given
    again (``False`` and ``""`` are one) is taken as given (a retried request
    goes on): False is returned then, as there is nothing to write; True for
    a new decision, which is written as ``settled(decision)``.
    """
    check_decision_value(decision)
    pending = [call.get("id") for call in data.get("pending") or [] if isinstance(call, dict)]
    approvals: dict[str, Any] = data.get("approvals") or {}
    if data.get("state") in ENDED:
        ended = f"it already ended ({data.get('state')}, reason {data.get('reason')!r})"
        raise DecisionError(run_id, call_id, f"the run is not paused for approval: {ended}; a decision comes too late")
    if not data.get("paused"):
        raise DecisionError(run_id, call_id, f"the run is not paused for approval (it is in {data.get('state')})")
    if call_id not in pending:
        known = ", ".join(map(str, pending)) or "none"
        raise DecisionError(run_id, call_id, f"it is not a pending call of the run (pending: {known})")
    ran = data.get("ran") or {}
    if call_id in ran:
        raise DecisionError(run_id, call_id, "it has already run")
    if call_id in approvals:
        stored = approvals[call_id]
        if same_decision(stored, decision):
            return False
        raise DecisionError(run_id, call_id, f"it was already decided ({describe_decision(stored)})")
    # A snapshot from before runs kept to_approve held back every undecided pending call (snapshot_fields.to_approve).
    held = data.get("to_approve", pending)
    if call_id not in held:
        raise DecisionError(run_id, call_id, _no_approval(i for i in pending if i in held))
    return True


def _no_approval(held: Iterable[object]) -> str:
    """Why a decision on a pending call that needs no approval is refused, naming the calls the run holds back."""
    known = ", ".join(map(str, held)) or "none"
    return f"it needs no approval, so there is nothing to decide (held back for a decision: {known})"


def needs_decision(run: Run, call: ToolCall) -> bool:
    """Whether ``call`` of ``run`` waits for a person: it needs approval and has no decision yet."""
    return call.id in run.calls.to_approve and call.id not in run.calls.approvals


def awaiting(run: Run) -> list[ToolCall]:
    """The tool calls of ``run``'s turn that need approval and have no decision yet (a stored run's too)."""
    return [call for call in run.calls.pending if needs_decision(run, call)]


class ApprovalGate:
    """The stepper's approval half: which pending calls wait for a person, and the decisions taken on them."""

    __slots__ = ()
    run: Run
    approve: Callable[[ToolCall], bool] | None

    def gate(self) -> None:
        """Mark the pending calls this agent's ``approve`` rule holds back as waiting for a decision, in the run.

        Asked once per call, when its reply arrives (and again when another
        agent resumes the run): from then on the run itself says the call
        waits, so an agent without ``approve=`` cannot run it undecided.
        """
        approve, run = self.approve, self.run
        if approve is None:
            return
        for call in run.calls.pending:
            if call.id not in run.calls.ran and call.id not in run.calls.approvals and approve(call):
                run.calls.to_approve.add(call.id)

    def needs_decision(self, call: ToolCall) -> bool:
        """Whether ``call`` waits for a person: it needs approval and has no decision yet."""
        return needs_decision(self.run, call)

    def _cleared(self, call: ToolCall) -> bool:
        """A call may run: it needs no approval, or a person approved it."""
        decision = self.run.calls.approvals.get(call.id)
        return decision is True or (decision is None and not self.needs_decision(call))

    def outcome_of(self, call: ToolCall) -> ToolResult | None:
        """The outcome the next ``step()`` will record for ``call``: a rejection, or the kept result, or None."""
        decision = self.run.calls.approvals.get(call.id, True)
        if decision is not True:
            return self._rejection_result(call, decision)
        return self.run.calls.ran.get(call.id)

    def _rejected(self, call: ToolCall) -> bool:
        decision = self.run.calls.approvals.get(call.id, True)
        return decision is not True

    @staticmethod
    def _rejection_result(call: ToolCall, decision: bool | str) -> ToolResult:
        message = rejection_text(call.name, decision)
        return ToolResult(ledger.error_text(message), message)

    def awaiting(self) -> list[ToolCall]:
        """The tool calls of this turn that need approval and have no decision yet."""
        return awaiting(self.run)

    def decide(self, approvals: Mapping[str, bool | str], run_id: str) -> None:
        """Record decisions on calls awaiting approval: ``True`` runs it, ``False`` or a reason text rejects it.

        ``False`` and ``""`` are one decision (rejected, no reason given), kept
        as ``False``.  Every decision is checked before any is recorded: a call
        that already ran, needs no approval or was decided otherwise is a
        ``DecisionError``, and the run is left as it was.  (The stepper refuses
        first every decision on a run that ended and on a call that is not
        pending, saying what became of it: ``late_decisions``.)
        """
        check_approvals(approvals)
        calls = self.run.calls
        for call_id, decision in approvals.items():
            if call_id in calls.ran:
                raise DecisionError(run_id, call_id, f"tool call {call_id!r} already ran; a decision comes too late")
            if call_id in calls.approvals:
                given = calls.approvals[call_id]
                if not same_decision(given, decision):
                    # A decision holds: a second person (or a retried request) cannot turn a rejection into an approval.
                    held = f"tool call {call_id!r} was already decided ({describe_decision(given)}); a decision holds"
                    raise DecisionError(run_id, call_id, held)
            elif call_id not in calls.to_approve:
                # Nobody is asked about such a call (the viewer, AG-UI and runs show offer none): a rejection would
                # silently drop a call the agent lets run.
                waiting = _no_approval(c.id for c in calls.pending if c.id in calls.to_approve)
                raise DecisionError(run_id, call_id, f"tool call {call_id!r}: {waiting}")
        calls.approvals.update({call_id: settled(decision) for call_id, decision in approvals.items()})
