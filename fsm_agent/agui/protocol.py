"""What an AG-UI request asks for, and how a turn's end is told: its outcome, usage, interrupts and stop.

The request side: the user's text is the last message of ``RunAgentInput``
(the thread's earlier messages are the store's, not the client's; its text
parts as paragraphs, ``PART_BREAK``, any other part refused), and a
``resume`` list answers the interrupts of a paused turn, one decision per
held-back tool call.  The answer side: every way a turn can end becomes the
one terminal event AG-UI has for it: ``RUN_FINISHED`` with a success,
interrupt or cancelled outcome, or ``RUN_ERROR``.  What the protocol has no
field for (the stop's reason, policy and evidence, the cost) travels in the
event's ``metadata`` under the key ``"fsm_agent"``.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
from ag_ui.core import (
    Interrupt,
    ResumeEntry,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunFinishedInterruptOutcome,
    RunFinishedSuccessOutcome,
    TextPart,
    TokenUsage,
    UserMessage,
)

from fsm_agent import AgentLoopError, RunResult, ToolCall, Usage
from fsm_agent.core.snapshot_fields import retry_cut
from fsm_agent.drivers.child import answer_of
from fsm_agent.jsontext import dumps

KEY = "fsm_agent"
"""The key of the events' ``metadata`` under which the adapter puts what the protocol has no field for."""
INTERRUPT_REASON = "tool_call"
"""An interrupt's ``reason``: a tool call held back for a person's decision (``Agent(approve=...)``)."""
DECISION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {"approved": {"type": "boolean"}, "reason": {"type": "string"}},
    "required": ["approved"],
}
"""The ``resume`` payload an interrupt asks for: ``{"approved": true}``, or false with the reason told to the model."""


PART_BREAK = "\n\n"
"""What stands between a user message's text parts in the turn's text: a blank line, each part a block of its own.

Why: AG-UI's parts are an ordered list of separate parts (the same parts a
tool result carries), which a UI builds from separate pieces (the typed
question, a quoted selection, an instruction it adds); joined as sent,
``["2+3?", "In French."]`` would reach the model as ``"2+3?In French."``.
A ``Message`` holds one text, so the parts become its paragraphs, in order,
each as sent; an empty part adds no paragraph.
"""


class RequestError(ValueError):
    """A request the adapter cannot serve (no user text, a resume payload it cannot read); the message says why."""


def user_text(run_input: RunAgentInput) -> str:
    """The new turn's text: the last message, which must be the user's, its text parts joined by ``PART_BREAK``.

    A part the agent cannot take (an image, audio, a video, a document) is
    refused, naming its type, rather than dropped.
    """
    if not run_input.messages or not isinstance(run_input.messages[-1], UserMessage):
        last = run_input.messages[-1].role if run_input.messages else "none"
        msg = f"a new turn needs the user's message last in RunAgentInput.messages (the last is {last})"
        raise RequestError(msg)
    content = run_input.messages[-1].content
    if isinstance(content, str):
        return content
    kinds = sorted({part.type for part in content if not isinstance(part, TextPart)})
    if kinds:
        msg = f"the agent takes text only; the user's message holds {', '.join(kinds)} parts"
        raise RequestError(msg)
    return PART_BREAK.join(part.text for part in content if isinstance(part, TextPart) and part.text)


def decisions(resume: list[ResumeEntry]) -> dict[str, bool | str]:
    """The approvals for ``Session.resume``, by tool call id, from the answers to a paused turn's interrupts.

    ``resolved`` with ``{"approved": true}`` (or a bare ``true``) runs the
    call; ``{"approved": false, "reason": "..."}`` (or ``false``) rejects it
    and the model is told the reason; ``cancelled`` rejects it too.
    """
    found: dict[str, bool | str] = {}
    for entry in resume:
        decision = _decision(entry)
        earlier = found.setdefault(entry.interrupt_id, decision)
        if earlier != decision:
            # Two answers to one interrupt: keeping either would drop the other (a repeated one is taken once).
            msg = f"interrupt {entry.interrupt_id!r} is answered twice, differently: answer each interrupt once"
            raise RequestError(msg)
    return found


def _decision(entry: ResumeEntry) -> bool | str:
    """One answer to an interrupt as a decision: True, False, or the reason a person rejected the call."""
    payload = entry.payload
    if entry.status == "cancelled":
        return "the person dismissed the request for approval"
    if isinstance(payload, bool):
        return payload
    if isinstance(payload, dict) and isinstance(payload.get("approved"), bool):
        reason = payload.get("reason")
        if payload["approved"]:
            return True
        return reason if isinstance(reason, str) and reason else False
    msg = (
        f"the answer to interrupt {entry.interrupt_id!r} must be true, false or "
        f'{{"approved": bool, "reason": "..."}}, got {json.dumps(payload)}'
    )
    raise RequestError(msg)


def token_usage(usage: Usage) -> list[TokenUsage] | None:
    """The turn's tokens as the protocol counts them (its accounting is ``Usage``'s); None when none were reported."""
    if usage.input_tokens == 0 and usage.output_tokens == 0:
        return None  # never reported, not a measured zero
    return [
        TokenUsage(
            input_tokens=usage.input_tokens,
            output_tokens=usage.output_tokens,
            total_tokens=usage.total,
            reasoning_tokens=usage.reasoning_tokens or None,
            cached_input_tokens=usage.cache_read_tokens or None,
            cache_write_input_tokens=usage.cache_write_tokens or None,
        )
    ]


def less(after: Usage, before: Usage) -> Usage:
    """What a resumed run spent itself: its usage less the paused run's (a cost only where both are known)."""
    spent = {f.name: getattr(after, f.name) - getattr(before, f.name) for f in attrs.fields(Usage) if f.name != "cost"}
    if after.cost is not None and before.cost is not None:
        spent["cost"] = after.cost - before.cost
    return Usage(**spent)


def _facts(result: RunResult, usage: Usage, **more: Any) -> dict[str, Any]:
    """The ``metadata`` an ending carries: the fsm_agent run, its reason, and the cost where known."""
    facts: dict[str, Any] = {"reason": result.reason, **more}
    if usage.cost is not None:
        facts["cost"] = usage.cost
    # The evidence is JSON by contract; read back through JSON so nothing else can reach the encoder.
    return {KEY: json.loads(dumps(facts, default=str))}


def finished(thread_id: str, run_id: str, result: RunResult, usage: Usage, policy: str | None) -> RunFinishedEvent:
    """The ``RUN_FINISHED`` of a turn that returned: done, paused for approval, cancelled, or a stop it returns.

    A stop under a ``return`` (or ``finalize``) policy is a success outcome:
    the run ended as the agent was told to end it; its reason, policy and
    evidence are in the metadata.
    """
    tokens = token_usage(usage)
    if result.reason == "paused":
        interrupts = [
            Interrupt(
                id=call.id,
                reason=INTERRUPT_REASON,
                message=f"approve the call to {call.name!r}?",
                tool_call_id=call.id,
                response_schema=DECISION_SCHEMA,
                metadata={KEY: {"tool": call.name, "arguments": call.arguments, **_decided(decision)}},
            )
            for call, decision in held(result)
        ]
        outcome: Any = RunFinishedInterruptOutcome(interrupts=interrupts)
        return RunFinishedEvent(
            thread_id=thread_id, run_id=run_id, outcome=outcome, usage=tokens, metadata=_facts(result, usage)
        )
    if cancelled(result):
        facts = _facts(result, usage, evidence=result.evidence)
        return RunFinishedEvent(
            thread_id=thread_id, run_id=run_id, outcome=RunFinishedCancelledOutcome(), usage=tokens, metadata=facts
        )
    more: dict[str, Any] = {} if result.ok else {"policy": policy, "evidence": result.evidence}
    return RunFinishedEvent(
        thread_id=thread_id,
        run_id=run_id,
        result=answer_of(result) if result.ok else result.final,
        outcome=RunFinishedSuccessOutcome(),
        usage=tokens,
        metadata=_facts(result, usage, **more),
    )


def cancelled(result: RunResult) -> bool:
    """Whether the turn ended on a cancel: its reason, or the retry of its answer a cancel forbade.

    Why the second: such a turn stops ``output_invalid`` with ``blocked_by``
    ``cancelled``, and the cancel is what ended it (``retry_cut``).  Its
    request answered nobody, as a cancelled turn's, and the same request
    takes a new turn; its ending says so (the evidence keeps the errors).
    """
    return result.reason == "cancelled" or retry_cut(result.reason, result.evidence) == "cancelled"


def held(result: RunResult) -> list[tuple[ToolCall, bool | str | None]]:
    """The calls a paused turn holds for a person, each with the decision already given on it (None: none yet).

    A person may decide them elsewhere (the run viewer, ``store.decide``)
    while the turn stays paused until someone resumes it: each is still an
    interrupt, so a client answers it, and the same answer resumes the turn.
    """
    data = result.snapshot
    if data is None:
        return [(call, None) for call in result.pending]
    approvals = data.get("approvals") or {}
    ids = set(data.get("to_approve") or ())
    calls = [ToolCall(**call) for call in data.get("pending") or ()]
    return [(call, approvals.get(call.id)) for call in calls if call.id in ids]


def _decided(decision: bool | str | None) -> dict[str, Any]:
    """A decision already given, as the ``decided`` metadata of its interrupt: the payload that answers it so."""
    if decision is None:
        return {}
    if decision is True:
        return {"decided": {"approved": True}}
    return {"decided": {"approved": False, **({"reason": decision} if isinstance(decision, str) and decision else {})}}


def stopped(thread_id: str, run_id: str, stop: AgentLoopError, usage: Usage) -> RunFinishedEvent | RunErrorEvent:
    """The ending of a turn that raised its stop: ``RUN_ERROR`` with reason, policy and evidence; cancelled apart."""
    result = stop.result
    if cancelled(result):
        return finished(thread_id, run_id, result, usage, "raise")
    return RunErrorEvent(
        message=str(stop),
        code=stop.reason,
        usage=token_usage(usage),
        metadata=_facts(result, usage, policy="raise", evidence=stop.evidence),
    )
