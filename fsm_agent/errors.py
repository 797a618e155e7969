"""Exceptions, split by who is at fault.

    FsmAgentError
    ├── DefinitionError (also ValueError)   the transition table is malformed
    ├── RunStateError (also RuntimeError)   a run object was driven wrongly
    ├── RunExistsError (also ValueError)    a new run's id is already in the store
    ├── RunLeasedError (also RuntimeError)  another owner is advancing that stored run
    │   ├── TurnLeasedError                 a session's turn another owner is taking: wait and retry
    │   └── StaleRunError                   the stored run moved on since it was read: load it again
    │       └── TurnTakenError              a session's turn was taken over by another owner meanwhile
    ├── DecisionError (also ValueError)     a decision on a stored run's call that cannot be taken
    ├── SnapshotError (also ValueError)     a snapshot that cannot be resumed: the field at fault named
    ├── ForkError (also ValueError)         a fork that cannot be taken: where, and why
    ├── Retry                               raised by an output validator: ask the model again, saying why
    ├── ContextOverflowError                a model call's input is longer than the model's context window
    └── AgentLoopError (also RuntimeError)  a run stopped; carries reason + result

A programmer's mistake (bad table, bad limits, advancing a finished run) is an
exception about the code; a run that stops is data about the run, handed over
as ``AgentLoopError`` with everything the run produced so far.  Invalid limits
raise a plain ``ValueError`` at construction, as Python users expect.
"""

from __future__ import annotations

import time
from typing import Any

from fsm_agent.records import RunResult


class FsmAgentError(Exception):
    """Base class of every exception this package raises on purpose."""


class DefinitionError(FsmAgentError, ValueError):
    """The transition table breaks a rule; the message names the offending states."""


class ForkError(FsmAgentError, ValueError):
    """A fork that cannot be taken (``Agent.fork``): ``at`` outside the source, or the source not rebuilt up to it."""


class RunStateError(FsmAgentError, RuntimeError):
    """A run object was used in a state that does not allow it (e.g. advancing a finished run)."""


class RunExistsError(FsmAgentError, ValueError):
    """A new run was given a ``run_id`` the store already holds; pass ``overwrite=True`` to replace that run.

    Silently replacing it would lose the stored run, even one paused for a person's approval.
    ``advice`` says what the caller can do instead, where starting the run
    is not what failed (a fork takes no ``overwrite``); None: resume the
    stored run, or start the new one with ``overwrite=True``.
    """

    def __init__(self, run_id: str, where: str, advice: str | None = None) -> None:
        super().__init__(run_id, where, advice)
        self.run_id = run_id
        self.where = where
        self.advice = advice

    def __str__(self) -> str:
        advice = self.advice or "resume it, or start it with overwrite=True"
        return f"run {self.run_id!r} already exists in {self.where}; {advice}"


class RunNotFoundError(FsmAgentError, KeyError):
    """The store holds no run by this id (never written, deleted, or an id no store could hold).

    A ``KeyError``, as a missing key is, so ``except KeyError`` still
    catches it; its own class so an app tells it from a ``KeyError`` of its
    own code, and its message reads as written (a bare ``KeyError`` shows
    its message quoted).
    """

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else "no such run"


class RunLeasedError(FsmAgentError, RuntimeError):
    """Another owner (a process, a worker) holds the lease on this stored run; ``holder`` names it.

    The lease lapses at ``until`` (seconds since the epoch) unless its holder
    renews it, so a crashed owner's run can be taken over after that.
    ``stale`` means nobody holds it now, but the stored run moved on since
    this run object last wrote it (another owner advanced or replaced it):
    load it from the store again rather than overwrite that work.
    """

    def __init__(self, run_id: str, holder: str, until: float, stale: bool = False) -> None:
        super().__init__(run_id, holder, until, stale)
        self.run_id = run_id
        self.holder = holder
        self.until = until
        self.stale = stale

    def __str__(self) -> str:
        if self.stale:
            return f"run {self.run_id!r} was changed in the store by {self.holder} since this run saved it; resume it"
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.until))
        return (
            f"run {self.run_id!r} is being advanced by {self.holder} (lease until {when}); if that owner is gone"
            " (a crash, a Ctrl-C), its lease lapses then and the run can be taken over"
        )


class StaleRunError(RunLeasedError):
    """A write to a stored run was refused: the run moved on since the writer read it; nothing was changed.

    Every write to a stored run (a checkpoint, a whole save, a resume, a
    decision) names the version it read (``stored_seq`` in a loaded
    snapshot); the store takes it only if that is still the run's version.
    ``expected`` is the version the writer read (None: it read none),
    ``found`` the stored one (None: the run is gone).  It is a
    ``RunLeasedError`` with ``stale`` true, so code that retries a leased run
    by loading it again handles it already.
    """

    def __init__(self, run_id: str, where: str, expected: int | None, found: int | None) -> None:
        FsmAgentError.__init__(self, run_id, where, expected, found)
        self.run_id = run_id
        self.holder = "another owner"
        self.until = 0.0
        self.stale = True
        self.where = where
        self.expected = expected
        self.found = found

    def __str__(self) -> str:
        run = f"run {self.run_id!r} in {self.where}"
        if self.found is None:
            return f"{run} was deleted after version {self.expected} was read; nothing was written"
        if self.expected is None:
            return (
                f"{run} already exists (version {self.found}) and this snapshot was not read from the store: "
                "load it (store.load) and resume that"
            )
        if self.found == self.expected:
            return (
                f"{run} was deleted and started again under the same id since version {self.expected} was read: "
                "this snapshot is of the deleted run; nothing was written"
            )
        return (
            f"{run} moved on to version {self.found} since version {self.expected} was read; "
            "nothing was written: load it again (store.load)"
        )


class TurnLeasedError(RunLeasedError):
    """A session's turn another owner is taking (``Session.run``): wait for it and retry; a ``RunLeasedError``."""

    def __str__(self) -> str:
        session, _, n = self.run_id.rpartition("/")
        when = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(self.until))
        return (
            f"turn {n} of session {session!r} is still being taken by {self.holder} (run {self.run_id!r},"
            f" lease until {when}): wait for it and retry this turn; if its owner is gone, the first turn"
            " asked for after the lease lapses finishes it first, and so does Session.resume()"
        )


class TurnTakenError(StaleRunError):
    """A session's turn this object was taking was taken over by another owner once its lease lapsed: nothing more done.

    Why a ``Session`` says so instead of the store's refusal: the store's
    advice, load the run again, is a store's, and the question asked again
    would be a new turn, its calls made again, while the turn taken over is
    finished by its new owner, its answer stored.  A ``StaleRunError``
    still, so code that handles a refused write handles it.
    """

    def __init__(self, refused: RunLeasedError) -> None:
        if isinstance(refused, StaleRunError):
            super().__init__(refused.run_id, refused.where, refused.expected, refused.found)
        else:
            super().__init__(refused.run_id, "the store", None, None)
        self.holder = refused.holder
        self.refused = refused

    def __reduce__(self) -> tuple[type[TurnTakenError], tuple[RunLeasedError]]:
        return type(self), (self.refused,)

    def __str__(self) -> str:
        session, _, n = self.run_id.rpartition("/")
        who = "" if self.holder == "another owner" else f" ({self.holder})"
        return (
            f"turn {n} of session {session!r} was taken over by another owner{who} while this one was taking it:"
            " this one's lease lapsed (its process stalled, or could not reach the store, for longer than the lease)."
            " Nothing more was written or called here; the other owner goes on with the turn and stores its answer,"
            f" so read the session again for it (a new Session, or store.load({self.run_id!r})). Asking the"
            " question again takes a new turn, which makes its calls again, unless it comes with this turn's"
            " request_id: the same request_id is answered from it, nothing called, however many turns came after"
        )


class DecisionError(FsmAgentError, ValueError):
    """A decision on a run's call was refused by what the run holds: it ended, the call ran, or a decision holds.

    ``why`` says which rule, and what became of the call.  Raised by a
    store's ``decide`` and by every resume or run object given decisions
    (``run.decide``, ``Agent.resume``, ``Session.resume``), so an app answers
    all of them alike (409 Conflict): the decision came too late or clashes
    with one taken, not that the request was malformed (a plain
    ``ValueError`` or ``TypeError``).  ``call_id`` is the first call refused.
    """

    def __init__(self, run_id: str, call_id: str, why: str) -> None:
        super().__init__(run_id, call_id, why)
        self.run_id = run_id
        self.call_id = call_id
        self.why = why

    def __str__(self) -> str:
        return f"no decision taken on call {self.call_id!r} of run {self.run_id!r}: {self.why}"


class SnapshotError(FsmAgentError, ValueError):
    """A snapshot that cannot be resumed: wrong version, broken JSON, unknown state, bad or contradictory fields."""


class Retry(FsmAgentError):
    """Raised by an output validator to send the model back with this message (``Retry("why")``).

    The run takes ``Dispatch->AwaitModel[output_invalid]`` with the message
    as the model's next input, like an answer that does not parse, within
    the agent's ``output_retries``.
    """


class ContextOverflowError(FsmAgentError):
    """The provider refused a model call because its input does not fit the model's context window.

    Raised by the model adapters for each provider's own context-length
    error (the SDK's error is the ``__cause__``), so the run stops with
    ``context_overflow`` instead of ``model_error``: a broken model and a
    conversation that grew too long need different remedies.  ``tokens`` is
    the input length and ``limit`` the window, when the provider said them.
    Any model may raise it.
    """

    def __init__(self, message: str, *, tokens: int | None = None, limit: int | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.tokens = tokens
        self.limit = limit

    def __reduce__(self) -> tuple[Any, ...]:
        return (_context_overflow, (self.message, self.tokens, self.limit))


def _context_overflow(message: str, tokens: int | None, limit: int | None) -> ContextOverflowError:
    return ContextOverflowError(message, tokens=tokens, limit=limit)


class AgentLoopError(FsmAgentError, RuntimeError):
    """A run stopped before a natural finish.

    ``reason`` is the machine-readable stop reason, ``result`` the partial
    :class:`RunResult` (messages, steps and trace so far) and ``evidence`` a
    JSON-serialisable dict that explains the stop.  ``str()`` gives the
    reason, the model turn it stopped in (numbered from 1, as ``max_steps``
    counts turns; the evidence's ``step`` is its index), or "before the
    first model call" for a run that made none (its ``step`` is 0 and its
    ``steps`` counter 0), and a one-line summary of the evidence, so an
    uncaught stop says why; the error pickles with its result (a stop inside
    a process pool reaches the parent as itself).
    """

    def __init__(self, reason: str, result: RunResult, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(reason, result, evidence)
        self.reason = reason
        self.result = result
        self.evidence: dict[str, Any] = dict(result.evidence if evidence is None else evidence)

    def __str__(self) -> str:
        facts = ", ".join(f"{k}={_short(v)}" for k, v in self.evidence.items() if k not in ("step", "counters"))
        step = self.evidence.get("step")
        if not isinstance(step, int):
            where = ""
        elif _model_calls(self.evidence, self.result) == 0:
            # A cancel or a deadline met at the start, an input guardrail: step 0 names no turn that was taken.
            where = " before the first model call"
        else:
            # "step N" beside turns=N+1 read as two different counts: a step is a model turn, counted from 1.
            where = f" in model turn {step + 1}"
        return f"{self.reason}{where}" + (f": {facts}" if facts else "")


def _model_calls(evidence: dict[str, Any], result: RunResult) -> int | None:
    """The model calls a stopped run made (a failed one too): its ``steps`` counter, else its snapshot's turns.

    None when neither says (an evidence made by hand, a table without a
    ``steps`` meter and a result without a snapshot).
    """
    counters = evidence.get("counters")
    steps = counters.get("steps") if isinstance(counters, dict) else None
    if isinstance(steps, list | tuple) and steps and isinstance(steps[0], int):
        return steps[0]
    kept = (result.snapshot or {}).get("counters")
    turns = kept.get("turns") if isinstance(kept, dict) else None
    return turns if isinstance(turns, int) else None


def _short(value: Any, limit: int = 60) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
