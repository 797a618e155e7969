"""Immutable records that cross the API: messages, tool calls, responses, steps, results.

Everything here is an ``attrs.frozen`` class so a result handed to the caller
cannot be changed behind the engine's back, and so records compare by value in
tests.  The one mutable object of a run lives in :mod:`fsm_agent.run`.
"""

from __future__ import annotations

import json
from functools import cached_property
from typing import Any

import attr
import attrs

from fsm_agent.jsontext import dumps as json_text


def _tuple(value: Any) -> tuple[Any, ...]:
    return tuple(value)


def _dict(value: Any) -> dict[str, Any]:
    return dict(value)


# Built once: json.dumps with options builds a new encoder per call, which costs more than the encoding.
_canonical = json.JSONEncoder(sort_keys=True, ensure_ascii=False).encode


@attrs.frozen
class ToolCall:
    """One tool call requested by the model; ``arguments`` is the decoded JSON object.

    ``raw_arguments`` is set only when the model's argument text could not be
    decoded (models do emit broken JSON): the call then fails with a message
    telling the model what was wrong, and the text itself is kept.
    """

    id: str
    name: str
    arguments: dict[str, Any] = attrs.field(factory=dict)
    raw_arguments: str | None = None

    @cached_property
    def canonical_arguments(self) -> str | None:
        """``arguments`` as JSON text with sorted keys, or None if they do not encode so: kept once computed.

        The reply's check, the ``repeated_action`` guard and the ledger read one
        encoding; a tool gets its own copy of the arguments (``tools.calling``).
        """
        try:
            return _canonical(self.arguments)
        except (TypeError, ValueError):  # not JSON, or keys JSON holds but that do not sort (str beside int)
            return None


@attrs.frozen
class ProviderData:
    """Content of an assistant reply that its provider requires back verbatim and the engine never interprets.

    Reasoning models return opaque items (Anthropic ``thinking`` and
    ``redacted_thinking`` blocks with their signatures, OpenAI Responses
    ``reasoning`` items with ``encrypted_content``, Gemini thought
    signatures) that must come back unchanged and in their original position
    on every later request, or the provider rejects the conversation.
    ``provider`` names the adapter family that produced it (``"anthropic"``,
    ``"openai-responses"``, ``"gemini"``): only that adapter sends it back,
    others ignore it, so a conversation can switch providers.  ``payload`` is
    JSON text of the reply's own list of blocks, output items or parts, in
    their order: a string is immutable and comes back from any store byte for
    byte.  ``thinking`` is the readable part of the reasoning (thinking text,
    reasoning summaries, thought parts) for hooks and viewers; it is never
    part of ``Message.content``, so it cannot be taken for the answer.
    """

    provider: str = attrs.field(validator=attrs.validators.instance_of(str))
    payload: str = attrs.field(validator=attrs.validators.instance_of(str))
    thinking: str = attrs.field(default="", validator=attrs.validators.instance_of(str))

    def items(self) -> list[Any]:
        """``payload`` decoded: a fresh list on every call, so changing it cannot change the record."""
        decoded: list[Any] = json.loads(self.payload)
        return decoded


def _provider_data(value: Any) -> ProviderData | None:
    # Accepts the record or its to_dict() form, so every reader (results, snapshots, stores) shares one rule.
    if value is None or isinstance(value, ProviderData):
        return value
    if isinstance(value, dict):
        return ProviderData(**value)
    msg = f"provider_data must be a ProviderData or its dict, got {type(value).__name__}"
    raise TypeError(msg)


@attrs.frozen
class Message:
    """One chat message: ``system``, ``user``, ``assistant`` or ``tool``.

    ``provider_data`` holds what an assistant reply's provider needs back
    verbatim (see :class:`ProviderData`); no guard of the engine reads it.
    """

    role: str
    content: str = ""
    tool_calls: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple)
    tool_call_id: str | None = None
    provider_data: ProviderData | None = attrs.field(default=None, converter=_provider_data)


@attrs.frozen(repr=False)
class Usage:
    """Tokens one model call consumed, and what they cost; a response without usage counts as zero tokens.

    ``input_tokens`` counts every input token, the cached ones included:
    ``cache_read_tokens`` were read from the provider's prompt cache and
    ``cache_write_tokens`` written to it, both part of ``input_tokens``.
    ``output_tokens`` counts every output token, ``reasoning_tokens`` (the
    model's hidden thinking) included.  ``cost`` is in US dollars: a model's
    own figure, or the agent's price for the call (``Agent(prices=...)``, else
    the ``genai-prices`` package); ``None`` where the price is unknown, never a
    guess (a call without usage, counted as zero tokens, costs nothing at a
    known price).  A run's usage (``RunResult.usage``) totals the tokens and
    the cost of its calls and of its sub-agents' runs, its cost ``None`` if any
    of them was unpriced.
    """

    input_tokens: int = 0
    output_tokens: int = 0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    cost: float | None = None

    @property
    def total(self) -> int:
        """Input plus output tokens."""
        return self.input_tokens + self.output_tokens

    def __repr__(self) -> str:
        # The token counts always, the breakdowns where not zero and the cost where known: most calls have neither.
        shown = [f"input_tokens={self.input_tokens!r}", f"output_tokens={self.output_tokens!r}"]
        for name in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
            if getattr(self, name):
                shown.append(f"{name}={getattr(self, name)!r}")
        if self.cost is not None:
            shown.append(f"cost={self.cost!r}")
        return f"Usage({', '.join(shown)})"


STOP_REASONS = ("end_turn", "tool_use", "stop_sequence", "max_tokens", "refusal")
"""The ``stop_reason`` values the engine understands; anything else is a model error."""


@attrs.frozen
class ModelResponse:
    """What a model returns for one call.

    ``stop_reason`` follows the Anthropic vocabulary the engine understands:
    ``end_turn``, ``tool_use``, ``stop_sequence``, ``max_tokens`` (the output
    was cut off: the run stops with reason ``max_tokens``) and ``refusal`` (the
    provider refused or filtered the output: reason ``refusal``); adapters map
    their provider's signals onto it.  Any other value ends the run with
    ``model_error``: guessing whether an unknown signal means "complete"
    could hand a truncated answer to the caller as if it were whole.
    """

    message: Message
    stop_reason: str = "end_turn"
    usage: Usage | None = None


@attrs.frozen
class OutputSchema:
    """The JSON Schema a typed agent's final answer must match, as an adapter asks its provider for it.

    Built by the agent from its ``output_type``; a model whose ``complete``
    takes an ``output`` keyword receives it with every call (the scripted
    models may ignore it).  ``name`` is the type's name, cut to what every
    provider accepts (``[A-Za-z0-9_-]``, at most 64).  ``schema`` always
    describes a JSON object.  ``strict`` is true when the schema already meets
    the rules of OpenAI's strict mode (every object lists all its properties
    as required and allows no others), so an adapter can ask for strict
    decoding without the provider refusing the schema.
    """

    name: str
    schema: dict[str, Any] = attrs.field(converter=_dict)
    description: str = ""
    strict: bool = False


def _one_priced_call(kept: ChildOutcome) -> int:
    """The priced calls of an outcome that names none (kept before they were counted): one if it cost dollars."""
    return 1 if kept.cost else 0


def _one_unpriced_call(kept: ChildOutcome) -> int:
    """The unpriced calls of an outcome that names none (kept before they were counted): one if its cost is unknown."""
    return 1 if kept.cost is None else 0


@attrs.frozen
class ChildOutcome:
    """What a sub-agent's run brought its parent's tool call: its id, its tokens and tool calls, a stop to pass on.

    ``stop`` (reason, evidence) is set when the child stopped and its tool
    says ``on_child_stop="raise"``: the parent then stops with
    ``child_stopped``.  The tokens and the ``cost`` (US dollars, ``None`` if
    unknown) count against the parent's budgets, and the child's tool calls
    against the parent's ``max_tool_calls`` total.  A call made again after
    the parent was cut with it in flight brings only what its child's run
    spent beyond what the parent counted at the cut (``drivers.cut_spend``).
    ``priced_calls`` and ``unpriced_calls`` are the model calls of that
    spend (the child's own, and its sub-agents'), whose cost was known and
    unknown: the parent counts each of them as one of its own (its
    ``cost_budget`` evidence).  An outcome kept before they were counted
    (an older snapshot) names none: it counts as the one call it counted as
    then, priced if it cost dollars, unpriced if its cost is unknown.
    """

    run_id: str
    input_tokens: int = 0
    output_tokens: int = 0
    stop: dict[str, Any] | None = None
    tool_calls: int = 0
    cost: float | None = 0.0
    cache_read_tokens: int = 0
    cache_write_tokens: int = 0
    reasoning_tokens: int = 0
    priced_calls: int = attrs.field(default=attrs.Factory(_one_priced_call, takes_self=True))
    unpriced_calls: int = attrs.field(default=attrs.Factory(_one_unpriced_call, takes_self=True))


def child_outcome(value: ChildOutcome | dict[str, Any] | None) -> ChildOutcome | None:
    """A child outcome, from its plain form too (a snapshot holds that for a kept tool outcome)."""
    return ChildOutcome(**value) if isinstance(value, dict) else value


@attrs.frozen
class Step:
    """One unit of work the run did: a tool call (``kind="tool_call"``) or the final answer.

    ``index`` is the model turn the step belongs to, so the tool calls of one
    turn share an index.  ``counters`` maps each counter name to ``[used, limit]``
    (``limit`` is ``None`` where no limit is set) after the step, so an app can
    warn before a limit is hit.
    """

    index: int
    kind: str
    detail: str
    counters: dict[str, list[int | float | None]] = attrs.field(factory=dict, converter=_dict)
    truncated: int = 0
    """Characters cut from this tool call's output by the registry's ``max_output_chars`` (0: whole)."""
    sent: int = 0
    """Messages the model call of this step's turn was sent, where history processors or a compaction changed
    them (0: the whole conversation)."""
    child: str | None = None
    """The id of the sub-agent run this tool call was (``Agent.as_tool``), or None."""
    reused_from: str | None = None
    """On a fork (``Agent.fork``): the source run's call (``run_id/call_id``) whose recorded result this call took
    instead of being made again; None for a call that was made."""


@attrs.frozen
class Transition:
    """One edge of the machine that a run took.

    ``guard`` is the name of the predicate that allowed it (``None`` for a
    fallback edge) and ``reason`` is set only on edges into ``Failed``; together
    with ``source``, ``trigger`` and ``dest`` they name exactly one table row.
    """

    source: str
    trigger: str
    dest: str
    guard: str | None = None
    reason: str | None = None


@attrs.frozen
class RunResult:
    """Everything a run produced, whether it ended in ``Done`` or ``Failed``.

    ``reason`` is ``"done"`` for a natural finish and the stop reason
    otherwise; ``ok`` is true only for a natural finish.  ``pending`` holds the
    tool calls the model asked for that were never executed (for example the
    repeated call that stopped the run), so nothing the model asked for is lost
    without a trace; for a run paused for approval, the calls awaiting a
    decision.  ``evidence`` is the stop's JSON-serialisable diagnosis.  A
    stopped or paused run also carries its ``snapshot``, enough for
    ``Agent.resume`` to continue it (``None`` after a natural finish).
    ``prior`` counts the leading messages that came before the run (the
    system prompt and the history it continued): ``messages[prior:]`` are the
    run's own, starting with its question, and ``messages`` the whole
    conversation, so ``history=result`` continues it.  ``output`` is a
    typed agent's accepted answer (``None`` without an ``output_type``, and
    for a run that did not finish in ``Done``).
    """

    messages: tuple[Message, ...] = attrs.field(converter=_tuple)
    steps: tuple[Step, ...] = attrs.field(converter=_tuple)
    final: str
    reason: str = "done"
    trace: tuple[Transition, ...] = attrs.field(default=(), converter=_tuple)
    evidence: dict[str, Any] = attrs.field(factory=dict, converter=_dict)
    usage: Usage = attrs.field(factory=Usage)
    pending: tuple[ToolCall, ...] = attrs.field(default=(), converter=_tuple)
    # Left out of equality: it repeats the result's own data plus the run's random id and clock readings.
    snapshot: dict[str, Any] | None = attrs.field(default=None, eq=False)
    prior: int = attrs.field(default=0, validator=attrs.validators.instance_of(int))
    # Not in to_dict() and left out of equality: any Python value (the text it came from is ``final``).
    output: Any = attrs.field(default=None, eq=False)

    @property
    def ok(self) -> bool:
        """True if and only if the run reached ``Done`` without any stop."""
        return self.reason == "done"

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict with a format version; ``from_dict`` reads it back losslessly."""
        return _result_to_dict(self)

    def to_json(self, **dumps: Any) -> str:
        """``to_dict()`` as JSON text (keyword arguments go to ``json.dumps``) that any file or socket can carry.

        Lone surrogates (half an emoji, which providers do send) are written as
        ``\\udXXX`` escapes, so the text encodes as UTF-8 and ``from_json``
        reads back the very same strings.
        """
        return json_text(self.to_dict(), **dumps)

    @classmethod
    def from_dict(cls, data: Any) -> RunResult:
        """Rebuild a result from ``to_dict()`` output; a wrong version or shape is a ``ValueError`` saying what."""
        return _result_from_dict(data)

    @classmethod
    def from_json(cls, text: str) -> RunResult:
        """Rebuild a result from ``to_json()`` text."""
        try:
            data = json.loads(text)
        except ValueError as exc:
            msg = f"RunResult JSON does not parse: {exc}"
            raise ValueError(msg) from exc
        return _result_from_dict(data)


RESULT_FORMAT = "fsm_agent.RunResult"
RESULT_VERSION = 1


def plain(record: Any) -> dict[str, Any]:
    """An attrs record as JSON-ready data: nested records become dicts and tuples become lists."""
    data: dict[str, Any] = attr.asdict(record, retain_collection_types=False)
    return data


def _result_to_dict(result: RunResult) -> dict[str, Any]:
    data = plain(result)
    del data["output"]  # any Python value, not JSON; ``final`` holds the text it was read from
    return {"format": RESULT_FORMAT, "version": RESULT_VERSION, **data, "ok": result.ok}


def _message_from(data: dict[str, Any]) -> Message:
    calls = tuple(ToolCall(**call) for call in data.get("tool_calls", ()))
    return Message(data["role"], data.get("content", ""), calls, data.get("tool_call_id"), data.get("provider_data"))


def _result_from_dict(data: Any) -> RunResult:
    if not isinstance(data, dict):
        msg = f"a RunResult dict must be a JSON object, got {type(data).__name__}"
        raise ValueError(msg)  # noqa: TRY004 - every malformed input is a ValueError, whatever its kind
    if data.get("format") != RESULT_FORMAT or data.get("version") != RESULT_VERSION:
        found = (data.get("format"), data.get("version"))
        msg = f"unsupported RunResult format {found}; this version reads ({RESULT_FORMAT!r}, {RESULT_VERSION})"
        raise ValueError(msg)
    try:
        return RunResult(
            messages=[_message_from(m) for m in data["messages"]],
            steps=[Step(**s) for s in data["steps"]],
            final=data["final"],
            reason=data["reason"],
            trace=[Transition(**t) for t in data["trace"]],
            evidence=data["evidence"],
            usage=Usage(**data["usage"]),
            pending=[ToolCall(**c) for c in data["pending"]],
            snapshot=data.get("snapshot"),
            prior=data.get("prior", 0),  # results written before conversations had none
        )
    except (KeyError, TypeError, AttributeError) as exc:
        msg = f"malformed RunResult dict: {type(exc).__name__}: {exc}"
        raise ValueError(msg) from exc
