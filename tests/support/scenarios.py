"""Generated agent scenarios and the invariants every run must satisfy, shared by the property-based tests.

A scenario is plain data (a ``Case``): a model script, the agent's limits and
policies.  ``build`` turns it into a fresh agent with a fresh model, registry,
clock and cancel token every time, so one case can be run twice and the two
runs compared.  The model and the registry record what they did; that record,
not the run's own counters, is the evidence the checks hold the engine to.

``Shadow`` keeps the test's own account of a run from that record and
predicts every edge independently: for the state and trigger, the first row
of the agent's table whose guard, evaluated on the shadow, holds.  The table
supplies only the order of the rows (the spec: row order is priority); the
truth of each guard comes from ``Shadow.guard``, written from the guards'
documentation rather than from their code.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from itertools import pairwise
from typing import Any

import attrs
from hypothesis import strategies as st

from fsm_agent import (
    Agent,
    CancelToken,
    ContextOverflowError,
    Message,
    ModelResponse,
    RunResult,
    RunView,
    Step,
    StopCondition,
    ToolCall,
    ToolRegistry,
    ToolResult,
    Transition,
    Usage,
)
from fsm_agent.core.stepper import FINALIZE_INSTRUCTION
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.states import State
from fsm_agent.definition.stops import CATALOGUE
from fsm_agent.definition.table import TABLE, Row
from fsm_agent.definition.triggers import (
    CHECK,
    DISPATCH,
    EXPIRED,
    FINALIZE,
    INTERRUPTED,
    MODEL_FAILED,
    REPLIED,
    RESUME,
    START,
    TOOL_DONE,
)
from fsm_agent.drivers.agent import AgentRun
from fsm_agent.records import STOP_REASONS
from fsm_agent.testing import FakeModel, ManualClock, ScriptExhaustedError

FINALIZABLE = tuple(stop.reason for stop in CATALOGUE if stop.finalize)

USER_INPUT = "please work it out"
MAX_CALLS_PER_TURN = 3
OUTPUT_CAP = 300
"""The registry's ``max_output_chars`` in generated cases: small, so the ``big`` output is cut cheaply."""

# --- what the model says -----------------------------------------------------------------------------------

POINT = {
    "title": "Point",
    "type": "object",
    "properties": {"x": {"type": "integer"}, "y": {"type": "integer"}},
    "required": ["x", "y"],
    "additionalProperties": False,
}
"""A typed agent's output type as a JSON Schema dict: two integers."""

OVERFLOW = ContextOverflowError("prompt is too long: 210000 tokens > 200000 maximum", tokens=210000, limit=200000)
"""What an adapter raises for its provider's context-length error."""


def with_failing_child(registry: ToolRegistry) -> ToolRegistry:
    """``registry`` plus ``research``, a sub-agent whose model is down, passing its stop on to the parent."""
    child = Agent(FakeModel(ConnectionError("child model down")), ToolRegistry())
    registry.register(child.as_tool("research", "Looks one thing up.", on_child_stop="raise"))
    return registry


def keep_last(messages: list[Message]) -> list[Message]:
    """A compaction for tests: only the last user message is kept."""
    return [next(m for m in reversed(messages) if m.role == "user")]


@attrs.frozen
class Call:
    """A tool call the model asks for; ``arguments`` may be anything, on purpose (bad input)."""

    name: str
    arguments: Any = attrs.field(factory=dict)
    raw: str | None = None


@attrs.frozen
class Turn:
    """One model reply: text, tool calls, a ``stop_reason`` (known or not) and usage."""

    content: str = ""
    calls: tuple[Call, ...] = ()
    stop_reason: str = "end_turn"
    usage: Usage | None = None


@attrs.frozen
class Raise:
    """The model call raises ``ConnectionError(message)`` (a provider failure)."""

    message: str = "provider down"


@attrs.frozen
class Garbage:
    """The model returns ``value``, which is not a usable ``ModelResponse``."""

    value: Any = None


Item = Turn | Raise | Garbage


class ScenarioModel:
    """Plays a script of items with fresh tool-call ids, looping if asked, and records every outcome.

    A call offered no tools is a finalize call; it is answered with ``finale``
    (when given) instead of the next item, as a real model would answer that
    request differently.  ``given`` holds the messages handed to the engine
    (every one must appear in the result); ``outcomes`` what each call
    produced (a response, a raised exception, or garbage); ``offered`` how many
    tools each call was shown.
    """

    def __init__(self, items: Sequence[Item], *, loop: bool = False, finale: Item | None = None) -> None:
        self.items = tuple(items)
        self.loop = loop
        self.finale = finale
        self._played = 0
        self.calls = 0
        self.on_first_call: Callable[[], None] | None = None
        self.given: list[Message] = []
        # The 0-based call that gave each message: a step's index is the model turn, failed calls included.
        self.given_at: list[int] = []
        self.outcomes: list[object] = []
        self.offered: list[int] = []
        self._ids = 0

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        """Return (or raise) the next item of the script."""
        self.calls += 1
        if self.calls == 1 and self.on_first_call is not None:
            self.on_first_call()
        self.offered.append(len(tools))
        n = self._played
        if not tools and self.finale is not None:
            item = self.finale
        elif n < len(self.items) or (self.loop and self.items):
            self._played += 1
            item = self.items[n % len(self.items)]
        else:
            exhausted = ScriptExhaustedError(f"script of {len(self.items)} item(s) exhausted at call {self.calls}")
            self.outcomes.append(exhausted)
            raise exhausted
        if isinstance(item, Raise):
            error = ConnectionError(item.message)
            self.outcomes.append(error)
            raise error
        if isinstance(item, Garbage):
            self.outcomes.append(item.value)
            if well_formed(item.value):
                # Well-formed but with usage nobody can count: the reply is kept, the run stops on model_error.
                self.given.append(item.value.message)
                self.given_at.append(self.calls - 1)
            return item.value  # type: ignore[no-any-return]
        calls = tuple(self._tool_call(call) for call in item.calls)
        response = ModelResponse(Message("assistant", item.content, calls), item.stop_reason, item.usage)
        self.given.append(response.message)
        self.given_at.append(self.calls - 1)
        self.outcomes.append(response)
        return response

    def _tool_call(self, call: Call) -> ToolCall:
        self._ids += 1
        return ToolCall(f"call_{self._ids}", call.name, call.arguments, call.raw)


# --- what the tools do -------------------------------------------------------------------------------------


class RecordingRegistry(ToolRegistry):
    """A registry that remembers every call it executed and the result it gave, in order."""

    def __init__(self, *, max_output_chars: int | None = OUTPUT_CAP) -> None:
        super().__init__(max_output_chars=max_output_chars)
        self.executed: list[tuple[ToolCall, ToolResult]] = []

    def execute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """Execute and record."""
        outcome = super().execute(call, timeout)
        self.executed.append((call, outcome))
        return outcome

    async def aexecute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """Execute for the async driver and record, in the order the calls finish."""
        outcome = await super().aexecute(call, timeout)
        self.executed.append((call, outcome))
        return outcome


def _cyclic() -> list[Any]:
    loop: list[Any] = []
    loop.append(loop)
    return loop


ODD_VALUES: dict[str, Callable[[], Any]] = {
    "set": lambda: {1, 2},
    "nan": lambda: float("nan"),
    "bytes": lambda: b"raw",
    "object": object,
    "cyclic": _cyclic,
    "none": lambda: None,
    "nested_error": lambda: {"log": {"error": "only nested"}},
    "error_word": lambda: "error: none at all",
    "int_keys": lambda: {1: "one"},
    "big": lambda: "x" * (OUTPUT_CAP + 57),
}
"""Odd return values: not JSON (error results), JSON that looks like an error (successes), and output over the cap."""


def make_registry(clock: ManualClock, tokens: list[CancelToken]) -> RecordingRegistry:
    """The tools of generated cases: succeed, fail, raise, return odd values, change over time, move the clock."""
    registry = RecordingRegistry()
    ticks = iter(range(1, 10**9))

    @registry.register
    def echo(text: str) -> str:
        """Return the text."""
        return text

    @registry.register
    def add(a: float, b: float) -> float:
        """Add two numbers."""
        return a + b

    @registry.register
    def fail(reason: str = "always fails") -> dict[str, str]:
        """Report an error."""
        return {"error": reason}

    @registry.register
    def boom() -> None:
        """Raise."""
        raise RuntimeError("kaput")

    @registry.register
    def odd(kind: str) -> Any:
        """Return an odd value."""
        return ODD_VALUES[kind]()

    @registry.register
    def tick() -> int:
        """A new number every call: progress, never a cycle."""
        return next(ticks)

    @registry.register
    def slow(seconds: int) -> str:
        """Take ``seconds`` on the run's clock."""
        clock.advance(seconds)
        return "slept"

    @registry.register
    def cancel_now() -> str:
        """Cancel the run (its latest token) from inside a tool, as another thread would."""
        tokens[-1].cancel("a tool pressed stop")
        return "cancelled"

    return registry


# --- user-defined stops, with their independent twins ------------------------------------------------------


def no_boom(view: RunView) -> bool:
    """The next call is ``boom``."""
    return bool(view.pending) and view.pending[0].name == "boom"


def gave_up(view: RunView) -> bool:
    """The model said it gives up."""
    return view.last_response is not None and "give up" in view.last_response.message.content


def five_calls(view: RunView) -> bool:
    """Five tool calls have run."""
    return view.counters["tool_calls"][0] >= 5  # type: ignore[operator]


USER_STOPS = {
    "no_boom": StopCondition("boom_blocked", "Dispatch", no_boom, "never run boom"),
    "gave_up": StopCondition("model_gave_up", "AwaitModel", gave_up),
    "five_calls": StopCondition("enough_calls", "ExecuteTool", five_calls),
}


# --- cases -------------------------------------------------------------------------------------------------


@attrs.frozen
class Case:
    """Everything a generated run depends on; ``build`` makes fresh objects from it each time."""

    items: tuple[Item, ...]
    loop: bool = False
    finale: Item | None = None
    options: dict[str, Any] = attrs.field(factory=dict)
    user_stops: tuple[str, ...] = ()
    cancel_first: bool = False
    system: str = ""

    @property
    def policies(self) -> dict[str, str]:
        """The ``on_stop`` policies of the case."""
        return dict(self.options.get("on_stop") or {})


@attrs.define
class Setup:
    """One case made concrete: the agent and the recording model, registry, clock and token behind it."""

    case: Case
    agent: Agent
    model: ScenarioModel
    registry: RecordingRegistry
    clock: ManualClock
    tokens: list[CancelToken]
    """Cancel tokens handed to the run so far; a resumed run gets a fresh one, the last."""

    @property
    def token(self) -> CancelToken:
        """The token of the current run."""
        return self.tokens[-1]

    def start(self) -> AgentRun:
        """Start the run of this setup (nothing is called yet)."""
        return self.agent.start(USER_INPUT, cancel=self.token)


def build(case: Case) -> Setup:
    """A fresh agent, model, registry, clock and token for ``case``."""
    clock = ManualClock()
    token = CancelToken()
    tokens = [token]
    registry = make_registry(clock, tokens)
    model = ScenarioModel(case.items, loop=case.loop, finale=case.finale)
    if case.cancel_first:
        # Cancelled while the first reply is being written: seen at the next check, before any tool runs.
        model.on_first_call = lambda: token.cancel("cancelled during the first model call")
    stops = [USER_STOPS[name] for name in case.user_stops]
    agent = Agent(model, registry, case.system, clock=clock, stop_conditions=stops, **case.options)
    return Setup(case, agent, model, registry, clock, tokens)


def transition_bound(case: Case) -> int:
    """The most transitions a run of ``case`` may take, from its limits and the calls per turn alone.

    Per model call: one edge out of AwaitModel, one out of CheckTruncation and
    one out of Dispatch; per tool call one more out of Dispatch and one out of
    ExecuteTool.  ``max_steps`` bounds the model calls, plus one finalize call.
    """
    model_calls = case.options.get("max_steps", 8) + 1
    return model_calls * (3 + 2 * MAX_CALLS_PER_TURN)


# --- strategies --------------------------------------------------------------------------------------------


def _pick(low: int, high: int) -> st.SearchStrategy[int]:
    """A uniform integer in [low, high]; ``st.integers`` draws its lower bound a third of the time, too often here."""
    return st.sampled_from(range(low, high + 1))


GOOD_CALLS = st.one_of(
    st.builds(Call, st.just("echo"), st.fixed_dictionaries({"text": st.sampled_from("abc")})),
    # Either key order: the same call written two ways must count as a repeat.
    st.builds(
        lambda a, b, flip: Call("add", {"b": b, "a": a} if flip else {"a": a, "b": b}),
        _pick(0, 2),
        st.sampled_from([1, 2.5]),
        st.booleans(),
    ),
    st.just(Call("tick")),
)
BAD_CALLS = st.sampled_from(
    [
        Call("fail", {"reason": "quota"}),
        Call("boom"),
        Call("nope"),
        Call("add", {"a": "1", "b": 2}),
        Call("echo"),
        Call("echo", {"text": "a", "extra": 1}),
        Call("echo", {}, raw='["a"]'),  # a model's JSON that is no object, as the adapters keep it
        Call("echo", {1: "a"}),
        Call("echo", {}, raw='{"text": "a'),
    ]
)
ODD_CALLS = st.builds(Call, st.just("odd"), st.fixed_dictionaries({"kind": st.sampled_from(sorted(ODD_VALUES))}))
SLOW_CALLS = st.builds(Call, st.just("slow"), st.fixed_dictionaries({"seconds": st.sampled_from([1, 3, 10])}))
UNKNOWN_STOP_REASONS = ("pause_turn", "content_filter", "")
CONTENTS = st.sampled_from(["", "thinking", "the answer is 42", "let me see", "I give up", "hm"])


@st.composite
def calls(draw: st.DrawFn, *, clock_tools: bool = True) -> Call:
    """A tool call from a small pool, so repeats and cycles are common: good, failing, odd, and clock-moving ones."""
    kind = draw(_pick(0, 9))
    if kind in (6, 7, 8) and clock_tools:
        return draw(SLOW_CALLS)
    if kind in (4, 5):
        return draw(BAD_CALLS)
    if kind == 3:
        return draw(ODD_CALLS)
    return draw(GOOD_CALLS)


@st.composite
def turns(draw: st.DrawFn, *, clock_tools: bool = True, odd_stops: bool = True) -> Turn:
    """A reply: mostly a well-formed tool turn or answer, sometimes truncated, refused or with an unknown reason."""
    # Mostly tool turns, so runs get far enough for the limits; an answer ends a run at once.
    size = draw(st.sampled_from([0, 1, 1, 1, 2, 2, MAX_CALLS_PER_TURN]))
    asked = tuple(draw(calls(clock_tools=clock_tools)) for _ in range(size))
    if clock_tools and asked and draw(_pick(0, 19)) == 7:
        asked = (*asked[:-1], Call("cancel_now"))
    fitting = "tool_use" if asked else draw(st.sampled_from(["end_turn", "stop_sequence"]))
    odd = ("max_tokens", "refusal") * 2 + UNKNOWN_STOP_REASONS if odd_stops else ("max_tokens",)
    stop_reason = draw(st.sampled_from(odd)) if draw(_pick(0, 9)) == 4 else fitting
    # Round figures, so the total often lands exactly on a budget (the boundary the guard must get right).
    tens = st.sampled_from([0, 10, 20, 30])
    usage = draw(st.none() | st.builds(Usage, tens, tens))
    return Turn(draw(CONTENTS), asked, stop_reason, usage)


@st.composite
def items(draw: st.DrawFn, *, clock_tools: bool = True, odd_models: bool = True) -> Item:
    """A script item: usually a reply; with ``odd_models`` sometimes an exception or a non-response."""
    kind = draw(_pick(0, 39)) if odd_models else 0
    if kind == 38:
        return draw(st.builds(Raise, st.sampled_from(["provider down", "rate limited"])))
    if kind == 39:
        return draw(st.builds(Garbage, st.sampled_from(GARBAGE)))
    return draw(turns(clock_tools=clock_tools, odd_stops=odd_models))


def scripts(*, clock_tools: bool = True, odd_models: bool = True) -> st.SearchStrategy[tuple[Item, ...]]:
    """A model script of one to six items (an empty one is the same as one that is exhausted at once)."""
    return st.lists(items(clock_tools=clock_tools, odd_models=odd_models), min_size=1, max_size=6).map(tuple)


def cycling_scripts() -> st.SearchStrategy[tuple[Item, ...]]:
    """Two or three different calls, one per turn: looped, the model goes round in a circle."""
    one = st.sampled_from([Call("echo", {"text": t}) for t in "abc"] + [Call("add", {"a": 1, "b": 2}), Call("boom")])
    return st.lists(one, min_size=2, max_size=3, unique_by=repr).map(
        lambda round_: tuple(Turn(calls=(call,), stop_reason="tool_use") for call in round_)
    )


GARBAGE = (
    None,
    "plain text",
    {"role": "assistant"},
    ModelResponse("hi"),  # type: ignore[arg-type]
    ModelResponse(Message("assistant", "x"), usage=(1, 2)),  # type: ignore[arg-type]
    ModelResponse(Message("assistant", "", ("echo",)), "tool_use"),  # type: ignore[arg-type]
)
"""What a broken model or adapter returns instead of a usable ``ModelResponse``."""


def well_formed(response: object) -> bool:
    """A ``ModelResponse`` whose insides have the documented types (anything else is a model error)."""
    return (
        isinstance(response, ModelResponse)
        and isinstance(response.message, Message)
        and isinstance(response.message.content, str)
        and response.message.role == "assistant"
        and all(isinstance(call, ToolCall) and isinstance(call.arguments, dict) for call in response.message.tool_calls)
    )


def countable(usage: object) -> bool:
    """Usage a token budget can count: none, or whole numbers up to 2**53 - 1 (else the run stops, reply kept)."""
    if usage is None:
        return True
    return isinstance(usage, Usage) and all(
        type(n) is int and 0 <= n < 2**53 for n in (usage.input_tokens, usage.output_tokens)
    )


OTHER_REASONS = ("model_error", "max_tokens", "refusal", "tool_failures", "cancelled")
"""The stops a policy of raise or return applies to (finalize_failed takes none: it only labels an edge)."""


@st.composite
def cases(draw: st.DrawFn) -> Case:
    """Any case: every limit, policy and user stop may be set, and the model and tools misbehave in every way."""
    options: dict[str, Any] = {
        "max_steps": draw(_pick(1, 10)),
        "max_consecutive_failures": draw(_pick(1, 4)),
        "cycle_window": draw(st.sampled_from([0, 4, 6, 8])),
        "timeout": draw(st.none() | _pick(1, 8)),
        "token_budget": draw(st.none() | st.sampled_from(range(10, 130, 10))),
        "max_tool_calls": draw(
            st.none() | _pick(1, 12) | st.fixed_dictionaries({"echo": _pick(0, 4)}, optional={"*": _pick(2, 12)})
        ),
    }
    # One draw per reason: dictionaries() would mostly be empty, and finalize edges would rarely be taken.
    on_stop = {reason: draw(st.sampled_from(["raise", "finalize", "return", "finalize"])) for reason in FINALIZABLE}
    on_stop |= {reason: draw(st.sampled_from(["raise", "return"])) for reason in OTHER_REASONS}
    options["on_stop"] = {reason: policy for reason, policy in on_stop.items() if policy != "raise"}
    return Case(
        items=draw(cycling_scripts() if draw(_pick(0, 3)) == 0 else scripts()),
        # Looping scripts never converge by themselves: they are what repeats, cycles and limits must stop.
        loop=draw(_pick(0, 3)) > 0,
        finale=draw(st.one_of(st.none(), st.builds(Turn, CONTENTS), items(), st.builds(Turn, CONTENTS))),
        options=options,
        user_stops=tuple(draw(st.lists(st.sampled_from(sorted(USER_STOPS)), unique=True, max_size=2))),
        cancel_first=draw(_pick(0, 19)) == 7,
        system=draw(st.sampled_from(["", "be brief"])),
    )


# --- the shadow: an independent account of a run, and the edge it predicts ---------------------------------


LIFTABLE = {
    "max_steps": "steps_exhausted",
    "token_budget": "budget_spent",
    "cost_budget": "cost_spent",
    "timeout": "deadline_passed",
    "max_tool_calls": "stopped_call_capped",
    "cancelled": "is_cancelled",
}
"""Stops a resume may lift, by the guard that must no longer hold (as documented on ``Agent.resume``)."""


def call_key(call: ToolCall) -> tuple[str, str, str]:
    """What makes two calls the same action: the name and the arguments, key order aside."""
    if call.raw_arguments is not None:
        return call.name, "raw", call.raw_arguments
    try:
        return call.name, "json", json.dumps(call.arguments, sort_keys=True)
    except (TypeError, ValueError):
        return call.name, "repr", repr(call.arguments)


def cycle_period(window: Sequence[tuple[Any, str]]) -> int:
    """The shortest p >= 2 such that the last p (call, result) pairs repeat the p before, not all alike; else 0."""
    n = len(window)
    for period in range(2, n // 2 + 1):
        block = list(window[n - period :])
        if list(window[n - 2 * period : n - period]) == block and len(set(block)) > 1:
            return period
    return 0


class Shadow:
    """The test's own account of one run, kept from what the model and tools did, never from the run's counters."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.limits = setup.agent.limits
        self.policies = setup.agent.on_stop
        self.started = setup.clock.now
        self.model_calls = 0
        self.late = False  # whether the deadline had passed when the current advance() began
        self.called_off = False  # whether the token was cancelled when the current advance() began
        self.last: ModelResponse | None = None
        self.pending: list[ToolCall] = []
        self.executed: list[tuple[ToolCall, ToolResult]] = []
        self.streak = 0
        self.tokens = 0
        # The cases give no prices: a reply's own usage.cost is all that is priced.
        self.cost = 0.0
        self.finalizing: str | None = None
        # The tool of the call max_tool_calls stopped: a finalize answers it, so no pending call names it then.
        self.capped: str | None = None
        # The reason on the edge that ended the run: a finalize call's cut, where the run keeps the stop it answers.
        self.cut: str | None = None
        # The stop a resume continues from, and whether it retries the model.
        self.stopped: str | None = None
        self.retry = False
        self.elapsed_at_stop = 0.0
        # The token a resume is about to hand over, while its edge is predicted.
        self.trial_token: CancelToken | None = None

    # Guards, evaluated on the shadow.  Keyed by guard name; a new guard in the table needs its twin here.
    def guard(self, name: str) -> bool:
        """Whether the guard called ``name`` holds, by the shadow's own account."""
        limits = self.limits
        last, pending, executed = self.last, self.pending, self.executed
        checks: dict[str, Callable[[], bool]] = {
            "is_truncated": lambda: last is not None and last.stop_reason == "max_tokens",
            "is_refusal": lambda: last is not None and last.stop_reason == "refusal",
            "has_no_tool_calls": lambda: last is not None and not last.message.tool_calls,
            "output_invalid": lambda: False,  # generated agents have no output_type
            "context_overflowed": lambda: False,  # generated models fail with ConnectionError only
            "compacts_history": lambda: False,
            "passes_child_stop": lambda: False,  # generated agents have no sub-agents
            "output_rejected": lambda: False,
            "asks_tools_while_finalizing": lambda: self.finalizing is not None,
            "hook_raised": lambda: False,  # generated agents have no hooks
            "condition_raised": lambda: False,  # generated stop conditions never raise
            "is_cancelled": lambda: (self.trial_token or self.setup.token).cancelled,
            "deadline_passed": lambda: (
                limits.timeout is not None and self.setup.clock.now - self.started >= limits.timeout
            ),
            "repeats_last_call": lambda: bool(executed) and call_key(pending[0]) == call_key(executed[-1][0]),
            "tool_calls_exhausted": lambda: self.cap_hit() is not None,
            "stopped_call_capped": lambda: self.cap_hit(pending[0].name if pending else self.capped) is not None,
            "failures_exhausted": lambda: self.streak >= limits.max_consecutive_failures,
            "is_cycling": lambda: limits.cycle_window >= 4 and cycle_period(self.window()) > 0,
            "has_pending_calls": lambda: bool(pending),
            "budget_spent": lambda: limits.token_budget is not None and self.tokens >= limits.token_budget,
            "cost_spent": lambda: limits.cost_budget is not None and self.cost >= limits.cost_budget,
            "steps_exhausted": lambda: self.model_calls >= limits.max_steps,
            "no_boom": lambda: bool(pending) and pending[0].name == "boom",
            "gave_up": lambda: last is not None and "give up" in last.message.content,
            "five_calls": lambda: len(executed) >= 5,
            "resumes_before_tool": lambda: bool(pending) and self.lifted(),
            "resumes_before_answer": lambda: False,  # generated agents have no output_type: an answer is taken at once
            "resumes_output_retry": lambda: False,  # nor is an answer ever sent back
            "resumes_before_model": lambda: not pending and self.lifted() and self.model_call_allowed(),
            "retries_model_call": lambda: self.stopped == "model_error" and self.retry and self.model_call_allowed(),
            "resumes_finalize": lambda: self.finalizing is not None and self.finalize_cut_lifted(),
        }
        if name not in checks:
            msg = f"guard {name!r} has no independent twin in tests/support/scenarios.py Shadow.guard; add one"
            raise AssertionError(msg)
        return checks[name]()

    def model_call_allowed(self) -> bool:
        """No stop checked before a model call holds (several can hold at once; a stop records only the first)."""
        return not any(
            self.guard(name)
            for name in ("is_cancelled", "deadline_passed", "budget_spent", "cost_spent", "steps_exhausted")
        )

    def lifted(self) -> bool:
        """The stop being resumed no longer holds under the resumed run's limits and token."""
        guard = LIFTABLE.get(self.stopped or "")
        return guard is not None and not self.guard(guard)

    def finalize_cut_lifted(self) -> bool:
        """The finalize call's cut no longer holds: ``retry=True`` for a model error, else its guard is false now."""
        if self.cut == "model_error":
            return self.retry
        guard = LIFTABLE.get(self.cut or "")
        return guard is not None and not self.guard(guard)

    def resume(self, reason: str, limits: Limits, token: CancelToken, *, retry: bool) -> Row | None:
        """The resume edge ``Agent.resume`` must take from stop ``reason`` with ``limits``; None if it must refuse.

        The shadow follows the resume only if there is one (the caller then makes ``token`` the setup's).
        """
        before = (self.limits, self.stopped, self.retry, self.started)
        self.limits, self.stopped, self.retry = limits, reason, retry
        # A snapshot keeps the seconds used, not the wall time, so time spent stopped does not count.
        self.started = self.setup.clock.now - self.elapsed_at_stop
        rows = self.setup.agent.table.rows_from(State.Failed, RESUME)
        self.trial_token = token
        try:
            row = next((r for r in rows if r.guard_name is not None and self.guard(r.guard_name)), None)
        finally:
            self.trial_token = None
        if row is None:
            self.limits, self.stopped, self.retry, self.started = before
            return None
        if row.guard_name != "resumes_finalize":  # made again, the finalize call still answers its stop
            self.finalizing = None
        if row.dest is State.AwaitModel:
            # Calls of a reply that is retried never ran; they are answered before the model is called again.
            self.pending = []
        return row

    def window(self) -> list[tuple[tuple[str, str, str], str]]:
        """The (call, result) pairs the cycle guard may look back over."""
        window = self.limits.cycle_window
        return [(call_key(call), outcome.content) for call, outcome in self.executed[-window:]] if window else []

    def cap_hit(self, name: str | None = None) -> tuple[str, int, int] | None:
        """``(scope, used, cap)`` of the cap one more call of tool ``name`` (default: the next) would exceed, if any."""
        caps = self.limits.max_tool_calls
        if name is None and self.pending:
            name = self.pending[0].name
        if caps is None or name is None:
            return None
        total = len(self.executed)
        if isinstance(caps, int):
            return ("*", total, caps) if total >= caps else None
        used = sum(1 for call, _ in self.executed if call.name == name)
        if name in caps and used >= caps[name]:
            return name, used, caps[name]
        if "*" in caps and total >= caps["*"]:
            return "*", total, caps["*"]
        return None

    def observe(self, before: State) -> str:
        """Take in the I/O the run just did from state ``before``; return the trigger it must have fired."""
        if before is State.AwaitModel:
            start = self.setup.agent.table.rows_from(State.AwaitModel, START)
            if self.model_calls == 0 and self.setup.model.calls == 0:
                assert any(self.guard(str(row.guard_name)) for row in start), "no model call, yet no start row held"
                return START
            if self.late:
                assert self.setup.model.calls == self.model_calls, "no model call once the deadline passed"
                return EXPIRED
            if self.called_off:
                assert self.setup.model.calls == self.model_calls, "no model call once the token was cancelled"
                return INTERRUPTED
            self.model_calls += 1
            assert self.setup.model.calls == self.model_calls, "one advance() makes at most one model call"
            outcome = self.setup.model.outcomes[-1]
            if not isinstance(outcome, ModelResponse) or not well_formed(outcome):
                return MODEL_FAILED
            # A usable reply is kept with its calls and tokens, even when its stop_reason is then a model_error.
            self.pending = list(outcome.message.tool_calls)
            if not countable(outcome.usage):
                return MODEL_FAILED
            if outcome.usage is not None:
                self.tokens += outcome.usage.total
                self.cost += outcome.usage.cost or 0.0
            if outcome.stop_reason not in STOP_REASONS:
                return MODEL_FAILED
            self.last = outcome
            return REPLIED
        if before is State.ExecuteTool:
            if self.late:
                assert len(self.setup.registry.executed) == len(self.executed), "no tool call once the deadline passed"
                return EXPIRED
            if self.called_off:
                assert len(self.setup.registry.executed) == len(self.executed), "no tool call once cancelled"
                return INTERRUPTED
            assert len(self.setup.registry.executed) == len(self.executed) + 1, "one advance() runs exactly one tool"
            call, outcome = self.setup.registry.executed[-1]
            assert call == self.pending.pop(0), "tools run in the order the model asked for them"
            self.executed.append((call, outcome))
            self.streak = self.streak + 1 if outcome.error is not None else 0
            return TOOL_DONE
        return {State.CheckTruncation: CHECK, State.Dispatch: DISPATCH}[before]

    def out_of_time(self) -> bool:
        """The deadline passed before the call this state needs, so the driver must not make it (finalize excepted)."""
        return self.finalizing is None and self.guard("deadline_passed")

    def expected_row(self, state: State, trigger: str) -> Row:
        """The row the run must take: the first whose guard holds, or its finalize edge if the policy says so."""
        table = self.setup.agent.table
        row = next(r for r in table.rows_from(state, trigger) if r.guard_name is None or self.guard(r.guard_name))
        # No last call before the first one, nor after a call abandoned at the deadline: its answer never came.
        finalizable = row.reason is not None and row.trigger not in (START, EXPIRED, INTERRUPTED)
        finalizable = finalizable and bool(table.rows_from(state, FINALIZE))
        if finalizable and self.policies.get(str(row.reason)) == "finalize" and self.finalizing is None:
            label = f"finalize_on_{row.reason}"
            return next(r for r in table.rows_from(state, FINALIZE) if r.guard_name == label)
        return row

    def check_edge(self, before: State, advance: Callable[[], Transition]) -> None:
        """Assert the run takes the predicted edge in one ``advance()`` from ``before``; then follow it."""
        self.late = self.out_of_time()  # judged before the call: a tool may move the clock past the deadline
        self.called_off = self.guard("is_cancelled")  # read again by the driver just before the call, as the deadline
        taken = advance()
        row = self.expected_row(before, self.observe(before))
        assert as_row(taken) == as_row(row), f"from {before}: expected {row}, the run took {edge_name(taken)}"
        if "max_tool_calls" in (row.reason, row.guard_name and row.guard_name.removeprefix("finalize_on_")):
            self.capped = self.pending[0].name  # the stopped call: a finalize answers it, a resume asks of it
        if row.trigger == FINALIZE:
            self.finalizing = row.guard_name.removeprefix("finalize_on_")  # type: ignore[union-attr]
            self.pending = []
        if row.dest in self.setup.agent.table.terminal:
            self.elapsed_at_stop = self.setup.clock.now - self.started
            self.cut = row.reason


def as_row(edge: Row | Transition) -> tuple[str, str, str, str | None, str | None]:
    """A table row or trace entry as plain strings, so the two compare."""
    guard = edge.guard_name if isinstance(edge, Row) else edge.guard
    return str(edge.source), edge.trigger, str(edge.dest), guard, edge.reason


def edge_name(edge: Transition) -> str:
    """``Source->Dest[label]`` of a trace entry, for messages."""
    label = edge.reason or edge.guard
    return f"{edge.source}->{edge.dest}" + (f"[{label}]" if label else "")


def walk(setup: Setup) -> tuple[AgentRun, Shadow]:
    """Advance a run of ``setup`` one transition at a time, checking each edge against the shadow's prediction."""
    run = setup.start()
    shadow = Shadow(setup)
    bound = transition_bound(setup.case)
    for _ in range(bound):
        if run.done:
            break
        before = run.state
        shadow.check_edge(before, run.advance)
    assert run.done, f"the run did not finish within {bound} transitions, the bound its limits imply"
    return run, shadow


# --- invariants of a finished run --------------------------------------------------------------------------


def check_trace(agent: Agent, trace: Sequence[Transition], *, finished: bool = True) -> None:
    """The trace is a path through the agent's table: every entry a row, each starting where the last ended."""
    rows = {as_row(row) for row in agent.table.rows}
    assert rows >= {as_row(row) for row in TABLE.rows}, "user stops add rows to the default table, never remove any"
    if not trace:
        assert not finished, "a finished run took at least one transition"
        return
    assert trace[0].source == str(agent.table.initial)
    for entry in trace:
        assert as_row(entry) in rows, f"{edge_name(entry)} is not a row of the agent's table"
    for earlier, later in pairwise(trace):
        assert earlier.dest == later.source, f"{edge_name(earlier)} is followed by {edge_name(later)}"
    terminal = {str(state) for state in agent.table.terminal}
    for earlier, later in pairwise(trace):
        # A stop is the end of the path unless Agent.resume took a resume edge out of it.
        assert earlier.dest not in terminal or later.trigger == RESUME, f"{edge_name(later)} after a stop"
    assert (trace[-1].dest in terminal) == finished


def is_not_executed_note(message: Message) -> bool:
    """The engine's answer to a call it will never execute (a finalize or a retried model call comes first)."""
    try:
        error = json.loads(message.content).get("error", "")
    except (ValueError, AttributeError):
        return False
    return isinstance(error, str) and error.startswith("not executed: ")


def finalize_reasons(trace: Sequence[Transition]) -> list[str]:
    """The stops answered by a finalize call, in the order their edges were taken."""
    return [t.guard.removeprefix("finalize_on_") for t in trace if t.trigger == FINALIZE and t.guard]


def finalize_calls_again(trace: Sequence[Transition]) -> int:
    """The finalize calls a resume made again after they failed (``retry=True``): one model call more each."""
    made_again = [i for i, t in enumerate(trace) if t.guard == "resumes_finalize" and i]
    return sum(1 for i in made_again if trace[i - 1].trigger == MODEL_FAILED)


def check_nothing_lost(setup: Setup, result: RunResult) -> None:
    """Every model message is kept, every executed call has one tool message right after its assistant message."""
    check_conversation(
        setup,
        result.messages,
        result.steps,
        result.pending,
        trace=result.trace,
        done=result.trace[-1].dest == str(State.Done),
    )


def check_conversation(
    setup: Setup,
    messages: Sequence[Message],
    steps: Sequence[Step],
    pending: Sequence[ToolCall],
    *,
    trace: Sequence[Transition],
    done: bool,
) -> None:
    """The conversation so far accounts for everything the model asked and the tools did; also mid-run."""
    finalized = iter(finalize_reasons(trace))
    model, registry = setup.model, setup.registry
    head = ([Message("system", setup.case.system)] if setup.case.system else []) + [Message("user", USER_INPUT)]
    assert list(messages[: len(head)]) == head
    body = list(messages[len(head) :])
    assert [m for m in body if m.role == "assistant"] == model.given, "every message the model gave is kept, in order"
    executed = iter(registry.executed)
    open_calls: tuple[ToolCall, ...] = ()
    open_message: Message | None = None
    turns = iter(model.given_at)
    tool_steps = iter(step for step in steps if step.kind == "tool_call")
    i = 0
    while i < len(body):
        message = body[i]
        i += 1
        assert not open_calls, f"calls {[c.id for c in open_calls]} were neither run nor answered"
        if message.role == "user":
            reason = next(finalized, None)
            assert reason is not None, "a user message mid-run is only the instruction of a finalize edge"
            assert message.content == FINALIZE_INSTRUCTION.format(reason=reason)
            open_message = None
            continue
        assert message.role == "assistant", f"unexpected {message.role} message"
        turn = next(turns)
        answers = []
        while i < len(body) and body[i].role == "tool":
            answers.append(body[i])
            i += 1
        asked = message.tool_calls
        assert [a.tool_call_id for a in answers] == [c.id for c in asked[: len(answers)]], "answers follow the asking"
        notes = [is_not_executed_note(a) for a in answers]
        assert notes == sorted(notes), "calls not executed are answered only after the executed ones"
        for call, answer, note in zip(asked, answers, notes, strict=False):
            if note:
                continue
            ran, outcome = next(executed)
            assert ran == call, "the registry ran exactly the calls answered, in order"
            assert answer.content == outcome.content
            step = next(tool_steps)
            assert (step.index, step.detail.split("(", 1)[0]) == (turn, call.name)
            assert step.detail.endswith(f" -> {outcome.content}")
        open_calls, open_message = asked[len(answers) :], message
    assert next(executed, None) is None, "a tool ran without its tool message"
    expected_pending = open_calls if open_message is not None else ()
    assert tuple(pending) == expected_pending, "pending is exactly the asked calls not yet run or answered"
    assert len(steps) == len(registry.executed) + done, "steps are the executed calls plus the final answer"
    if done:
        assert (steps[-1].kind, steps[-1].index) == ("final", model.calls - 1)


def _usage(model: ScenarioModel) -> Usage:
    """Tokens of every usable reply, whatever its stop_reason."""
    counted = [o for o in model.outcomes if isinstance(o, ModelResponse) and well_formed(o) and countable(o.usage)]
    usages = [r.usage for r in counted if r.usage]
    tokens = ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens")
    return Usage(
        *(sum(getattr(usage, name) for usage in usages) for name in tokens),
        cost=None if model.outcomes else 0.0,  # the cases give no prices: a run that made a call has no known cost
    )


def check_reason(setup: Setup, result: RunResult, limits: Limits | None = None) -> None:
    """The reason is the one the trace ends on (or the finalized one), and its evidence agrees with the record.

    ``limits`` are the run's last limits, when a resume changed them.
    """
    agent, model, registry = setup.agent, setup.model, setup.registry
    limits = limits or agent.limits
    last = result.trace[-1]
    resumes = [i for i, t in enumerate(result.trace) if t.trigger == RESUME]
    since_resume = result.trace[resumes[-1] + 1 :] if resumes else result.trace
    finalize = [t for t in since_resume if t.trigger == FINALIZE]
    assert len(finalize) <= 1, "finalize is taken at most once per run (or per resume)"
    if resumes and result.trace[resumes[-1]].guard == "resumes_finalize" and not finalize:
        # Resumed to make a finalize call a cancel left unmade: the run keeps the stop it was finalizing.
        finalize = [t for t in result.trace[: resumes[-1]] if t.trigger == FINALIZE][-1:]
    evidence = result.evidence
    json.dumps(evidence)
    assert result.usage == _usage(model)
    again = finalize_calls_again(result.trace)
    finalizes = len(finalize_reasons(result.trace)) + again
    assert model.calls <= limits.max_steps + finalizes, "max_steps bounds the model calls, plus the finalize calls"
    streaks = _streaks(registry.executed)
    limit = limits.max_consecutive_failures
    assert all(s < limit for s in streaks[:-1]), "the run went on after max_consecutive_failures failures"
    if streaks and streaks[-1] >= limit:
        assert last.reason == "tool_failures"
    for (a, _), (b, _) in pairwise(registry.executed):
        assert call_key(a) != call_key(b), "the same call was executed twice in a row"
    if finalize:
        reason = finalize_reasons(finalize)[0]
        assert (result.reason, result.ok) == (reason, False)
        assert agent.on_stop[reason] == "finalize"
        assert evidence["finalize"]["outcome"] == ("answered" if last.dest == "Done" else last.reason)
        # Unless a cancel came before the finalize call: then none was made (the run keeps its stop, the call owed).
        made = not (last.trigger == INTERRUPTED and not evidence.get("unfinished"))
        if made:
            assert model.offered[-1] == 0, "the finalize call is offered no tools"
        assert evidence["step"] == max(model.calls - (2 if made else 1) - again, 0)
    elif last.dest == str(State.Done):
        assert (result.reason, result.ok, evidence) == ("done", True, {})
        assert result.final == model.given[-1].content
        return
    else:
        assert (result.reason, result.ok) == (last.reason, False)
        assert evidence["step"] == max(model.calls - 1, 0)
    if resumes and result.trace[resumes[-1]].guard == "resumes_finalize" and result.reason in STOPPED_UNDER:
        # The finalize answers a stop taken before that resume, under the limit the run stopped under (the resume
        # raised it): the evidence names that limit, which the rest of its evidence is checked against.
        name, key = STOPPED_UNDER[result.reason]
        limits = attrs.evolve(limits, **{name: evidence[key]})
    _check_evidence(setup, result, limits, evidence)


STOPPED_UNDER = {
    "timeout": ("timeout", "timeout"),
    "max_steps": ("max_steps", "limit"),
    "token_budget": ("token_budget", "budget"),
    "cost_budget": ("cost_budget", "budget"),
}
"""A limit's stop: the ``Limits`` field it reads, and the evidence key that names the limit it stopped under."""


def _streaks(executed: Sequence[tuple[ToolCall, ToolResult]]) -> list[int]:
    streaks, streak = [], 0
    for _, outcome in executed:
        streak = streak + 1 if outcome.error is not None else 0
        streaks.append(streak)
    return streaks


def _check_evidence(setup: Setup, result: RunResult, limits: Limits, evidence: dict[str, Any]) -> None:
    reason, model, executed = result.reason, setup.model, setup.registry.executed
    last_outcome = model.outcomes[-1] if model.outcomes else None
    if reason == "model_error":
        if isinstance(last_outcome, BaseException):
            assert evidence["type"] == type(last_outcome).__name__
        elif well_formed(last_outcome):
            assert isinstance(last_outcome, ModelResponse)
            assert evidence["type"] == "ValueError"
            if countable(last_outcome.usage):
                assert f"unknown stop_reason {last_outcome.stop_reason!r}" in evidence["error"]
            else:
                assert evidence["error"].startswith("ModelResponse.usage")
        else:
            assert (evidence["type"], result.final) == ("TypeError", "")
            assert "expected" in evidence["error"], "the message says what was expected"
    elif reason in ("max_tokens", "refusal"):
        assert isinstance(last_outcome, ModelResponse)
        assert last_outcome.stop_reason == reason
        assert result.final == last_outcome.message.content
        assert result.pending == last_outcome.message.tool_calls
    elif reason == "repeated_action":
        asked = {c.id: c for m in model.given for c in m.tool_calls}[evidence["tool_call_id"]]
        assert call_key(asked) == call_key(executed[-1][0])
    elif reason == "tool_failures":
        assert evidence["failures"] == evidence["limit"] == limits.max_consecutive_failures
        assert all(outcome.error is not None for _, outcome in executed[-limits.max_consecutive_failures :])
        assert evidence["last_error"] == executed[-1][1].error
    elif reason == "cycle":
        window = [(call_key(c), o.content) for c, o in executed[-limits.cycle_window :]]
        assert evidence["period"] == cycle_period(window) > 0
    elif reason == "max_steps":
        # A finalize call may go one past the limit; a run resumed to execute that reply's calls then stops here.
        finalizes = len(finalize_reasons(result.trace))
        assert evidence["limit"] == limits.max_steps <= evidence["turns"] <= limits.max_steps + finalizes
        assert evidence["turns"] <= model.calls  # a finalize call made after the stop is not in its evidence
    elif reason == "token_budget":
        assert evidence["tokens"] >= evidence["budget"] == limits.token_budget
    elif reason == "cost_budget":
        assert evidence["cost"] >= evidence["budget"] == limits.cost_budget
    elif reason == "max_tool_calls":
        assert evidence["used"] >= evidence["limit"]
        used = [c for c, _ in executed if evidence["scope"] in ("*", c.name)]
        assert evidence["used"] == len(used)
    elif reason == "timeout":
        assert evidence["elapsed"] >= evidence["timeout"] == limits.timeout
    elif reason == "cancelled":
        assert setup.token.cancelled
    else:
        stop = next(s for s in setup.agent.stop_conditions if s.reason == reason)
        assert evidence["condition"] == stop.guard.__name__


def check_result(setup: Setup, result: RunResult, limits: Limits | None = None) -> None:
    """Every invariant of a finished run (``limits``: its last limits, if a resume changed them)."""
    check_trace(setup.agent, result.trace)
    check_nothing_lost(setup, result)
    check_reason(setup, result, limits)
