"""A session's request ids: the turn each request took, so the same request sent again is answered from it.

``Session.run(text, request_id=...)`` keeps the request's id with the turn
it takes.  Sent again, by a retried web handler or by an owner whose turn
another took over, it is answered from that turn whichever turn it was,
however many turns the session took since: nothing is called, no turn is
taken.  Why carried from turn to turn: each stored turn holds the request
ids of the turns before it by turn number (its snapshot's
``request_turns``), so the session finds the turn in the last one, which it
reads anyway, and loads that turn alone: one read more, never a scan of the
turns.  A session without a store keeps its answers in memory, as many.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent.core.snapshot_fields import ended_on, request_turns
from fsm_agent.drivers.session_owners import LastTurnOwners, carry_requests
from fsm_agent.errors import AgentLoopError, RunStateError
from fsm_agent.records import RunResult

if TYPE_CHECKING:
    from fsm_agent.drivers.agent_run import AgentRun

REQUESTS_KEPT = 1000
"""How many request ids a turn carries (the latest turns'), and a store-less session keeps answers for.

Why a bound: every turn's snapshot holds them.  A retry comes within
minutes, not a thousand turns later; a request id older than that is known
no more, and sent again it takes a new turn, as a request never seen does.
"""


class RequestAnswers(LastTurnOwners):
    """The half of a ``Session`` that answers a request sent again from the turn it took."""

    _last_request: tuple[str, str] | None
    """The request id and text of the turn being taken or just taken (None: it came without one)."""
    _answers: dict[str, tuple[str, RunResult]]
    """A store-less session's answers by request id: the question each asked and its result, in turn order."""
    _carry: tuple[Mapping[str, int], str | None]
    """What the next stored turn carries: the last turn's ``request_turns``, and its request if it answered it."""

    def _answered_here(self, request: str | None, text: str) -> RunResult | None:
        """The result a store-less session's turn gave ``request`` (none: it took none, or was cancelled).

        One taken for it that asked another question than ``text`` is a ``ValueError``: it is another request.
        """
        found = None if request is None else self._answers.get(request)
        if found is None:
            return None
        refuse_another_question(self.session_id, request or "", found[0], text)
        return found[1]

    def _keep_answer(self, result: RunResult | None) -> None:
        """A store-less turn's ``result`` kept as its request's answer; None (a turn cut unfinished): forgotten.

        A cancelled turn answered nobody: its request takes a new turn.
        """
        if self._last_request is None:
            return
        request, text = self._last_request
        self._answers.pop(request, None)
        if result is not None and ended_on(result.snapshot) != "cancelled":
            self._answers[request] = (text, result)
            while len(self._answers) > REQUESTS_KEPT:
                del self._answers[next(iter(self._answers))]

    def _again(self, result: RunResult | None) -> RunResult:
        """The answer of the turn the request took already, as it was given: a stop its policy raised, raised again."""
        assert result is not None  # _answered_here and _repeated say there is one
        snapshot = result.snapshot
        stopped = snapshot is not None and snapshot.get("state") == "Failed"
        if stopped and self.agent.on_stop.get(result.reason, "raise") != "return":
            raise AgentLoopError(result.reason, result)
        return result

    def _carried_by(self, data: Mapping[str, Any]) -> None:
        """What the turn after the stored turn ``data`` carries: its ``request_turns``, and its request if answered."""
        asked = data.get("request_id")
        answered = isinstance(asked, str) and ended_on(data) != "cancelled"
        self._carry = (request_turns(dict(data)), asked if answered else None)

    def _went_on_from(self, taken: RunResult) -> None:
        """The turn taken over ended ``taken``: cancelled, it answered nobody, so the next turn carries no request."""
        if ended_on(taken.snapshot) == "cancelled":
            self._carry = (self._carry[0], None)

    def _carry_on(self, run: AgentRun) -> None:
        """The next turn, ``run`` (not stored yet), made to carry the request ids of every turn before it."""
        known, asked = self._carry
        carried = dict(known)
        if asked is not None:
            carried[asked] = self._turns
        if len(carried) > REQUESTS_KEPT:
            carried = dict(sorted(carried.items(), key=lambda item: item[1])[-REQUESTS_KEPT:])
        carry_requests(run, carried)


def earlier_turn(data: Mapping[str, Any] | None, request: str | None) -> int | None:
    """The number of the earlier turn that took ``request``, as the last turn (stored as ``data``) names it."""
    if request is None or data is None or data.get("request_id") == request:
        return None
    return request_turns(dict(data)).get(request)


def answer_of(session: str, request: str, n: int, data: dict[str, Any] | None) -> dict[str, Any]:
    """Turn ``n`` as stored (``data``; None: not found), the answer to ``request``; else a ``RunStateError``.

    Why refused rather than a new turn: the request was answered once, and
    a new turn would make its calls again; the store lost that answer (the
    turn was deleted, or replaced by a run that is no such turn).
    """
    if data is not None and data.get("request_id") == request and data.get("session_id") == session:
        return data
    msg = (
        f"request_id {request!r} took turn {n} of session {session!r}, which the store no longer holds (deleted or"
        " replaced): nothing was called; the same request is not asked again, so give a new one a request_id of its own"
    )
    raise RunStateError(msg)


def asked_in(data: Mapping[str, Any]) -> str | None:
    """The question a stored turn asked: its first message after those it started from (``prior``), if a user's."""
    messages, prior = data.get("messages") or [], data.get("prior") or 0
    first = messages[prior] if isinstance(prior, int) and 0 <= prior < len(messages) else None
    asked = first.get("content") if isinstance(first, dict) and first.get("role") == "user" else None
    return asked if isinstance(asked, str) else None


def refuse_another_question(session: str, request: str, asked: str | None, text: str) -> None:
    """A ``ValueError`` if the turn ``request`` took asked ``asked``, another question than ``text``; nothing is called.

    Why: a request sent again asks what it asked; answered from its turn,
    another question would be in no message and the model never asked (a
    client reusing AG-UI's ``runId`` would lose its users' messages).  As
    ``run_batch`` refuses an input edited under its run id.
    """
    if asked == text:
        return
    said = "a question this session cannot read" if asked is None else _shown(asked)
    msg = (
        f"request_id {request!r} took a turn of session {session!r} that asked {said}, and now asks {_shown(text)}: "
        "the same request sent again asks the same question; give this one a request_id of its own"
    )
    raise ValueError(msg)


def _shown(text: str) -> str:
    return repr(text if len(text) <= 80 else f"{text[:77]}...")


def request_of(request_id: object) -> str | None:
    """``request_id`` as a turn keeps it: None, or text a store can hold; else ``TypeError``/``ValueError``."""
    if request_id is None:
        return None
    if not isinstance(request_id, str):
        msg = f"request_id must be a str, got {type(request_id).__name__}"
        raise TypeError(msg)
    try:
        request_id.encode("utf-8")
        storable = bool(request_id) and "\x00" not in request_id
    except UnicodeEncodeError:  # a lone surrogate: no store can hold it
        storable = False
    if not storable:
        msg = f"request_id must be text, not empty, without NUL or lone surrogates, got {request_id[:40]!r}"
        raise ValueError(msg)
    return request_id
