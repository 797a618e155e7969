"""Guards as declarations: each built-in guard says what it reads, and a limit's guard is data.

A guard is one of three kinds.  ``AtLimit`` is a meter compared with its
limit (``steps >= max_steps``): no body, only the meter it reads and the
``Limits`` field that bounds it.  ``Fact`` is a named fact of the last reply
or outcome (``is_truncated``, ``is_cancelled``), a one-line predicate
declared with the run attributes it reads (and the limit that bounds it, if
one does).  Anything else, a user's ``StopCondition`` or a plain function
put in a ``Row``, is opaque: called, never read.  The table answers, for each
row, what it reads and which limit bounds it (``Table.reads``,
``Table.bounds``), and which edges move a meter (``Table.increments``).

Guards of limits that are not set are false at once.  Which stop a guard
belongs to, and what its evidence says, is declared once in
``definition.stops``; the guard's name is the label of its edges.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from operator import attrgetter

from fsm_agent.definition.run import Meter, Run, Signature, signature
from fsm_agent.definition.states import State
from fsm_agent.errors import ContextOverflowError

Guard = Callable[[Run], bool]


class Declared:
    """A built-in guard: a named predicate over a run with what it reads and what bounds it declared beside it.

    Called like a function (``guard(run)``); ``test`` is the predicate
    itself, which the interpreter calls.  ``__name__`` is the edge's label
    and ``__doc__`` the line the documentation shows.  Compared by identity,
    as functions are.
    """

    test: Guard

    def __init__(self, name: str, reads: tuple[str, ...], bound: str | None, doc: str) -> None:
        self.__name__ = self.__qualname__ = name
        self.reads = reads
        """The meters and run facts it reads, by name."""
        self.bound = bound
        """The ``Limits`` field that bounds it, or None."""
        self.__doc__ = doc

    def __call__(self, run: Run) -> bool:
        return self.test(run)

    def __repr__(self) -> str:
        return f"<guard {self.__name__}>"


class AtLimit(Declared):
    """``meter >= limit``: a counter of the run reached its ceiling (never, when that limit is not set)."""

    def __init__(self, name: str, meter: Meter, doc: str, *, used: str | None = None) -> None:
        assert meter.bound is not None  # a meter a guard compares is bounded by a Limits field
        super().__init__(name, (meter.name,), meter.bound, doc)
        self.meter = meter
        self.limit = meter.limit
        # The run attribute compared; the meter's own unless the guard reads it unrounded (``elapsed``).
        self.used = attrgetter(used or meter.used)
        self.test = self.holds

    def holds(self, run: Run) -> bool:
        """The meter has reached the limit, if the run has one."""
        limit = self.limit(run.limits)
        return limit is not None and self.used(run) >= limit


class Fact(Declared):
    """A named fact of the run (of its last reply or outcome), one predicate declared with what it reads."""

    def __init__(self, test: Guard, reads: tuple[str, ...], bound: str | None = None) -> None:
        super().__init__(test.__name__, reads, bound, test.__doc__ or "")
        self.test = test


class Lookahead(Fact):
    """A finalize edge's guard: taken in place of the row ``trigger`` takes from the same state, after its outcome."""

    def __init__(self, test: Guard, reads: tuple[str, ...], trigger: str) -> None:
        super().__init__(test, reads)
        self.trigger = trigger


def fact(*reads: str, bound: str | None = None) -> Callable[[Guard], Guard]:
    """Declare the predicate below as a ``Fact`` reading ``reads`` (bounded by the ``Limits`` field ``bound``)."""

    def declare(test: Guard) -> Guard:
        return Fact(test, reads, bound)

    return declare


def is_opaque(guard: Guard) -> bool:
    """A guard that declares nothing (a user's ``StopCondition`` or a plain function): it is only called."""
    return not isinstance(guard, Declared)


# The meters: a counter of the run, the limit it is held to, and the (state, trigger) whose outcome moves it.
MODEL_OUTCOMES = (("AwaitModel", "replied"), ("AwaitModel", "model_failed"))
TOOL_OUTCOME = (("ExecuteTool", "tool_done"),)
EVERY_EDGE = (("*", "*"),)
"""The clock's: the driver writes ``elapsed`` before a transition (or after a call)."""
STEPS = Meter(
    "steps",
    "counts.turns",
    attrgetter("max_steps"),
    "max_steps",
    (*MODEL_OUTCOMES, ("AwaitModel", "interrupted"), ("AwaitModel", "expired")),  # a call cut off may be billed
)
TOKENS = Meter(
    "tokens",
    "counts.tokens",
    attrgetter("token_budget"),
    "token_budget",
    (*MODEL_OUTCOMES, *TOOL_OUTCOME),  # a sub-agent's tokens are its parent's
)
COST = Meter(
    "cost",
    "counts.cost",
    attrgetter("cost_budget"),
    "cost_budget",
    (*MODEL_OUTCOMES, *TOOL_OUTCOME),  # a sub-agent's cost is its parent's
)
FAILURES = Meter(
    "failures", "counts.failures", attrgetter("max_consecutive_failures"), "max_consecutive_failures", TOOL_OUTCOME
)
TOOL_CALLS = Meter("tool_calls", "counts.tool_calls", attrgetter("total_tool_calls"), "max_tool_calls", TOOL_OUTCOME)
SECONDS = Meter("seconds", "counts.seconds", attrgetter("timeout"), "timeout", EVERY_EDGE)
METERS = (SECONDS, TOOL_CALLS, FAILURES, TOKENS, COST, STEPS)
"""Every built-in meter, in the order ``Step.counters`` lists them."""


@fact("last_response")
def is_truncated(run: Run) -> bool:
    """The model's output hit its length limit (``stop_reason == "max_tokens"``), so the reply is incomplete."""
    return run.talk.last_response is not None and run.talk.last_response.stop_reason == "max_tokens"


@fact("last_response")
def is_refusal(run: Run) -> bool:
    """The provider refused or filtered the reply (``stop_reason == "refusal"``), so it is not an answer."""
    return run.talk.last_response is not None and run.talk.last_response.stop_reason == "refusal"


@fact("last_response")
def has_no_tool_calls(run: Run) -> bool:
    """The assistant message asks for no tool: its text is the final answer."""
    return run.talk.last_response is not None and not run.talk.last_response.message.tool_calls


@fact("model_exception")
def context_overflowed(run: Run) -> bool:
    """The model call failed because its input does not fit the model's context window (``ContextOverflowError``)."""
    return isinstance(run.faults.model_exception, ContextOverflowError)


@fact("output_problem")
def output_rejected(run: Run) -> bool:
    """A typed agent's final answer failed its output type or a validator, and the model is not asked again."""
    return run.talk.output_problem is not None


@fact("finalizing")
def asks_tools_while_finalizing(run: Run) -> bool:
    """The last call was meant to answer without tools and asked for tools anyway."""
    return run.at.finalizing is not None


@fact("cancelled")
def is_cancelled(run: Run) -> bool:
    """Another thread called ``cancel()`` on the run's ``CancelToken``."""
    return run.counts.cancelled


@fact("hook_error")
def hook_raised(run: Run) -> bool:
    """A hook of a ``strict_hooks`` agent raised since the last transition."""
    return run.faults.hook_error is not None


deadline_passed = AtLimit(
    "deadline_passed", SECONDS, "The run has used up its ``timeout`` seconds.", used="counts.elapsed"
)


@fact("condition_error")
def condition_raised(run: Run) -> bool:
    """A ``StopCondition``'s check raised instead of answering, so the run cannot tell whether to stop."""
    return run.faults.condition_error is not None


@fact("pending", "last_signature")
def repeats_last_call(run: Run) -> bool:
    """The next tool call has the same name and arguments as the call executed just before it."""
    return run.counts.last_signature is not None and signature(run.calls.pending[0]) == run.counts.last_signature


def cap_reached(run: Run, name: str) -> tuple[str, int, int] | None:
    """``(scope, used, cap)`` of the first cap that one more call of ``name`` would exceed."""
    caps = run.limits.max_tool_calls
    if caps is None:
        return None
    if isinstance(caps, int):
        return ("*", run.counts.tool_calls, caps) if run.counts.tool_calls >= caps else None
    used = run.counts.calls_by_tool.get(name, 0)
    if name in caps and used >= caps[name]:
        return name, used, caps[name]
    if "*" in caps and run.counts.tool_calls >= caps["*"]:
        return "*", run.counts.tool_calls, caps["*"]
    return None


@fact("tool_calls", "calls_by_tool", "pending", bound="max_tool_calls")
def tool_calls_exhausted(run: Run) -> bool:
    """Making the next tool call would exceed ``max_tool_calls`` (for the run or for that tool)."""
    return (
        run.limits.max_tool_calls is not None
        and bool(run.calls.pending)
        and cap_reached(run, run.calls.pending[0].name) is not None
    )


@fact("tool_calls", "calls_by_tool", "pending", "evidence", bound="max_tool_calls")
def stopped_call_capped(run: Run) -> bool:
    """The call ``max_tool_calls`` stopped would still exceed its cap: what a resume of that stop asks.

    Why not ``tool_calls_exhausted``: a finalize answers the stopped call
    "not executed", so nothing is pending to ask about; the stop's evidence
    names its tool.  While the call is pending it is the one asked about.
    """
    if run.limits.max_tool_calls is None:
        return False
    name = run.calls.pending[0].name if run.calls.pending else str(run.at.evidence.get("tool", ""))
    return cap_reached(run, name) is not None


@fact("child_stop")
def passes_child_stop(run: Run) -> bool:
    """The sub-agent this tool call ran stopped, and its tool passes the stop on (``on_child_stop="raise"``)."""
    return run.calls.child_stop is not None


failures_exhausted = AtLimit("failures_exhausted", FAILURES, "``max_consecutive_failures`` tool calls in a row failed.")


def find_cycle(recent: Sequence[tuple[Signature, str]]) -> int:
    """The shortest period p >= 2 whose last p calls repeat the p before them, results included; 0 if none.

    Comparing results as well as calls is what "no progress" means here: a
    loop whose calls return the same results twice in a row learned nothing
    new, while calls whose results change (polling a job) are progress.
    """
    n = len(recent)
    last = recent[-1] if n else None
    # Every cycle has the latest call twice in the window (``period`` calls back is the same call): most windows
    # have it once, and counting it is one pass in C, where the loop below is a Python step per period.
    if recent.count(last) < 2:
        return 0
    for period in range(2, n // 2 + 1):
        if recent[n - 1 - period] != last:  # the cheap necessary condition, true of almost every non-cycle
            continue
        block = [recent[n - period + i] for i in range(period)]
        if any(recent[n - 2 * period + i] != block[i] for i in range(period)):
            continue
        if any(item != block[0] for item in block):  # period 1 (A, A) is repeated_action's business
            return period
    return 0


@fact("recent", bound="cycle_window")
def is_cycling(run: Run) -> bool:
    """The latest tool calls repeat a sequence of period 2 or more with identical results (see ``find_cycle``)."""
    return run.limits.cycle_window >= 4 and len(run.counts.recent) >= 4 and find_cycle(run.counts.recent) > 0


@fact("pending")
def has_pending_calls(run: Run) -> bool:
    """More tool calls of the current model turn wait to be dispatched."""
    return bool(run.calls.pending)


@fact("to_approve", "approvals", "pending")
def awaits_decision(run: Run) -> bool:
    """The turn's next call needs a person's approval and has no decision yet: the run waits instead of making it."""
    if not run.calls.to_approve or not run.calls.pending:
        return False
    call = run.calls.pending[0]
    return call.id in run.calls.to_approve and call.id not in run.calls.approvals


HOLDS: Mapping[State, Guard] = {State.ExecuteTool: awaits_decision}
"""Where a run waits for a person instead of making its next call, and the fact that holds it there.

No row: a held run takes no edge, it pauses.  The stepper reads this to
pause, and the checker to prove that no gated call runs undecided.
"""


budget_spent = AtLimit(
    "budget_spent",
    TOKENS,
    "The tokens reported so far have reached ``token_budget``, so no further model call is made.",
)


cost_spent = AtLimit(
    "cost_spent",
    COST,
    "The US dollars the model calls cost so far have reached ``cost_budget``, so no further model call is made.",
)


steps_exhausted = AtLimit(
    "steps_exhausted", STEPS, "``max_steps`` model turns were taken, so the next model call must not be made."
)


def dormant_guards(
    run: Run, *, strict_hooks: bool, cancellable: bool, also: tuple[Guard, ...] = ()
) -> frozenset[Guard]:
    """The guards that can never hold for ``run``, given how it was set up: its rows leave them out.

    Each of these reads a fact that only one part of a run's set-up can
    produce (a limit, a cancel token, strict hooks, a finalize policy).  A
    run without that part would ask the same question on every transition
    and always be told no.  Anything in doubt (a fact restored from a
    snapshot) keeps the guard.
    """
    limits = run.limits
    dormant: list[Guard] = []
    if not strict_hooks and run.faults.hook_error is None:
        dormant.append(hook_raised)
    if not cancellable and not run.counts.cancelled:
        dormant.append(is_cancelled)
    if limits.timeout is None:
        dormant.append(deadline_passed)
    if limits.max_tool_calls is None:
        dormant.append(tool_calls_exhausted)
    if limits.cycle_window < 4:
        dormant.append(is_cycling)
    if limits.token_budget is None:
        dormant.append(budget_spent)
    if limits.cost_budget is None:
        dormant.append(cost_spent)
    if run.at.finalizing is None and "finalize" not in run.policies.values():
        dormant.append(asks_tools_while_finalizing)
    dormant.extend(also)  # guards of parts this module does not know of (the output check, in the table)
    return frozenset(dormant)
