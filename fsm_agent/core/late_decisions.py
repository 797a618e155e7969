"""Decisions that arrive after the run went past them: what became of each call, in words.

A person's decision on a held-back call may reach a run that another request
already resumed to its end (two tabs, the approving one first).  The run no
longer holds that call's decision (a call's decision is dropped once its
outcome is recorded), but its record shows what became of it: a call that
was made has its outcome among the run's calls (``run.talk.io``), and a
rejected one was answered with the rejection the model was told.  So the
late decision is refused naming the decision that stood, the way a store
refuses a second decision on a paused run (``approval.check_decision``).
A decision given to a run object that ended is refused the same way
(``on_ended_run``): a stopped run's pending calls are decided by its resume.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping

from fsm_agent.core.approval import describe_decision, rejection_in, same_decision
from fsm_agent.core.exchanges import ToolExchange
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.records import Message, ToolCall


def too_late(run: Run, approvals: Mapping[str, bool | str], held: Callable[[ToolCall], bool] | None) -> str:
    """Why each of ``approvals`` comes too late for the finished ``run``: the decision that stood, or what happened.

    ``held`` is the agent's ``approve`` rule: a call it holds back that was
    made was approved (nothing else runs a held-back call).
    """
    return "; ".join(_became_of(run, call_id, decision, held) for call_id, decision in approvals.items())


def on_ended_run(run: Run, approvals: Mapping[str, bool | str], held: Callable[[ToolCall], bool] | None) -> str:
    """Why no decision of ``approvals`` is taken on ``run``, which ended: how it ended, and what became of each call.

    Why refused, not kept: an ended run makes no call, so a decision kept
    in it would change what a stored run says was decided without deciding
    anything (a store refuses it on a stored run too).  A stopped run's
    pending calls are decided by the resume that lifts its stop.
    """
    became = too_late(run, approvals, held)
    if run.at.state is State.Done:
        return f"the run already finished in Done: a decision comes too late, and none was taken: {became}"
    return (
        f"the run already stopped ({run.at.reason!r}), and a stopped run takes no decision: {became}; to decide on "
        "the calls it left pending, give the decisions to the resume that lifts its stop: "
        "agent.resume(result, approvals={...})"
    )


def not_pending(
    run: Run, approvals: Mapping[str, bool | str], held: Callable[[ToolCall], bool] | None
) -> tuple[str, str] | None:
    """The first call ``run`` does not hold pending, and what became of each such call (None: all are pending).

    A run that went on past a call (a turn whose approved call came back
    before its cancel stopped it, then resumed) no longer holds it, and the
    same decision sent again must say the call was made, not only that no
    such call is pending.
    """
    pending = {call.id for call in run.calls.pending}
    gone = {call_id: decision for call_id, decision in approvals.items() if call_id not in pending}
    if not gone:
        return None
    first, known = next(iter(gone)), ", ".join(call.id for call in run.calls.pending) or "none"
    return first, f"no pending tool call has id {first!r} (pending: {known}): {too_late(run, gone, held)}"


def _became_of(run: Run, call_id: str, given: bool | str, held: Callable[[ToolCall], bool] | None) -> str:
    own = run.talk.messages[run.talk.prior :]
    asked = next(
        (
            (i, call)
            for i in range(len(own) - 1, -1, -1)
            if own[i].role == "assistant"
            for call in own[i].tool_calls
            if call.id == call_id
        ),
        None,
    )
    if asked is None:
        return f"the run asked for no tool call {call_id!r}"
    at, call = asked
    answer = next((m for m in own[at + 1 :] if m.role == "tool" and m.tool_call_id == call_id), None)
    made = any(isinstance(x, ToolExchange) and x.id == call_id for x in run.talk.io)
    if made:
        stood: bool | str | None = True if _held_back(held, call) else None
        done = "approved and made" if stood is True else "made (it needed no decision)"
    elif (reason := _rejection(call, answer)) is not None:
        stood = reason
        done = describe_decision(stood)
    else:
        what = "unanswered" if answer is None else f"answered {answer.content}"
        return f"tool call {call_id!r} was never made ({what})"
    said = f"tool call {call_id!r} was already {done}"
    if stood is not None and not same_decision(stood, given):
        said += f", and a decision holds: this one ({describe_decision(given)}) was not taken"
    return said


def _held_back(held: Callable[[ToolCall], bool] | None, call: ToolCall) -> bool:
    """Whether the agent's rule holds ``call`` back; False if it has none, or if it raised.

    Why False on a raise: the rule is the user's code, asked here only to word
    a refusal; its failure must not replace the refusal (a resume's
    ``ValueError``) with a bare exception, and the call was made either way.
    """
    if held is None:
        return False
    try:
        return bool(held(call))
    except Exception:  # noqa: BLE001 - the user's predicate: the refusal is worded without it
        return False


def _rejection(call: ToolCall, answer: Message | None) -> str | bool | None:
    """The reason a person gave when rejecting ``call`` (False: none given), read from its ``answer``; None if not."""
    if answer is None:
        return None
    try:
        error = json.loads(answer.content).get("error")
    except (ValueError, AttributeError):
        return None
    return rejection_in(call.name, error) if isinstance(error, str) else None
