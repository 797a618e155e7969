"""What each call of a run was sent and gave back, kept in the run so a stored run can be exported as a recording.

The request of a model call cannot be rebuilt from the stored run alone:
history processors and a compaction change the messages sent, and the tool
schemas and the output schema belong to the agent, not to the run.  So the
stepper keeps one record per call as its outcome comes in (``run.io``, a
growing list of the snapshot), small where it can be: the messages as a count
of the run's leading messages when those were sent unchanged (the messages
themselves only when they were changed), and the tools and output schema
only when they differ from the previous call's.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

from fsm_agent.core.output import OutputSpec
from fsm_agent.core.snapshot_fields import spend
from fsm_agent.definition.run import Run
from fsm_agent.records import ChildOutcome, Message, ModelResponse, OutputSchema, ToolCall, Usage, child_outcome
from fsm_agent.tools import JSONSchema, ToolResult


@attrs.frozen
class ModelExchange:
    """One model call: what it was sent and its reply (or why it gave none).

    ``messages`` is a count of the run's leading messages when those were
    sent as they are, else the messages sent.  ``offered`` says whether
    ``tools`` and ``output`` are given here; when false they are the previous
    model call's.
    """

    turn: int
    messages: int | tuple[Message, ...]
    offered: bool = False
    tools: list[JSONSchema] | None = None
    output: OutputSchema | None = None
    reply: ModelResponse | None = None
    error: str | None = None


@attrs.frozen
class ToolExchange:
    """One tool call's outcome, by the call's id (its arguments are in the reply that asked for it).

    ``held`` says whether the call waited for a person's decision (and was
    approved, since it ran): what a replay checks its agent's ``approve=``
    against.  None in an entry kept before it was recorded.  ``cut``: what
    cuts of a sub-agent call in flight counted of its runs before this
    outcome answered it (``Calls.cut_counted``), None if none did; the
    outcome brings only the rest, so a fork that takes the outcome past its
    fork point, where it keeps no cut of the call, counts both
    (``drivers.fork_spend``).
    """

    id: str
    name: str
    result: ToolResult
    held: bool | None = None
    cut: ChildOutcome | None = None


Exchange = ModelExchange | ToolExchange


class ExchangeLog:
    """The stepper's half that keeps ``run.io``; the driver tells it what a model call was sent (``will_send``)."""

    # What the model call in flight is sent when it is not the run's messages, and the tools and output schema
    # the last kept call was offered.
    __slots__ = ("_offered", "_sent")
    run: Run
    schemas: list[JSONSchema]
    output: OutputSpec | None

    def __init__(self) -> None:
        self._sent: Sequence[Message] | None = None
        self._offered: tuple[list[JSONSchema], OutputSchema | None] | None = None

    def will_send(self, messages: Sequence[Message]) -> None:
        """The model call of this turn is sent ``messages`` (history processors changed them), as steps say."""
        self.run.talk.sent = len(messages)
        self._sent = messages

    def _log_model(self, reply: ModelResponse | None, error: str | None) -> None:
        """Keep the model call just answered (``run.turns`` already counts it) before its reply changes the run."""
        run = self.run
        sent = self._sent
        self._sent = None
        tools = [] if run.at.finalizing is not None else self.schemas
        output = None if self.output is None else self.output.request
        offered = self._offered is None or self._offered[1] != output or self._offered[0] != tools
        if offered:
            self._offered = (tools, output)
        messages: int | tuple[Message, ...] = len(run.talk.messages) if sent is None else tuple(sent)
        record = ModelExchange(run.counts.turns, messages, offered, tools if offered else None, output, reply, error)
        run.talk.io.append(record)

    def _log_unusable(self, reply: ModelResponse) -> None:
        """Replace the reply of the model call just logged by ``reply``: the same reply, kept as a snapshot holds it."""
        io = self.run.talk.io
        io[-1] = attrs.evolve(io[-1], reply=reply)

    def _log_tool(self, call: ToolCall, outcome: ToolResult) -> None:
        """Keep a tool call's outcome, and whether it waited for a person (it is held until its outcome is replayed)."""
        run = self.run
        calls = run.calls
        cut = calls.cut_counted.pop(call.id, None) if calls.cut_counted else None
        run.talk.io.append(ToolExchange(call.id, call.name, outcome, call.id in calls.to_approve, cut))


def exchange_of(data: dict[str, Any]) -> Exchange:
    """A stored exchange (its plain form) as its record; ``KeyError``/``TypeError``/``ValueError`` if malformed."""
    if "result" in data:
        result = data["result"]
        outcome = ToolResult(**{**result, "child": child_outcome(result.get("child"))})
        held = data.get("held")  # none kept before it was recorded
        if held is not None and not isinstance(held, bool):
            msg = f"held must be true, false or null, got {held!r}"
            raise TypeError(msg)
        cut = data.get("cut")  # none kept before it was recorded, nor where no cut counted any of the call
        if cut is not None and not isinstance(cut, dict):
            msg = f"cut must be what cuts of the call counted (an object) or null, got {type(cut).__name__}"
            raise TypeError(msg)
        counted = None if cut is None else spend(cut, "cut")
        return ToolExchange(str(data["id"]), str(data["name"]), outcome, held, counted)
    messages = data["messages"]
    if not isinstance(messages, int):
        messages = tuple(message_from(m) for m in messages)
    output = None if data["output"] is None else OutputSchema(**data["output"])
    reply = None if data["reply"] is None else response_from(data["reply"])
    tools = data["tools"]
    if tools is not None and not isinstance(tools, list):
        msg = f"tools must be a list of schemas, got {type(tools).__name__}"
        raise TypeError(msg)
    return ModelExchange(int(data["turn"]), messages, bool(data["offered"]), tools, output, reply, data["error"])


def message_from(data: dict[str, Any]) -> Message:
    """A message from its plain form."""
    calls = tuple(ToolCall(**c) for c in data["tool_calls"])
    return Message(data["role"], data["content"], calls, data["tool_call_id"], data.get("provider_data"))


def response_from(data: dict[str, Any]) -> ModelResponse:
    """A model reply from its plain form; a usage the run could not count comes back as the text it was kept as."""
    usage = data["usage"]
    if isinstance(usage, dict):
        usage = Usage(**usage)
    return ModelResponse(message_from(data["message"]), data["stop_reason"], usage)
