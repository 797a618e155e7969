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

from collections import deque
from typing import Any

import attrs

from fsm_agent.core import snapshot_fields as fields
from fsm_agent.core.consistency import contradictions
from fsm_agent.core.exchanges import exchange_of
from fsm_agent.core.hand_down import below_problem, down_problem
from fsm_agent.core.snapshot_migrations import MIGRATIONS
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import AwaitModel, Failed, State
from fsm_agent.definition.table import SENDS_BACK
from fsm_agent.definition.triggers import REPLIED
from fsm_agent.errors import SnapshotError
from fsm_agent.jsontext import versioned
from fsm_agent.records import ChildOutcome, Message, plain

__all__ = ["GROWING", "ONCE", "SNAPSHOT_FORMAT", "SNAPSHOT_VERSION", "SnapshotError", "dump", "load", "parse"]

SNAPSHOT_FORMAT = "fsm_agent.Snapshot"
SNAPSHOT_VERSION = 2


GROWING = ("messages", "steps", "trace", "io")
"""The snapshot's lists that only ever grow while a run goes on: a store's journal keeps just their new items.

``io`` (what each call was sent and gave back, ``core.exchanges``) came later within version 2: a snapshot
without it loads with none.
"""
ONCE = ("prior",)
"""The snapshot's fields written whole only (they never change while a run goes on): in ``dump``, not ``dump_small``."""


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
        "cut_counted": {call_id: plain(spent) for call_id, spent in run.calls.cut_counted.items()},
        "cut_shares": [[at, call_id, plain(share)] for at, call_id, share in run.calls.cut_shares],
        "cuts_taken_back": list(run.calls.cuts_taken_back),
        "approvals": dict(run.calls.approvals),
        "carried": [[name, arguments, plain(result)] for name, arguments, result in run.calls.carried],
        "carried_down": [
            [name, arguments, [[n, a, plain(r)] for n, a, r in outcomes]]
            for name, arguments, outcomes in run.calls.carried_down
        ],
        # Handed outcomes a cut counted; written empty too: a field gone absent costs the journal a whole write.
        "prepaid": sorted(run.calls.prepaid),
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
        "output": run.talk.output_plain,
        "evidence": run.at.evidence,
        "unfinished": run.at.unfinished,
        # A reply taken and not yet stepped; a failure taken so is not kept (its exception would come back as text).
        "replied": run.at.replied if run.at.replied == REPLIED else None,
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
        return tuple((fields.count({"at": at}, "at"), limits_of({"limits": was})) for at, was in pairs)
    except (SnapshotError, TypeError, ValueError) as exc:
        msg = f"snapshot field earlier_limits must list [index of a resume edge, limits] pairs: {exc}"
        raise SnapshotError(msg) from exc


def cut_shares_of(data: dict[str, Any]) -> list[tuple[int, str, ChildOutcome]]:
    """Each cut's share of a sub-agent call, where it was counted (``Calls.cut_shares``); none if none was kept."""
    shares = data.get("cut_shares", [])
    if not isinstance(shares, list) or not all(isinstance(s, list) and len(s) == 3 for s in shares):
        msg = f"snapshot field cut_shares must list [transitions before it, call id, share] triples, got {shares!r:.80}"
        raise SnapshotError(msg)
    kept = []
    for n, (at, call_id, share) in enumerate(shares):
        where = f"snapshot field cut_shares[{n}]"
        if type(at) is not int or at < 0 or not isinstance(call_id, str) or not isinstance(share, dict):
            msg = f"{where} must be [transitions before it (>= 0), call id, share], got {[at, call_id, share]!r:.80}"
            raise SnapshotError(msg)
        try:
            kept.append((at, call_id, fields.spend(share, where)))
        except TypeError as exc:  # a share with fields no spend has
            raise SnapshotError(f"{where}: {exc}") from exc
    return kept


def cuts_taken_back_of(data: dict[str, Any]) -> list[int]:
    """Where a fork took back what cuts counted of its unanswered calls (``Calls.cuts_taken_back``); none if none."""
    points = data.get("cuts_taken_back", [])
    if not isinstance(points, list) or not all(type(at) is int and at >= 0 for at in points):
        msg = f"snapshot field cuts_taken_back must list numbers of transitions (>= 0), got {points!r:.80}"
        raise SnapshotError(msg)
    return list(points)


def message_of(data: dict[str, Any]) -> Message:
    """A stored message (its plain form) as a ``Message``; ``SnapshotError`` if it is not one."""
    try:
        return fields.message(data)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"snapshot holds a malformed message: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc


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
        fields.count(counters, n) for n in ("turns", "failures", "tool_calls")
    )
    run.counts.input_tokens, run.counts.output_tokens = (
        fields.count(counters, n) for n in ("input_tokens", "output_tokens")
    )
    parts = {"cache_read_tokens": 0, "cache_write_tokens": 0, "reasoning_tokens": 0, **counters}  # none before kept
    run.counts.cache_read_tokens, run.counts.cache_write_tokens, run.counts.reasoning_tokens = (
        fields.count(parts, n) for n in ("cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
    )
    # A snapshot from before runs were priced has none of these: nothing priced, nothing known unpriced.
    priced = {"cost": 0.0, "priced": 0, "unpriced": 0, **counters}
    run.counts.cost = fields.dollars(priced)
    run.counts.priced, run.counts.unpriced = (fields.count(priced, n) for n in ("priced", "unpriced"))
    run.counts.calls_by_tool = fields.calls_by_tool(counters)
    run.counts.elapsed = fields.seconds(counters)
    run.talk.sent = fields.count({"sent": 0, **counters}, "sent")  # a snapshot from before history processors has none
    fields.check_texts(data)
    run.at.state = State(state)
    run.talk.messages[:] = fields.items(data, "messages", fields.message)
    run.talk.steps[:] = fields.items(data, "steps", fields.step)
    run.at.trace[:] = fields.items(data, "trace", lambda t: fields.transition(t, states))
    run.at.earlier_limits = earlier_limits_of(data)
    run.talk.io[:] = fields.items({"io": [], **data}, "io", exchange_of)
    run.calls.pending = deque(fields.items(data, "pending", fields.tool_call))
    run.at.evidence, run.at.finalize_evidence = dict(data["evidence"]), dict(data["finalize_evidence"])
    try:
        run.calls.ran = {str(k): fields.result(v) for k, v in data["ran"].items()}
        cut = data.get("cut_children", {})  # none kept before it existed
        run.calls.cut_children = fields.cut_children(cut, "snapshot field cut_children")
        counted = data.get("cut_counted", {})  # none kept before it existed
        run.calls.cut_counted = fields.cut_children(counted, "snapshot field cut_counted")
        run.calls.cut_shares = cut_shares_of(data)
        run.calls.cuts_taken_back = cuts_taken_back_of(data)
        run.calls.approvals = dict(data["approvals"])
        carried = data.get("carried") or ()  # a fork's only
        run.calls.carried = [(str(n), str(a), fields.result(r)) for n, a, r in carried]
        run.calls.carried_down = [
            (str(n), str(a), [(str(cn), str(ca), fields.result(cr)) for cn, ca, cr in outcomes])
            for n, a, outcomes in data.get("carried_down") or ()
        ]
        _check_below(run)
        run.calls.prepaid = fields.names(data, "prepaid")
        run.calls.to_approve = fields.to_approve(data, run)
        run.talk.last_response = fields.response(data["last_response"])
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
        run.talk.output_plain = data.get("output")  # a typed answer's value; none kept before it existed
        run.at.unfinished = data["unfinished"]
        run.at.replied = _replied(data.get("replied"), run.at.state)  # none kept before it existed
    except SnapshotError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        msg = f"snapshot is malformed: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc
    if data.get("error") is not None:
        run.faults.model_exception = RuntimeError(data["error"])
    run.talk.prior = fields.prior(data, len(run.talk.messages))
    _load_compaction(run, data.get("compaction"))
    # Each answer sent back is one edge of the trace that sends it (Row.asks_again): the count needs no field.
    run.counts.output_retries = sum(1 for entry in run.at.trace if entry.guard in SENDS_BACK)
    if run.at.state is Failed and run.at.reason == "output_invalid":
        # Why the answer was not taken, as its stop's evidence keeps it: a resume that lifts the stop which forbade
        # its retry sends it back (resumes_output_retry).
        evidence = run.at.evidence
        run.talk.output_problem = (tuple(evidence.get("errors", ())), evidence.get("retryable", True))
    problems = contradictions(run)
    if problems:
        msg = "snapshot contradicts itself: " + "; ".join(problems)
        raise SnapshotError(msg)


def _replied(value: object, state: State) -> str | None:
    """The reply a snapshot holds taken and not yet stepped (kept before its ``after_model`` hooks), or None."""
    if value is None:
        return None
    if value != REPLIED or state is not AwaitModel:
        msg = f"snapshot field replied must be null, or {REPLIED!r} in AwaitModel, not {value!r}"
        raise SnapshotError(msg)
    return REPLIED


def _check_below(run: Run) -> None:
    """Each entry carried down names its call as ``hand_down`` writes it, and each outcome for a sub-agent's
    sub-agent is kept as ``core.hand_down.below`` writes it."""
    for index, (_, arguments, outcomes) in enumerate(run.calls.carried_down):
        problem = down_problem(arguments)
        if problem is not None:
            msg = f"snapshot field carried_down[{index}][1]: {problem}"
            raise SnapshotError(msg)
        for inner, (_, arguments, _) in enumerate(outcomes):
            problem = below_problem(arguments)
            if problem is not None:
                msg = f"snapshot field carried_down[{index}][2][{inner}]: {problem}"
                raise SnapshotError(msg)


def _load_compaction(run: Run, data: Any) -> None:
    """Restore a compacted history; a snapshot from before compaction has none."""
    if data is None:
        return
    try:
        head = [fields.message(m) for m in data["head"]]
        start, turn, due, error = data["start"], data["turn"], data["due"], data["error"]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        msg = f"snapshot field compaction is malformed: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc
    if not (isinstance(start, int) and 0 <= start <= len(run.talk.messages) and isinstance(turn, int)):
        msg = f"snapshot field compaction has start {start!r} and turn {turn!r}, outside the run's messages and turns"
        raise SnapshotError(msg)
    run.talk.context_head, run.talk.context_start, run.counts.compacted_turn = head, start, turn
    run.talk.compacting, run.talk.compact_error = bool(due), str(error)
