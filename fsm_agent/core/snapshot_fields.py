"""Each field of a snapshot read back and checked: a value of the wrong kind is a ``SnapshotError`` naming it.

A snapshot is data anyone can write; ``core.snapshot`` puts a run together
from these readers, so each rule a field must keep is stated once, here
(a negative failure count would switch a limit off, a fractional token count
would make a budget lie).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from reprlib import repr as _shown
from typing import Any, TypeVar

from fsm_agent.core.history import ROLES
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.errors import SnapshotError
from fsm_agent.records import ChildOutcome, Message, ModelResponse, Step, ToolCall, Transition, Usage
from fsm_agent.tools import ToolResult

T = TypeVar("T")


def count(counters: dict[str, Any], name: str) -> int:
    value = counters.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"snapshot field counters.{name} must be a whole number >= 0, got {value!r}"
        raise SnapshotError(msg)
    return value


def dollars(counters: dict[str, Any]) -> float:
    value = counters.get("cost")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        msg = f"snapshot field counters.cost must be a finite number of US dollars >= 0, got {value!r}"
        raise SnapshotError(msg)
    return float(value)


def seconds(counters: dict[str, Any]) -> float:
    value = counters.get("elapsed")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        msg = f"snapshot field counters.elapsed must be a finite number of seconds >= 0, got {value!r}"
        raise SnapshotError(msg)
    return float(value)


def calls_by_tool(counters: dict[str, Any]) -> dict[str, int]:
    value = counters.get("calls_by_tool")
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        msg = f"snapshot field counters.calls_by_tool must map tool names to counts, got {value!r}"
        raise SnapshotError(msg)
    return {name: count(value, name) for name in value}


def tool_call(data: dict[str, Any]) -> ToolCall:
    return typed(ToolCall(**data), id=str, name=str)


def items(data: dict[str, Any], name: str, build: Callable[[dict[str, Any]], Any]) -> list[Any]:
    """Each entry of the list field ``name`` built into its record; ``SnapshotError`` naming the entry at fault."""
    if not isinstance(items := data.get(name), list) or not all(isinstance(item, dict) for item in items):
        msg = f"snapshot field {name} must be a list of objects, got {_shown(items)}"
        raise SnapshotError(msg)
    built = []
    for index, item in enumerate(items):
        try:
            built.append(build(item))
        except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
            msg = f"snapshot field {name}[{index}] is malformed: {type(exc).__name__}: {exc}"
            raise SnapshotError(msg) from exc
    return built


def typed(record: T, **kinds: type) -> T:
    """``record``, once each named field holds its kind (a bool is no number); else ``TypeError`` naming the field."""
    for name, kind in kinds.items():
        if not isinstance(value := getattr(record, name), kind) or (kind is int and isinstance(value, bool)):
            msg = f"{name} must be a {kind.__name__}, got {_shown(value)}"
            raise TypeError(msg)
    return record


def step(data: dict[str, Any]) -> Step:
    """A recorded step from its plain form, its index, kind and detail of their kinds."""
    return typed(Step(**data), index=int, kind=str, detail=str)


def transition(data: dict[str, Any], states: tuple[State, ...]) -> Transition:
    entry = typed(Transition(**data), trigger=str)
    if entry.source not in states or entry.dest not in states:
        msg = f"{entry.source!r} -> {entry.dest!r} is not an edge between states of this agent's table"
        raise ValueError(msg)
    return entry


_TEXTS = (  # the fields that hold a text or nothing (null, or left out)
    *("run_id", "start_id", "session_id", "request_id", "parent_run_id", "parent_call_id", "input_digest"),
    *("reason", "final", "unfinished", "finalizing", "error"),
)


def check_texts(data: dict[str, Any]) -> None:
    for name in _TEXTS:
        if (value := data.get(name)) is not None and not isinstance(value, str):
            msg = f"snapshot field {name} must be a string or null, got {_shown(value)}"
            raise SnapshotError(msg)
    for name in ("evidence", "finalize_evidence"):
        if not isinstance(value := data.get(name), dict):
            msg = f"snapshot field {name} must be an object, got {_shown(value)}"
            raise SnapshotError(msg)
    request_turns(data)


def ended_on(data: Mapping[str, Any] | None) -> Any:
    """The reason on the edge that ended a run, from its snapshot (None: none, or it did not stop).

    Why not the snapshot's ``reason``: a run whose ``finalize`` call was cut
    keeps the stop that asked for the finalize as its reason, and the cut
    (``cancelled``, ``timeout``, ``model_error``) is only on its last edge.
    Whoever asks whether a run was cut, and so goes on when resumed, asks this.
    So is a typed answer sent back for a retry that a cut forbade
    (``output_invalid`` with ``blocked_by`` a cut): the cut ended the run,
    and a resume that lifts it makes the retry (``resumes_output_retry``).
    """
    if data is None or data.get("state") != "Failed":
        return None
    trace = data.get("trace")
    last = trace[-1] if isinstance(trace, list) and trace else None
    reason = last.get("reason") if isinstance(last, dict) else data.get("reason")
    return retry_cut(reason, data.get("evidence")) or reason


def retry_cut(reason: object, evidence: object) -> str | None:
    """The cut that forbade a typed answer's owed retry (``output_invalid`` with ``blocked_by`` a cut), else None.

    Such a run was ended by the cut, not by its answer: a resume that lifts
    the cut makes the retry (``resumes_output_retry``).
    """
    if reason == "output_invalid" and isinstance(evidence, dict) and evidence.get("blocked_by") in CUTS:
        return str(evidence["blocked_by"])
    return None


CUTS = ("cancelled", "timeout")
"""The stops that come from outside a run's replies and results: a cancel (its token, its task) and its deadline."""


def request_turns(data: dict[str, Any]) -> dict[str, int]:
    """A session's turn's ``request_turns``: the request ids its earlier turns took, by turn number (none: {}).

    Why checked: ``Session.run`` answers a request sent again from the turn
    named here, so a number of the wrong kind would load another turn, or
    none.  Snapshots written before the field have none.
    """
    value = data.get("request_turns")
    if value is None:
        return {}
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and type(n) is int and n >= 1 for k, n in value.items()
    ):
        msg = f"snapshot field request_turns must map request ids to turn numbers >= 1, got {_shown(value)}"
        raise SnapshotError(msg)
    return dict(value)


def message(data: dict[str, Any]) -> Message:
    calls = tuple(tool_call(c) for c in data["tool_calls"])
    # Snapshots written before provider_data existed have no such key: nothing opaque to send back.
    message = Message(data["role"], data["content"], calls, data["tool_call_id"], data.get("provider_data"))
    typed(message, role=str, content=str, **({} if message.tool_call_id is None else {"tool_call_id": str}))
    if message.role not in ROLES:
        msg = f"role must be one of {', '.join(sorted(ROLES))}, got {_shown(message.role)}"
        raise ValueError(msg)
    return message


def response(data: dict[str, Any] | None) -> ModelResponse | None:
    if data is None:
        return None
    usage = None if data["usage"] is None else Usage(**data["usage"])
    return ModelResponse(message(data["message"]), data["stop_reason"], usage)


def result(data: dict[str, Any]) -> ToolResult:
    """A kept tool outcome from its plain form (a sub-agent's outcome with it)."""
    return ToolResult(**{**data, "child": child(data.get("child"))})


_CHILD_COUNTS = (
    *("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"),
    *("tool_calls", "priced_calls", "unpriced_calls"),
)


def child(data: object) -> ChildOutcome | None:
    """A sub-agent's outcome from its plain form: its run id a text, each count a whole number, its cost dollars.

    The parent adds these to its own counters, so one of the wrong kind
    would fail in the middle of a replay or resume, far from the field.
    """
    if data is None:
        return None
    if not isinstance(data, dict):
        msg = f"child must be an object, got {_shown(data)}"
        raise TypeError(msg)
    outcome = typed(ChildOutcome(**data), run_id=str)
    for name in _CHILD_COUNTS:
        if isinstance(value := getattr(outcome, name), bool) or not isinstance(value, int) or value < 0:
            msg = f"child.{name} must be a whole number >= 0, got {_shown(value)}"
            raise TypeError(msg)
    cost = outcome.cost
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf):
        msg = f"child.cost must be a finite number of US dollars >= 0 or null, got {_shown(cost)}"
        raise TypeError(msg)
    if outcome.stop is not None and not isinstance(outcome.stop, dict):
        msg = f"child.stop must be an object or null, got {_shown(outcome.stop)}"
        raise TypeError(msg)
    return outcome


def prior(data: dict[str, Any], messages: int) -> int:
    """How many leading messages came before the run; a snapshot from before histories has none (0: all are its own)."""
    value = data.get("prior", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= messages:
        msg = f"snapshot field prior must be a whole number from 0 to the {messages} messages, got {value!r}"
        raise SnapshotError(msg)
    return value


def to_approve(data: dict[str, Any], run: Run) -> set[str]:
    """The calls waiting for a decision; a snapshot from before the run kept them gates every undecided call if paused.

    Which calls the old run's ``approve`` rule held back was not written
    down, so a paused one holds back all it could: an undecided call must not
    run because the agent resuming it has no rule.
    """
    if "to_approve" not in data:
        if not data.get("paused"):
            return set()
        return {
            call.id for call in run.calls.pending if call.id not in run.calls.approvals and call.id not in run.calls.ran
        }
    ids = data["to_approve"]
    if not isinstance(ids, list) or not all(isinstance(i, str) for i in ids):
        msg = f"snapshot field to_approve must be a list of call ids, got {ids!r}"
        raise SnapshotError(msg)
    return set(ids)


def cut_children(value: object, name: str) -> dict[str, ChildOutcome]:
    """What sub-agent runs spent, by call id, from its plain form; ``TypeError`` or ``ValueError`` naming an entry.

    Why checked: a snapshot's ``cut_children`` holds these, and a negative or
    fractional count would make a call's later outcome add more than its
    child spent (``core.ledger.count_cut_child``).
    """
    if not isinstance(value, dict) or not all(isinstance(entry, dict) for entry in value.values()):
        msg = f"{name} must map call ids to what their sub-agent runs spent, got {_shown(value)}"
        raise SnapshotError(msg)
    return {str(call_id): spend(entry, f"{name}[{call_id!r}]") for call_id, entry in value.items()}


def spend(value: dict[str, Any], where: str) -> ChildOutcome:
    """What a sub-agent run spent, or what a cut counted of it, from its plain form: named, no stop, counts >= 0."""
    spent = ChildOutcome(**value)
    if not isinstance(spent.run_id, str) or spent.stop is not None:
        msg = f"{where} must name its run and no stop, got {_shown(value)}"
        raise SnapshotError(msg)
    for count in _SPENT:
        if type(getattr(spent, count)) is not int or getattr(spent, count) < 0:
            msg = f"{where}.{count} must be a whole number >= 0, got {getattr(spent, count)!r}"
            raise SnapshotError(msg)
    cost = spent.cost
    if cost is not None and (type(cost) not in (int, float) or not 0 <= cost < math.inf):
        msg = f"{where}.cost must be None or a finite number of US dollars >= 0, got {cost!r}"
        raise SnapshotError(msg)
    return spent


_SPENT = (
    "input_tokens",
    "output_tokens",
    "tool_calls",
    "cache_read_tokens",
    "cache_write_tokens",
    "reasoning_tokens",
    "priced_calls",
    "unpriced_calls",
)


def names(data: dict[str, Any], name: str) -> set[str]:
    """A field of distinct texts (``prepaid``: where handed outcomes came from); absent (a snapshot from before it
    existed, or none to keep): none."""
    value = data.get(name, [])
    if not isinstance(value, list) or not all(isinstance(item, str) for item in value):
        msg = f"snapshot field {name} must be a list of texts, got {_shown(value)}"
        raise SnapshotError(msg)
    if len(set(value)) != len(value):
        msg = f"snapshot field {name} names one outcome twice: {_shown(value)}"
        raise SnapshotError(msg)
    return set(value)
