"""A session's turns in a store: the conversation read back, a turn whose owner died taken over, others refused.

``Session`` (``drivers.session``) takes turns; this half is how it agrees
with the store and with other owners of the same conversation, so the
turn-taking reads without the bookkeeping of who holds which turn.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from fsm_agent.core.approval import describe_decision, same_decision
from fsm_agent.core.ledger import error_text
from fsm_agent.core.output import NOT_ACCEPTED
from fsm_agent.core.snapshot import message_of
from fsm_agent.core.snapshot_fields import ended_on
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.session_owners import version_of
from fsm_agent.drivers.session_requests import (
    RequestAnswers,
    answer_of,
    asked_in,
    earlier_turn,
    refuse_another_question,
)
from fsm_agent.drivers.stored import awaited
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import DecisionError, RunLeasedError, RunStateError, StaleRunError, TurnLeasedError
from fsm_agent.records import Message, RunResult, ToolCall

if TYPE_CHECKING:
    from fsm_agent.core.cancellation import CancelToken
    from fsm_agent.persist.summary import StoredRun

_TERMINAL = ("Done", "Failed")
_LISTINGS = 3
"""How often the last turn is listed again when it is gone by the time it is read (a cut owner deleted it)."""


class StoredTurns(RequestAnswers):
    """The half of a ``Session`` that reads its turns from the store and decides who may take the next one."""

    _messages: list[Message]
    _last: RunResult | None
    _paused: str | None
    _repeated: dict[str, Any] | None = None
    """The turn the request asking for a turn took already, as stored (``request_id``): the last one, or earlier."""

    def _same_question(self, request: str | None, text: str) -> None:
        """A ``ValueError`` if the stored last turn ``request`` took (``_repeated``) asked another question."""
        if request is not None and self._repeated is not None:
            refuse_another_question(self.session_id, request, asked_in(self._repeated), text)

    def _busy(self, n: int, holder: str | None = None, until: float | None = None) -> RunLeasedError:
        """Turn ``n`` is being taken elsewhere: its conversation is not one to build on yet."""
        if until is None:
            from fsm_agent.persist.store import journaled, traits

            store = self.store  # a store of whole snapshots leases nothing
            until = time.time() + (traits(store).lease if store is not None and journaled(store) else 0.0)
        return TurnLeasedError(self.turn_id(n), holder or "another owner", until)

    def _held(self, refused: RunLeasedError) -> RunLeasedError:
        """A resume of the last turn refused by its live owner, told as a turn asked for then is (``_busy``)."""
        if isinstance(refused, StaleRunError) or refused.stale or refused.run_id != self.turn_id(self._turns):
            return refused
        return self._busy(self._turns, refused.holder, refused.until)

    def _take_over(
        self, n: int, data: dict[str, Any], cancel: CancelToken | None, observers: Sequence[Observer], deps: Any
    ) -> AgentRun | None:
        """Turn ``n``, unfinished in the store, claimed to be finished here: its owner died and its lease lapsed.

        It is resumed from its last checkpoint like any ``Agent.resume``, so
        no completed call is made again (only the call in flight when its
        owner died, whose outcome was never stored).  While its owner's lease
        is live it is a ``RunLeasedError`` naming that owner; None if the
        turn moved on since ``data`` was read (read it again).  A store
        without leases cannot tell a dead owner from a live one: there the
        turn is always refused.  ``deps`` are the turn's new owner's.
        """
        from fsm_agent.persist.store import JournaledStore  # as stored.store_for: import fsm_agent loads no store

        if not isinstance(self.store, JournaledStore):
            raise self._busy(n)
        try:
            run = self.agent.resume(data, store=self.store, cancel=cancel, observers=observers, deps=deps)
        except StaleRunError:
            return None  # its owner wrote it meanwhile, or another object took it over first
        except RunLeasedError as exc:
            raise self._busy(n, exc.holder, exc.until) from None
        self._turns = n - 1  # taken in again when it ends
        return run

    async def _atake_over(
        self, n: int, data: dict[str, Any], cancel: CancelToken | None, observers: Sequence[Observer], deps: Any
    ) -> AgentRun | None:
        """``_take_over``, awaited: the claim is ``Agent.aresume``'s."""
        from fsm_agent.persist.store import JournaledStore

        if not isinstance(self.store, JournaledStore):
            raise self._busy(n)
        try:
            run = await self.agent.aresume(data, store=self.store, cancel=cancel, observers=observers, deps=deps)
        except StaleRunError:
            return None  # its owner wrote it meanwhile, or another object took it over first
        except RunLeasedError as exc:
            raise self._busy(n, exc.holder, exc.until) from None
        self._turns = n - 1  # taken in again when it ends
        return run

    def _check_ours(self, n: int) -> None:
        """Turn ``n``'s id is taken in the store: by another object's turn of this session, or a ``RunStateError``.

        A run there that is no turn of this session (stored without one, or
        by another session) would refuse turn ``n`` for ever.
        """
        store: Any = self.store
        try:
            owner = store.load(self.turn_id(n)).get("session_id")
        except KeyError:
            return  # deleted meanwhile: try again
        self._ours(n, owner)

    async def _acheck_ours(self, n: int) -> None:
        """``_check_ours``, awaited."""
        store: Any = self.store
        try:
            owner = (await awaited(store, "load", self.turn_id(n))).get("session_id")
        except KeyError:
            return  # deleted meanwhile: try again
        self._ours(n, owner)

    def _ours(self, n: int, owner: object) -> None:
        """Nothing if turn ``n``'s stored run is of this session (stored by ``owner``), else a ``RunStateError``."""
        if owner == self.session_id:
            return
        run_id = self.turn_id(n)
        whose = "it is of no session" if not owner else f"it is of session {owner!r}"
        msg = (
            f"run {run_id!r} in the store is not a turn of session {self.session_id!r} ({whose}), "
            f"so turn {n} cannot be stored under its id: delete or rename that run, or use another session_id"
        )
        raise RunStateError(msg)

    def _catch_up(self, *, strict: bool = True, request: str | None = None) -> tuple[int, dict[str, Any]] | None:
        """Read the conversation from the store: the turns any process took, the last one whole.

        ``strict``: a last turn that is paused is refused, as the base of a
        new turn, and one still going is returned (its number and snapshot),
        to be taken over or refused.  A last turn ``request`` took already
        is kept in ``_repeated`` instead (see ``_caught_up``).
        """
        store: Any = self.store
        for _ in range(_LISTINGS):
            last = self._last_turn(store.list_runs(session=self.session_id))
            try:
                data = None if last is None else store.load(self.turn_id(last))
                break
            except KeyError:  # listed, then deleted: a cut owner dropped the turn it had just begun
                continue
        else:
            raise self._vanishing(last)
        earlier = earlier_turn(data, request)
        if earlier is None:
            return self._caught_up(last, data, strict, request)
        try:
            found = store.load(self.turn_id(earlier))
        except KeyError:
            found = None
        return self._caught_up(last, data, strict, request, answer_of(self.session_id, request or "", earlier, found))

    async def _acatch_up(self, *, strict: bool = True, request: str | None = None) -> tuple[int, dict[str, Any]] | None:
        """``_catch_up``, awaited: the store's ``alist_runs`` and ``aload``."""
        store: Any = self.store
        for _ in range(_LISTINGS):
            last = self._last_turn(await awaited(store, "list_runs", session=self.session_id))
            try:
                data = None if last is None else await awaited(store, "load", self.turn_id(last))
                break
            except KeyError:  # listed, then deleted: a cut owner dropped the turn it had just begun
                continue
        else:
            raise self._vanishing(last)
        earlier = earlier_turn(data, request)
        if earlier is None:
            return self._caught_up(last, data, strict, request)
        try:
            found = await awaited(store, "load", self.turn_id(earlier))
        except KeyError:
            found = None
        return self._caught_up(last, data, strict, request, answer_of(self.session_id, request or "", earlier, found))

    def _vanishing(self, last: int | None) -> RunStateError:
        """The store listed the last turn and then had no run by its id, ``_LISTINGS`` times in a row."""
        msg = (
            f"the store lists turn {last} of session {self.session_id!r} but holds no run {self.turn_id(last or 0)!r}, "
            f"{_LISTINGS} times in a row: its listing and its runs disagree"
        )
        return RunStateError(msg)

    def _last_turn(self, runs: Sequence[StoredRun]) -> int | None:
        """The number of the session's last stored turn among ``runs`` (its listing); None before its first."""
        prefix = self.turn_id(0)[:-1]
        numbers = [
            int(tail) for run in runs if run.run_id.startswith(prefix) and (tail := run.run_id[len(prefix) :]).isdigit()
        ]
        return max(numbers, default=None)

    def _caught_up(
        self,
        last: int | None,
        data: dict[str, Any] | None,
        strict: bool,
        request: str | None = None,
        answer: dict[str, Any] | None = None,
    ) -> tuple[int, dict[str, Any]] | None:
        """``_catch_up``'s reading of the last turn ``last``, stored as ``data`` (None: no turn yet).

        A last turn taken for ``request`` (its stored ``request_id``) is that
        request's answer, kept in ``_repeated`` and never refused as paused;
        unless it was cancelled, which answered nobody (see ``Session.run``).
        So is an earlier turn that took it, ``answer`` (read by the number
        ``data`` carries, ``session_requests``), whatever the last turn is:
        paused, or unfinished, it is neither refused nor taken over.
        """
        self._paused = None
        self._repeated = answer
        if last is None or data is None:
            self._turns, self._messages, self._base, self._carry = 0, [], None, ({}, None)
            return None
        self._turns, self._base = last, (last, version_of(data))
        self._carried_by(data)
        if request is not None and data.get("request_id") == request and ended_on(data) != "cancelled":
            self._repeated = data
        messages = [message_of(m) for m in data["messages"]]
        pending = [ToolCall(**call) for call in data.get("pending") or ()]
        if data.get("paused"):
            decided, held = data.get("approvals") or {}, set(data.get("to_approve") or ())
            waiting = [(c.name, c.id) for c in pending if c.id in held and c.id not in decided]
            self._paused = paused_message(self.session_id, last, waiting)
            self._messages = [m for m in messages if m.role != "system"]
            if strict and self._repeated is None:
                raise RunStateError(self._paused)
            return None
        reason = data.get("reason") or "stopped"
        self._messages = closed(
            messages, reason, cut_of(data), kept_of(data), rejected_of(reason, data.get("evidence"))
        )
        if data["state"] not in _TERMINAL and strict and answer is None:
            return last, data
        return None


def session_id_of(session_id: object) -> str:
    """``session_id`` as a session keeps it: a fresh id for None, else an id its turns' run ids are built on.

    Checked as a run id is, but named by its own name: an empty one (an
    unset environment variable, say) is no conversation to continue, and a
    fresh id would start another user's conversation anew.
    """
    if session_id is None:
        return uuid.uuid4().hex
    if not isinstance(session_id, str):
        msg = f"session_id must be a str, got {type(session_id).__name__}"
        raise TypeError(msg)
    if not session_id:
        msg = "session_id must not be empty: leave it out (or None) for a new conversation, or name the one to continue"
        raise ValueError(msg)
    from fsm_agent.persist.store import check_run_id  # as stored.store_for: import fsm_agent loads no store

    try:
        return check_run_id(session_id)
    except ValueError as exc:
        msg = f"session_id {session_id[:40]!r} cannot name a conversation's stored turns: {exc}"
        raise ValueError(msg) from None


def paused_message(session: str, n: int, waiting: list[tuple[str, str]]) -> str:
    """Why a paused turn refuses the next: the calls ``waiting`` for a decision, or none left (decided elsewhere)."""
    if not waiting:
        return f"turn {n} of session {session!r} is paused, its calls decided: resume it (Session.resume) first"
    calls = ", ".join(f"{name} ({call_id})" for name, call_id in waiting)
    return f"turn {n} of session {session!r} is paused for a decision on {calls}: resume it (Session.resume) first"


def closed(
    messages: Sequence[Message],
    reason: str,
    cut: object = None,
    came_back: Mapping[str, str] | None = None,
    rejected: Sequence[str] | None = None,
) -> list[Message]:
    """A turn's messages without the system prompt, each call it asked for and never made answered as not run.

    Those are the calls of its last assistant message that no tool message
    after it answers.  Call ids are the model's and may repeat across turns
    (many providers count from ``call_0`` in every request), so an answer
    earlier in the conversation never stands for one of them.  A call the
    stop cut off while it ran (``cut``, the stop's ``unfinished``: a cancel
    or a deadline) is answered as such (``cut_text``), never as not
    run: it may have had its effect (a sync tool goes on in its thread).  A
    call of a parallel batch that came back while another was cut (the
    stop's ``came_back``: its outcome kept for a resume, ``came_back`` maps
    its id to its tool message) is answered with its outcome: it ran.
    A turn that stopped on its typed answer (``rejected``: the errors of
    its check), which is its last message, ends with the message that tells
    the model so, as a retry would have begun: a later turn must not read
    the answer as accepted.
    """
    kept = [m for m in messages if m.role != "system"]
    if rejected is not None and kept and kept[-1].role == "assistant" and not kept[-1].tool_calls:
        kept.append(Message("user", NOT_ACCEPTED.format(errors="\n".join(f"- {error}" for error in rejected))))
        return kept
    asked = next((i for i in range(len(kept) - 1, -1, -1) if kept[i].role == "assistant"), None)
    if asked is None:
        return kept
    answered = {m.tool_call_id for m in kept[asked + 1 :] if m.role == "tool"}
    why = error_text(f"not executed: the turn stopped ({reason}) before this call")
    in_flight = cut_calls(cut)
    outcomes = came_back or {}
    for call in kept[asked].tool_calls:
        if call.id not in answered:
            answered.add(call.id)
            text = cut_text(reason) if call.id in in_flight else why
            kept.append(Message("tool", outcomes.get(call.id, text), tool_call_id=call.id))
    return kept


def rejected_of(reason: object, evidence: object) -> list[str] | None:
    """The errors of the typed answer a turn stopped on (``output_invalid``), else None: not a rejected answer."""
    if reason != "output_invalid" or not isinstance(evidence, Mapping):
        return None
    errors = evidence.get("errors")
    return [str(error) for error in errors] if isinstance(errors, list) else []


def kept_of(snapshot: Mapping[str, Any] | None) -> dict[str, str]:
    """The tool messages of the calls a stored turn ran and kept unrecorded (its snapshot's ``ran``), by call id.

    A stop that cut a parallel batch keeps the outcomes of the calls after
    the cut one that came back (``came_back``); a resume would take them in.
    """
    ran = snapshot.get("ran") if snapshot is not None else None
    if not isinstance(ran, Mapping):
        return {}
    return {
        str(call_id): outcome["content"]
        for call_id, outcome in ran.items()
        if isinstance(outcome, Mapping) and isinstance(outcome.get("content"), str)
    }


def cut_calls(unfinished: object) -> frozenset[str]:
    """The tool call ids a stop's ``unfinished`` names: the calls a cancel or a deadline cut off while they ran.

    The drivers name one call, or the calls of a batch in flight joined by
    ``", "``; a cut model call (``"model call of turn N"``) names no tool call.
    """
    if not isinstance(unfinished, str) or not unfinished:
        return frozenset()
    return frozenset({unfinished, *unfinished.split(", ")})


_MAY_HAVE_RUN = "it may have run; its outcome is unknown"


def cut_text(reason: str) -> str:
    """The tool message of a call cut off while it ran: it may have had its effect, so it is never told as not run.

    A sync tool cut by a cancel or a deadline goes on in its worker thread
    (Python cannot stop a thread), and an async one may have acted before its
    task was cancelled: whether it did is unknown.
    """
    return error_text(f"cut off while running ({reason}): {_MAY_HAVE_RUN}")


def refuse_cut_decisions(turn: str, source: object, approvals: Mapping[str, bool | str] | None) -> None:
    """A ``ValueError`` if ``approvals`` decide on a call the stop of the turn ``source`` cut while it ran.

    Why: such a call was acted on (a decision let it start, or it needed
    none), and a decision given again, say an answer a client sends twice,
    must not resume the turn to make it again: it may have had its effect.
    The error names the decision that stood.  ``source`` is the turn's
    snapshot or ``RunResult``; a turn that did not stop passes.
    """
    data = getattr(source, "snapshot", source)
    if not approvals or not isinstance(data, dict) or data.get("state") != "Failed":
        return
    cut = [call_id for call_id in approvals if call_id in cut_calls(cut_of(data))]
    if not cut:
        return
    reason, stood = data.get("reason") or "stopped", data.get("approvals") or {}
    said = []
    for call_id in cut:
        kept = stood.get(call_id)
        done = "started (it needed no decision)" if kept is None else f"{describe_decision(kept)} and started"
        told = f"tool call {call_id!r} was already {done}, then cut off while running ({reason}): {_MAY_HAVE_RUN}"
        if kept is not None and not same_decision(kept, approvals[call_id]):
            told += f", and a decision holds: this one ({describe_decision(approvals[call_id])}) was not taken"
        said.append(told)
    raise DecisionError(turn, cut[0], f"run {turn!r} stopped ({reason}); a decision comes too late: {'; '.join(said)}")


def cut_of(data: dict[str, Any]) -> object:
    """The calls a stored turn's stop cut off while they ran: its ``unfinished`` (also in its evidence), if any."""
    evidence = data.get("evidence")
    return data.get("unfinished") or (evidence.get("unfinished") if isinstance(evidence, dict) else None)
