"""The snapshot format: a run's whole position as plain JSON-ready data, versioned, owned here alone.

A run is a state name plus data, so it can be saved between any two
transitions and continued elsewhere exactly.  No pickle: a snapshot is JSON,
readable and diffable.  A corrupted, tampered or contradictory one is
rejected with ``SnapshotError`` naming the field at fault, never turned into
a silently wrong run (a negative failure count would switch a limit off).
Version 1 snapshots (before tool outcomes were kept by call id) are
migrated (``core.snapshot_migrations``).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from reprlib import repr as _shown
from typing import Any, TypeVar

import attrs

from fsm_agent.core.consistency import contradictions
from fsm_agent.core.exchanges import exchange_of
from fsm_agent.core.snapshot_migrations import MIGRATIONS
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.errors import FsmAgentError
from fsm_agent.jsontext import versioned
from fsm_agent.records import Message, ModelResponse, Step, ToolCall, Transition, Usage, child_outcome, plain, spends
from fsm_agent.tools import ToolResult

T = TypeVar("T")
SNAPSHOT_FORMAT = "fsm_agent.Snapshot"
SNAPSHOT_VERSION = 2


class SnapshotError(FsmAgentError, ValueError):
    """A snapshot that cannot be resumed: wrong version, broken JSON, unknown state, bad or contradictory fields."""


GROWING = ("messages", "steps", "trace", "io")
"""The snapshot's lists that only ever grow while a run goes on: a store's journal keeps just their new items.

``io`` (what each call was sent and gave back, ``core.exchanges``) came later within version 2: a snapshot
without it loads with none.
"""


def dump(run: Run, **extra: Any) -> dict[str, Any]:
    """The run's position, counters, conversation, limits and kept tool outcomes as a JSON-ready dict.

    ``prior`` (how many leading messages came before the run) is written
    here and not in ``dump_small``: it never changes, so the whole snapshot
    a store starts from keeps it and no checkpoint needs to repeat it.
    """
    return {**dump_small(run, **extra), "prior": run.talk.prior, **dump_growth(run, (0, 0, 0, 0))}


def dump_growth(run: Run, since: tuple[int, ...]) -> dict[str, list[dict[str, Any]]]:
    """The items each ``GROWING`` list gained after its first ``since`` items (what one checkpoint appends)."""
    return {
        "messages": [plain(m) for m in run.talk.messages[since[0] :]],
        "steps": [plain(s) for s in run.talk.steps[since[1] :]],
        "trace": [plain(t) for t in run.at.trace[since[2] :]],
        "io": [plain(x) for x in run.talk.io[since[3] :]],
    }


def dump_small(run: Run, **extra: Any) -> dict[str, Any]:
    """Every field of the snapshot but the ``GROWING`` lists: bounded in size however long the run."""
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        **extra,
        "state": str(run.at.state),
        "pending": [plain(c) for c in run.calls.pending],
        "ran": {call_id: plain(outcome) for call_id, outcome in run.calls.ran.items()},
        "cut_children": {call_id: plain(spent) for call_id, spent in run.calls.cut_children.items()},
        "approvals": dict(run.calls.approvals),
        "carried": [[name, arguments, plain(result)] for name, arguments, result in run.calls.carried],
        "carried_down": [
            [name, arguments, [[n, a, plain(r)] for n, a, r in outcomes]]
            for name, arguments, outcomes in run.calls.carried_down
        ],
        "to_approve": [call.id for call in run.calls.pending if call.id in run.calls.to_approve]
        if run.calls.to_approve
        else [],
        "last_response": None if run.talk.last_response is None else plain(run.talk.last_response),
        "counters": {
            "turns": run.counts.turns,
            "failures": run.counts.failures,
            "tool_calls": run.counts.tool_calls,
            "calls_by_tool": dict(run.counts.calls_by_tool),
            "last_signature": None if run.counts.last_signature is None else list(run.counts.last_signature),
            "last_error": run.talk.last_error,
            "recent": [[name, arguments, result] for (name, arguments), result in run.counts.recent],
            "input_tokens": run.counts.input_tokens,
            "output_tokens": run.counts.output_tokens,
            "cache_read_tokens": run.counts.cache_read_tokens,
            "cache_write_tokens": run.counts.cache_write_tokens,
            "reasoning_tokens": run.counts.reasoning_tokens,
            "cost": run.counts.cost,
            "priced": run.counts.priced,
            "unpriced": run.counts.unpriced,
            "elapsed": run.counts.elapsed,
            "sent": run.talk.sent,
        },
        "frozen": {"cancelled": run.counts.cancelled} if run.at.frozen else None,
        "limits": plain(run.limits),
        "earlier_limits": [[at, plain(limits)] for at, limits in run.at.earlier_limits],
        "finalizing": run.at.finalizing,
        "finalize_evidence": run.at.finalize_evidence,
        "reason": run.at.reason,
        "final": run.at.final,
        "evidence": run.at.evidence,
        "unfinished": run.at.unfinished,
        "error": _error_text(run.faults.model_exception or run.faults.condition_error),
        "compaction": _compaction(run),
    }


def _compaction(run: Run) -> dict[str, Any] | None:
    """A compacted history (what the model is sent before the run's messages from ``start`` on), or None."""
    if run.talk.context_head is None:
        return None
    return {
        "head": [plain(message) for message in run.talk.context_head],
        "start": run.talk.context_start,
        "turn": run.counts.compacted_turn,
        "due": run.talk.compacting,
        "error": run.talk.compact_error,
    }


def _error_text(exc: BaseException | None) -> str | None:
    return None if exc is None else f"{type(exc).__name__}: {exc}"


def parse(snapshot: dict[str, Any] | str) -> dict[str, Any]:
    """Accept a snapshot dict or its JSON text; check the format and bring an older version up to date."""
    return versioned(snapshot, "snapshot", (SNAPSHOT_FORMAT, SNAPSHOT_VERSION), MIGRATIONS, SnapshotError)


def limits_of(data: dict[str, Any], **overrides: Any) -> Limits:
    """The snapshot's limits with any given overrides (``None`` overrides are ignored); every field must be there."""
    stored = data.get("limits")
    if not isinstance(stored, dict):
        msg = f"snapshot field limits must be an object, got {type(stored).__name__}"
        raise SnapshotError(msg)
    stored = {"cost_budget": None, **stored}  # a snapshot from before cost_budget had none: no such limit then
    missing = [field.name for field in attrs.fields(Limits) if field.name not in stored]
    if missing:
        # A missing limit must not silently become "no limit".
        msg = f"snapshot field limits lacks {', '.join(missing)}"
        raise SnapshotError(msg)
    try:
        limits = Limits(**stored)
    except (TypeError, ValueError) as exc:
        msg = f"snapshot field limits is invalid: {exc}"
        raise SnapshotError(msg) from exc
    # A new limit given on resume is the caller's argument, so its error names it, not the snapshot.
    given = {k: v for k, v in overrides.items() if v is not None}
    return attrs.evolve(limits, **given) if given else limits


def earlier_limits_of(data: dict[str, Any]) -> tuple[tuple[int, Limits], ...]:
    """The limits the run ran under before each resume edge, by the edge's index; none if the snapshot kept none."""
    try:
        pairs = data.get("earlier_limits") or ()
        return tuple((_count({"at": at}, "at"), limits_of({"limits": was})) for at, was in pairs)
    except (SnapshotError, TypeError, ValueError) as exc:
        msg = f"snapshot field earlier_limits must list [index of a resume edge, limits] pairs: {exc}"
        raise SnapshotError(msg) from exc


def _count(counters: dict[str, Any], name: str) -> int:
    value = counters.get(name)
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"snapshot field counters.{name} must be a whole number >= 0, got {value!r}"
        raise SnapshotError(msg)
    return value


def _dollars(counters: dict[str, Any]) -> float:
    value = counters.get("cost")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        msg = f"snapshot field counters.cost must be a finite number of US dollars >= 0, got {value!r}"
        raise SnapshotError(msg)
    return float(value)


def _seconds(counters: dict[str, Any]) -> float:
    value = counters.get("elapsed")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value < 0:
        msg = f"snapshot field counters.elapsed must be a finite number of seconds >= 0, got {value!r}"
        raise SnapshotError(msg)
    return float(value)


def _by_tool(counters: dict[str, Any]) -> dict[str, int]:
    value = counters.get("calls_by_tool")
    if not isinstance(value, dict) or not all(isinstance(k, str) for k in value):
        msg = f"snapshot field counters.calls_by_tool must map tool names to counts, got {value!r}"
        raise SnapshotError(msg)
    return {name: _count(value, name) for name in value}


def _call(data: dict[str, Any]) -> ToolCall:
    return _typed(ToolCall(**data), id=str, name=str)


def _items(data: dict[str, Any], name: str, build: Callable[[dict[str, Any]], Any]) -> list[Any]:
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


def _typed(record: T, **kinds: type) -> T:
    """``record``, once each named field holds its kind (a bool is no number); else ``TypeError`` naming the field."""
    for name, kind in kinds.items():
        if not isinstance(value := getattr(record, name), kind) or (kind is int and isinstance(value, bool)):
            msg = f"{name} must be a {kind.__name__}, got {_shown(value)}"
            raise TypeError(msg)
    return record


def _transition(data: dict[str, Any], states: tuple[State, ...]) -> Transition:
    entry = _typed(Transition(**data), trigger=str)
    if entry.source not in states or entry.dest not in states:
        msg = f"{entry.source!r} -> {entry.dest!r} is not an edge between states of this agent's table"
        raise ValueError(msg)
    return entry


_TEXTS = (  # the fields that hold a text or nothing (null, or left out)
    *("run_id", "session_id", "parent_run_id", "parent_call_id", "input_digest"),
    *("reason", "final", "unfinished", "finalizing", "error"),
)


def _check_fields(data: dict[str, Any]) -> None:
    for name in _TEXTS:
        if (value := data.get(name)) is not None and not isinstance(value, str):
            msg = f"snapshot field {name} must be a string or null, got {_shown(value)}"
            raise SnapshotError(msg)
    for name in ("evidence", "finalize_evidence"):
        if not isinstance(value := data.get(name), dict):
            msg = f"snapshot field {name} must be an object, got {_shown(value)}"
            raise SnapshotError(msg)


def message_of(data: dict[str, Any]) -> Message:
    """A stored message (its plain form) as a ``Message``; ``SnapshotError`` if it is not one."""
    try:
        return _message(data)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"snapshot holds a malformed message: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc


def _message(data: dict[str, Any]) -> Message:
    calls = tuple(_call(c) for c in data["tool_calls"])
    # Snapshots written before provider_data existed have no such key: nothing opaque to send back.
    message = Message(data["role"], data["content"], calls, data["tool_call_id"], data.get("provider_data"))
    return _typed(message, role=str, content=str, **({} if message.tool_call_id is None else {"tool_call_id": str}))


def _response(data: dict[str, Any] | None) -> ModelResponse | None:
    if data is None:
        return None
    usage = None if data["usage"] is None else Usage(**data["usage"])
    return ModelResponse(_message(data["message"]), data["stop_reason"], usage)


def load(run: Run, data: dict[str, Any], states: tuple[State, ...]) -> None:
    """Put a fresh run where the snapshot says, after checking every field and that they agree."""
    state = data.get("state")
    if state not in states:
        msg = f"snapshot state {state!r} is not a state of this agent's table ({', '.join(states)})"
        raise SnapshotError(msg)
    counters = data.get("counters")
    if not isinstance(counters, dict):
        msg = f"snapshot field counters must be an object, got {type(counters).__name__}"
        raise SnapshotError(msg)
    run.counts.turns, run.counts.failures, run.counts.tool_calls = (
        _count(counters, n) for n in ("turns", "failures", "tool_calls")
    )
    run.counts.input_tokens, run.counts.output_tokens = (_count(counters, n) for n in ("input_tokens", "output_tokens"))
    parts = {"cache_read_tokens": 0, "cache_write_tokens": 0, "reasoning_tokens": 0, **counters}  # none before kept
    run.counts.cache_read_tokens, run.counts.cache_write_tokens, run.counts.reasoning_tokens = (
        _count(parts, n) for n in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
    )
    # A snapshot from before runs were priced has none of these: nothing priced, nothing known unpriced.
    priced = {"cost": 0.0, "priced": 0, "unpriced": 0, **counters}
    run.counts.cost = _dollars(priced)
    run.counts.priced, run.counts.unpriced = (_count(priced, n) for n in ("priced", "unpriced"))
    run.counts.calls_by_tool = _by_tool(counters)
    run.counts.elapsed = _seconds(counters)
    run.talk.sent = _count({"sent": 0, **counters}, "sent")  # a snapshot from before history processors has none
    _check_fields(data)
    run.at.state = State(state)
    run.talk.messages[:] = _items(data, "messages", _message)
    run.talk.steps[:] = _items(data, "steps", lambda s: _typed(Step(**s), index=int, kind=str, detail=str))
    run.at.trace[:] = _items(data, "trace", lambda t: _transition(t, states))
    run.at.earlier_limits = earlier_limits_of(data)
    run.talk.io[:] = _items({"io": [], **data}, "io", exchange_of)
    run.calls.pending = deque(_items(data, "pending", _call))
    run.at.evidence, run.at.finalize_evidence = dict(data["evidence"]), dict(data["finalize_evidence"])
    try:
        run.calls.ran = {str(k): _result(v) for k, v in data["ran"].items()}
        run.calls.cut_children = spends(data.get("cut_children", {}), "cut_children")  # none kept before it existed
        run.calls.approvals = dict(data["approvals"])
        run.calls.carried = [(str(n), str(a), _result(r)) for n, a, r in data.get("carried") or ()]  # a fork's only
        run.calls.carried_down = [
            (str(n), str(a), [(str(cn), str(ca), _result(cr)) for cn, ca, cr in outcomes])
            for n, a, outcomes in data.get("carried_down") or ()
        ]
        run.calls.to_approve = _to_approve(data, run)
        run.talk.last_response = _response(data["last_response"])
        signature = counters["last_signature"]
        run.counts.last_signature = None if signature is None else (str(signature[0]), str(signature[1]))
        run.talk.last_error = counters["last_error"]
        run.counts.recent.clear()
        run.counts.recent.extend(((str(n), str(a)), str(r)) for n, a, r in counters["recent"])
        frozen = data["frozen"]
        run.at.frozen = frozen is not None
        run.counts.cancelled = bool(frozen and frozen["cancelled"])
        run.at.finalizing = data["finalizing"]
        run.at.reason = data["reason"]
        run.at.final = data["final"]
        run.at.unfinished = data["unfinished"]
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        msg = f"snapshot is malformed: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc
    if data.get("error") is not None:
        run.faults.model_exception = RuntimeError(data["error"])
    run.talk.prior = _prior(data, len(run.talk.messages))
    _load_compaction(run, data.get("compaction"))
    # Each answer sent back is one output_invalid edge of the trace: the count needs no field of its own.
    run.counts.output_retries = sum(1 for entry in run.at.trace if entry.guard == "output_invalid")
    problems = contradictions(run)
    if problems:
        msg = "snapshot contradicts itself: " + "; ".join(problems)
        raise SnapshotError(msg)


def _result(data: dict[str, Any]) -> ToolResult:
    """A kept tool outcome from its plain form (a sub-agent's outcome with it)."""
    return ToolResult(**{**data, "child": child_outcome(data.get("child"))})


def _load_compaction(run: Run, data: Any) -> None:
    """Restore a compacted history; a snapshot from before compaction has none."""
    if data is None:
        return
    try:
        head = [_message(m) for m in data["head"]]
        start, turn, due, error = data["start"], data["turn"], data["due"], data["error"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = f"snapshot field compaction is malformed: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc
    if not (isinstance(start, int) and 0 <= start <= len(run.talk.messages) and isinstance(turn, int)):
        msg = f"snapshot field compaction has start {start!r} and turn {turn!r}, outside the run's messages and turns"
        raise SnapshotError(msg)
    run.talk.context_head, run.talk.context_start, run.counts.compacted_turn = head, start, turn
    run.talk.compacting, run.talk.compact_error = bool(due), str(error)


def _prior(data: dict[str, Any], messages: int) -> int:
    """How many leading messages came before the run; a snapshot from before histories has none (0: all are its own)."""
    value = data.get("prior", 0)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= messages:
        msg = f"snapshot field prior must be a whole number from 0 to the {messages} messages, got {value!r}"
        raise SnapshotError(msg)
    return value


def _to_approve(data: dict[str, Any], run: Run) -> set[str]:
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
