"""The Stop catalogue: every way a run can stop, each declared once, with everything known about it.

A ``Stop`` names its reason, the checkpoints where it is checked, its guard,
its evidence, whether ``finalize`` and ``resume`` apply, the counter and limit
it judges and its one-line documentation.  The table's stop, finalize and
resume rows, the README's reason list, ``Step.counters`` and the status line,
the policy checks and the resume error message are all derived from this
list, so a built-in stop's row, drawing and reference come from one entry
here; its guard, its evidence, a ``Limits`` field with its ``Agent`` keyword,
and the checker's reading of a new fact are each in a module of their own
(the architecture page lists every piece).  A user's ``StopCondition`` is the
same kind of object.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping
from enum import StrEnum
from typing import Any, Literal

import attrs

from fsm_agent.definition import evidence as ev
from fsm_agent.definition import guards as g
from fsm_agent.definition.run import Meter, Run
from fsm_agent.definition.states import POLICIES, TERMINAL, Policy, Reason, State
from fsm_agent.definition.views import RunView

Evidence = Callable[[Run], dict[str, Any]]


class At(StrEnum):
    """A checkpoint: one place in the table where stops are tried, in catalogue order."""

    START = "start"
    """AwaitModel, before the run's first model call: nothing is spent on a run that may not go on."""
    MODEL_FAILED = "model_failed"
    MODEL_INTERRUPTED = "model_interrupted"
    MODEL_EXPIRED = "model_expired"
    AFTER_MODEL = "after_model"
    CHECK_REPLY = "check_reply"
    CHECK_INTERRUPTED = "check_interrupted"
    """Dispatch, when the task driving the run was cancelled while a typed answer was being checked."""
    CHECK_EXPIRED = "check_expired"
    """Dispatch, when the run's timeout passed while a typed answer was being checked (or before it could be)."""
    ANSWER = "answer"
    """Dispatch, before a reply without tool calls becomes the final answer: its output check and guardrails."""
    BEFORE_TOOL = "before_tool"
    TOOL_INTERRUPTED = "tool_interrupted"
    TOOL_EXPIRED = "tool_expired"
    AFTER_TOOL = "after_tool"
    """ExecuteTool, after every tool call, before the next call of the same turn."""
    BEFORE_MODEL = "before_model"
    """ExecuteTool, once the turn's calls have all run, before the next model call."""


UNGUARDED = frozenset(
    {
        At.MODEL_FAILED,
        At.MODEL_INTERRUPTED,
        At.MODEL_EXPIRED,
        At.CHECK_INTERRUPTED,
        At.CHECK_EXPIRED,
        At.TOOL_INTERRUPTED,
        At.TOOL_EXPIRED,
    }
)
"""Checkpoints whose trigger alone means the stop: their rows carry no guard."""

USER_CHECKPOINT = {
    State.AwaitModel: At.AFTER_MODEL,
    State.CheckTruncation: At.CHECK_REPLY,
    State.Dispatch: At.BEFORE_TOOL,
    State.ExecuteTool: At.BEFORE_MODEL,
}
"""Where a ``StopCondition(at=state)`` is checked: as the run leaves that state in the normal course."""

GUARDRAILS = {"input": (At.START, State.AwaitModel), "answer": (At.ANSWER, State.Dispatch)}
"""Where a guardrail ``StopCondition(at="input" | "answer")`` is checked, and the state the run is leaving there."""

Resume = Literal["lift", "retry"]


@attrs.frozen
class Stop:
    """One stop: ``reason`` fires where its ``guard`` holds at one of its checkpoints ``at``.

    ``finalize``: the stop may be answered by one last model call without
    tools.  ``resume``: ``"lift"`` when new limits (or a fresh token) under
    which ``guard`` no longer holds let the run go on, ``"retry"`` for a
    ``resume(retry=True)``.  ``counter`` is the meter it judges (shown in
    ``Step.counters``) and ``limit`` the ``Limits`` field it reads.
    """

    reason: str
    at: tuple[At, ...]
    guard: g.Guard | None
    evidence: Evidence
    doc: str
    finalize: bool = False
    resume: Resume | None = None
    counter: Meter | None = None
    limit: str | None = None
    policy: Policy = "raise"
    edge_only: bool = False
    """The reason only labels the edge: the run keeps the stop that asked for the finalize."""
    keeps_text: bool = False
    """The reply's text becomes the result's ``final``, so the caller sees what the model said."""
    compact: bool = False
    """The stop may be answered by compacting the history and making the call again (``on_stop="compact"``)."""
    keeps_guard: bool = False
    """Checked where the trigger alone means a stop (``UNGUARDED``), it takes only the triggers its guard holds for."""
    stands: g.Guard | None = None
    """What a resume asks to know whether the stop still holds, where ``guard`` cannot tell (None: ``guard``)."""

    @property
    def still_holds(self) -> g.Guard | None:
        """The guard a resume asks: ``stands`` if declared, else the stop's own ``guard``."""
        return self.stands or self.guard

    @property
    def policies(self) -> tuple[Policy, ...]:
        """The ``on_stop`` policies this stop allows: none for one that only labels an edge (it never ends a run)."""
        if self.edge_only:
            return ()
        allowed: tuple[Policy, ...] = ("raise", "return")
        if self.finalize:
            allowed += ("finalize",)
        return (*allowed, "compact") if self.compact else allowed


def blocking_stop(run: Run) -> str | None:
    """The first stop that forbids a model call now, of those a new limit can lift (None: a call may be made).

    Several stops can hold at once and only the first is recorded, so a
    resume, and an answer sent back for another try, check them all.
    """
    stop = _forbidding(run, At.BEFORE_MODEL)
    return None if stop is None else stop.reason


def _forbidding(run: Run, at: At, *, limited: bool = False) -> Stop | None:
    for stop in run.table_stops.values():
        if stop.resume != "lift" or at not in stop.at or stop.guard is None or (limited and stop.limit is None):
            continue
        if stop.guard(run):
            return stop
    return None


def next_call_forbidden(run: Run) -> Stop | None:
    """The stop of a limit that forbids the call a run in ``AwaitModel`` or ``ExecuteTool`` makes next (None: none).

    Why: those stops are checked on the edge into the state, under the
    limits of then; a run that comes back there under other limits (a
    resume or a fork that sets them) would make the call unchecked.  None
    where no call is next: a finalize call (it answers a stop), a run
    before its first (its ``start`` rows check it), a call that ran or was
    rejected.  A cancel is no limit: the next transition takes it.
    """
    state, calls = run.at.state, run.calls
    if state is State.AwaitModel and run.at.finalizing is None and run.counts.turns:
        return _forbidding(run, At.BEFORE_MODEL, limited=True)
    if state is not State.ExecuteTool or not calls.pending:
        return None
    call = calls.pending[0]
    if call.id in calls.ran or calls.approvals.get(call.id, True) is not True:
        return None
    return _forbidding(run, At.BEFORE_TOOL, limited=True)


def _output_invalid(run: Run) -> dict[str, Any]:
    """`errors`, `answer` (also `result.final`), `retries` against `limit`; why no retry: `blocked_by`, `retryable`."""
    errors, retryable = run.talk.output_problem or ((), False)
    message = ev.reply_of(run)
    out: dict[str, Any] = {
        "errors": list(errors),
        "answer": message.content if message else "",
        "retries": run.counts.output_retries,
        "limit": run.output_retry_limit,
    }
    if not retryable:
        out["retryable"] = False
    elif run.at.finalizing is not None:
        out["blocked_by"] = run.at.finalizing
    elif run.counts.output_retries < run.output_retry_limit:
        out["blocked_by"] = blocking_stop(run)
    return out


def _context_overflow(run: Run) -> dict[str, Any]:
    """`error`, `tokens` against the window's `limit` (null if not said), `compacted`; `blocked_by`, `compact_error`."""
    exc = run.faults.model_exception
    out: dict[str, Any] = {
        "error": str(exc),
        "tokens": getattr(exc, "tokens", None),
        "limit": getattr(exc, "limit", None),
        "compacted": run.talk.context_head is not None and not run.talk.compact_error,
    }
    if run.talk.compact_error:
        out["compact_error"] = run.talk.compact_error
    elif run.policies.get("context_overflow") == "compact" and run.counts.turns != run.counts.compacted_turn + 1:
        out["blocked_by"] = blocking_stop(run)
    return out


A = At
CATALOGUE: tuple[Stop, ...] = (
    Stop("context_overflow", (A.MODEL_FAILED,), g.context_overflowed, _context_overflow,
         "the model's context window cannot hold the conversation", resume="retry", compact=True, keeps_guard=True),
    Stop("model_error", (A.MODEL_FAILED,), None, ev.model_error,
         "the model call raised, or its reply was unusable", resume="retry"),
    Stop("hook_error", (A.AFTER_MODEL, A.CHECK_REPLY, A.BEFORE_TOOL, A.AFTER_TOOL), g.hook_raised, ev.hook_error,
         "a hook of a strict_hooks agent raised"),
    Stop("max_tokens", (A.CHECK_REPLY,), g.is_truncated, ev.max_tokens, "the reply was cut at the output limit",
         keeps_text=True),
    Stop("refusal", (A.CHECK_REPLY,), g.is_refusal, ev.refusal, "the provider refused or filtered the reply",
         keeps_text=True),
    Stop("output_invalid", (A.ANSWER,), g.output_rejected, _output_invalid,
         "the final answer failed the output type or a validator, and no retry was left", keeps_text=True),
    Stop("finalize_failed", (A.BEFORE_TOOL,), g.asks_tools_while_finalizing, ev.finalize_failed,
         "the finalize reply asked for tools anyway", edge_only=True),
    Stop("cancelled", (A.START, A.MODEL_INTERRUPTED, A.CHECK_INTERRUPTED, A.BEFORE_TOOL, A.TOOL_INTERRUPTED,
                       A.BEFORE_MODEL),
         g.is_cancelled, ev.cancelled, "the run's CancelToken was cancelled, or the task driving it", resume="lift"),
    Stop("timeout", (A.START, A.MODEL_EXPIRED, A.CHECK_EXPIRED, A.BEFORE_TOOL, A.TOOL_EXPIRED, A.BEFORE_MODEL),
         g.deadline_passed,
         ev.timeout, "the run used up its timeout seconds", finalize=True, resume="lift",
         counter=g.SECONDS, limit="timeout"),
    Stop("repeated_action", (A.BEFORE_TOOL,), g.repeats_last_call, ev.repeated_action,
         "the next call repeats the call just made", finalize=True),
    Stop("max_tool_calls", (A.BEFORE_TOOL,), g.tool_calls_exhausted, ev.max_tool_calls,
         "the next call would exceed a tool-call cap", finalize=True, resume="lift",
         counter=g.TOOL_CALLS, limit="max_tool_calls", stands=g.stopped_call_capped),
    Stop("child_stopped", (A.AFTER_TOOL,), g.passes_child_stop, ev.child_stopped,
         "a sub-agent stopped and its tool passes the stop on"),
    Stop("tool_failures", (A.AFTER_TOOL,), g.failures_exhausted, ev.tool_failures,
         "too many tool calls failed in a row",
         counter=g.FAILURES, limit="max_consecutive_failures"),
    Stop("cycle", (A.AFTER_TOOL,), g.is_cycling, ev.cycle, "the latest calls repeat a cycle with the same results",
         finalize=True, limit="cycle_window"),
    Stop("token_budget", (A.BEFORE_MODEL,), g.budget_spent, ev.token_budget, "the token budget is spent",
         finalize=True, resume="lift", counter=g.TOKENS, limit="token_budget"),
    Stop("cost_budget", (A.BEFORE_MODEL,), g.cost_spent, ev.cost_budget, "the cost budget (US dollars) is spent",
         finalize=True, resume="lift", counter=g.COST, limit="cost_budget"),
    Stop("max_steps", (A.BEFORE_MODEL,), g.steps_exhausted, ev.max_steps, "max_steps model turns were taken",
         finalize=True, resume="lift", counter=g.STEPS, limit="max_steps"),
)  # fmt: skip
"""The built-in stops; their order is their priority wherever two are checked at the same checkpoint."""
del A

CONDITION_ERROR = Stop(
    "stop_condition_error",
    (),
    g.condition_raised,
    ev.condition_error,
    "a StopCondition's check raised, or returned no bool",
)
"""Checked just before the user's stops of a checkpoint, so it exists only in tables that have some."""

RESERVED_REASONS = frozenset({"done", "paused", "running"})
"""Result reasons that are not stops, so no stop may use them."""


def _checkpoint(value: State | str) -> tuple[At, State]:
    if isinstance(value, str) and value in GUARDRAILS:
        return GUARDRAILS[value]
    try:
        state = State(value)
    except ValueError:
        state = None
    if state is None or state in TERMINAL:
        allowed = ", ".join(s for s in State if s not in TERMINAL)
        msg = f"StopCondition at={value!r} is not a non-terminal state; use one of {allowed}, 'input' or 'answer'"
        raise ValueError(msg)
    return USER_CHECKPOINT[state], state


class ConditionError(Exception):
    """A user's ``StopCondition.check`` raised; the stepper turns it into ``stop_condition_error``."""

    def __init__(self, name: str, error: Exception) -> None:
        super().__init__(f"{name}: {type(error).__name__}: {error}")
        self.name = name
        self.error = error


class StopCondition(Stop):
    """Stop the run with ``reason`` when ``check(view)`` (on a read-only ``RunView``) is true at ``at``.

    ``at`` is a state the run is leaving, the edge tried after its built-in
    stops: ``AwaitModel`` once the model replied, ``Dispatch`` before every
    tool call, ``ExecuteTool`` after a turn's last call.  Or a guardrail:
    ``"input"``, before the first model call (the ``start`` trigger; the
    input is ``view.messages[-1]``), so a tripped input costs no call;
    ``"answer"``, on a reply without tool calls just before ``Done`` (it is
    ``view.last_response``, kept as the result's ``final`` if tripped).  A
    check that raises, or returns anything but a bool (None, a str), stops
    the run with ``stop_condition_error``; an ``async def`` check is a
    ``TypeError`` (a check is called, not awaited).
    ``policy`` is the default ``on_stop`` (``raise`` or ``return``; never
    ``finalize``).
    """

    def __init__(
        self,
        reason: str,
        at: State | str,
        check: Callable[[RunView], bool],
        description: str = "",
        policy: Literal["raise", "return"] = "raise",
    ) -> None:
        if not isinstance(reason, str) or not reason.isidentifier():
            msg = f"StopCondition reason must be a non-empty identifier-like string, got {reason!r}"
            raise ValueError(msg)
        if not callable(check):
            msg = f"StopCondition check must be callable, got {type(check).__name__}"
            raise TypeError(msg)
        if policy not in ("raise", "return"):
            msg = f"StopCondition policy must be 'raise' or 'return', got {policy!r}"
            raise ValueError(msg)
        name = getattr(check, "__name__", "")
        name = name if name.isidentifier() else f"check_{reason}"
        if inspect.iscoroutinefunction(check):
            # Its coroutine, never awaited, is truthy: the stop would trip on every run.
            msg = f"StopCondition check {name!r} is an async def; a check is called, not awaited: make it a plain def"
            raise TypeError(msg)
        place, state = _checkpoint(at)
        # The answer edge shares Dispatch's trigger with every tool call, where there is no answer to check.
        answer = place is At.ANSWER

        def guard(run: Run) -> bool:
            if answer and not g.has_no_tool_calls(run):
                return False
            try:
                said = check(RunView(run))
            except Exception as exc:
                raise ConditionError(name, exc) from exc
            if said is True or said is False:  # None (a forgotten return) would never trip, a str always
                return said
            wrong = TypeError(f"check {name!r} returned {type(said).__name__}, expected bool (True stops the run)")
            raise ConditionError(name, wrong)

        guard.__name__ = guard.__qualname__ = name
        # The guard's docstring is what the rendered documentation says about the edge.
        guard.__doc__ = description or check.__doc__

        def evidence(run: Run) -> dict[str, Any]:
            return {"condition": name, "description": description}

        evidence.__doc__ = "`condition`, `description`"
        doc = description or (check.__doc__ or "").strip() or f"{name} held"
        super().__init__(reason, (place,), guard, evidence, doc, policy=policy, keeps_text=answer)
        object.__setattr__(self, "check", check)
        object.__setattr__(self, "description", description)
        object.__setattr__(self, "state", state)

    check: Callable[[RunView], bool]
    description: str
    state: State


def user_stops(stops: Iterable[Any], builtin: Collection[str]) -> tuple[StopCondition, ...]:
    """Check a user's stop conditions: the right type, no clash with built-in or reserved reasons or each other."""
    # A list or tuple, the usual and the default, first: the checks of other shapes cost more than the rest.
    if not isinstance(stops, list | tuple) and (
        isinstance(stops, StopCondition | str | bytes | Mapping) or not isinstance(stops, Iterable)
    ):
        kind = "one StopCondition" if isinstance(stops, StopCondition) else type(stops).__name__
        msg = f"stop_conditions must be a list of StopCondition objects, got {kind}: pass [condition, ...]"
        raise TypeError(msg)
    seen: set[str] = set()
    out = []
    for stop in stops:
        if not isinstance(stop, StopCondition):
            msg = f"stop_conditions must hold StopCondition objects, got {type(stop).__name__}"
            raise TypeError(msg)
        if stop.reason in builtin or stop.reason in RESERVED_REASONS:
            msg = f"StopCondition reason {stop.reason!r} collides with a built-in reason"
            raise ValueError(msg)
        if stop.reason in seen:
            msg = f"StopCondition reason {stop.reason!r} is used by two stop conditions"
            raise ValueError(msg)
        seen.add(stop.reason)
        out.append(stop)
    return tuple(out)


def check_policies(
    on_stop: Mapping[str, str] | Mapping[Reason, Policy] | None, stops: Mapping[str, Stop]
) -> dict[str, str]:
    """Validate ``on_stop`` against the stops: known reasons, known policies, finalize only where it applies."""
    if on_stop is not None and not isinstance(on_stop, Mapping):
        msg = f"on_stop must map reasons to policies, as on_stop={{'max_steps': 'return'}}, got {on_stop!r}"
        raise TypeError(msg)
    policies: dict[str, str] = {stop.reason: stop.policy for stop in stops.values() if stop.policy != "raise"}
    for reason, policy in (on_stop or {}).items():
        stop = stops.get(reason)
        if stop is None:
            msg = f"on_stop names unknown reason {reason!r}; known reasons: {', '.join(sorted(stops))}"
            raise ValueError(msg)
        if policy not in POLICIES:
            msg = f"on_stop[{reason!r}] must be one of {', '.join(POLICIES)}, got {policy!r}"
            raise ValueError(msg)
        if not stop.policies:
            msg = (
                f"on_stop[{reason!r}] cannot be set: {reason} only labels the edge of a failed finalize call, "
                "and the run keeps the stop that asked for it (set that stop's policy)"
            )
            raise ValueError(msg)
        if policy not in stop.policies:
            finalizable = ", ".join(s.reason for s in stops.values() if "finalize" in s.policies)
            compactable = ", ".join(s.reason for s in stops.values() if "compact" in s.policies)
            msg = (
                f"on_stop[{reason!r}]={policy!r} is not allowed; finalize applies to {finalizable}, "
                f"compact to {compactable}"
            )
            raise ValueError(msg)
        policies[reason] = policy
    return policies
