"""Property-based tests: whatever the model and tools do, a run stops, on a path of its table, losing nothing.

Hypothesis generates whole cases (``scenarios.cases``): scripts that mix
text, known and unknown tools, valid and invalid arguments, repeats and
cycles, every ``stop_reason`` and some unknown ones, usage, exceptions and
non-responses; tools that succeed, fail, raise, return odd values or move the
clock; and every limit, policy and user stop.  The budget comes from
``hypothesis_profiles`` (fixed in CI, large under ``make fuzz``).

Two tests check cost per step by counting work, never by timing it, and the
last checks that the generator reaches every row a synchronous run can take.
"""

from __future__ import annotations

import asyncio
import sys
import types
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest
import transitions
from hypothesis import given, settings
from support.hypothesis_profiles import PROFILE
from support.scenarios import USER_INPUT, Case, as_row, build, cases, check_result, check_trace, walk

import fsm_agent
from fsm_agent import TABLE, Agent, AgentLoopError, ModelResponse, RunResult, ToolCall
from fsm_agent.definition import guards as guards_module
from fsm_agent.definition.triggers import EXPIRED, INTERRUPTED, RESUME, START
from fsm_agent.testing import demo_registry, edge_id, reply, tool_turn
from fsm_agent.tools import ToolResult


def _run_to_the_end(case: Case) -> RunResult:
    """``Agent.run`` on a fresh build of ``case``: its result, or the result its ``AgentLoopError`` carries."""
    setup = build(case)
    raised: AgentLoopError | None = None
    try:
        result = setup.agent.run(USER_INPUT, cancel=setup.token)
    except AgentLoopError as exc:
        raised, result = exc, exc.result
    policy = setup.agent.on_stop.get(result.reason, "raise")
    if raised is not None:
        assert (raised.reason, raised.evidence) == (result.reason, result.evidence)
        assert policy != "return", "a 'return' policy hands the result back without raising"
        assert not result.ok
    else:
        assert result.ok or policy in ("return", "finalize"), "only a natural finish or a policy returns"
    return result


@PROFILE
@given(cases())
def test_every_run_takes_the_predicted_edges_and_ends_within_its_bound(case: Case) -> None:
    """Each transition is the first row whose guard holds (guards judged independently); the run ends in bound."""
    setup = build(case)
    run, shadow = walk(setup)
    assert run.state in (fsm_agent.State.Done, fsm_agent.State.Failed)
    check_trace(setup.agent, run.result.trace)
    assert len(shadow.executed) == len(setup.registry.executed)


@PROFILE
@given(cases())
def test_every_run_loses_nothing_and_its_reason_agrees_with_the_evidence(case: Case) -> None:
    """Messages, tool answers, steps, pending calls, usage and evidence all agree with what the model and tools did."""
    setup = build(case)
    run, _ = walk(setup)
    check_result(setup, run.result)


@PROFILE
@given(cases())
def test_the_same_case_runs_identically_twice_and_raises_only_agent_loop_error(case: Case) -> None:
    """Two runs of one case give equal results and traces, ids included; Agent.run raises only AgentLoopError."""
    setup = build(case)
    walked, _ = walk(setup)
    assert _run_to_the_end(case) == walked.result
    assert _run_to_the_end(case) == walked.result


# --- cost per step -----------------------------------------------------------------------------------------


class Distinct:
    """K tool turns with new arguments each (no repeat, no cycle), then an answer."""

    def __init__(self, k: int) -> None:
        self.k = k
        self.n = 0

    def complete(self, messages: object, tools: object) -> ModelResponse:
        """Ask for one more distinct echo, or answer after K."""
        self.n += 1
        if self.n > self.k:
            return reply("done")
        return tool_turn(ToolCall(f"c{self.n}", "echo", {"text": f"turn {self.n}"}))


ALL_LIMITS = {"timeout": 10**6, "token_budget": 10**9, "max_tool_calls": {"echo": 10**6, "*": 10**6}}


def _arun(case: Case, *, watched: bool) -> tuple[RunResult, list[tuple[ToolCall, ToolResult]]]:
    """``arun`` of ``case`` with no cancel token (one would take the per-transition loop), watched or not.

    One call of a batch at a time: ``tick`` answers in the order calls run, which threads would otherwise choose.
    """
    setup = build(case)
    agent = Agent(
        setup.model,
        setup.registry,
        case.system,
        clock=setup.clock,
        stop_conditions=setup.agent.stop_conditions,
        max_concurrency=1,
        **case.options,
    )
    seen: list[object] = []
    run = agent.start(USER_INPUT, observers=[seen.append] if watched else [])
    try:
        result = asyncio.run(run.afinish())
    except AgentLoopError as exc:
        result = exc.result
    assert bool(seen) is watched
    return result, setup.registry.executed


@PROFILE
@given(cases())
def test_the_async_driver_runs_a_case_alike_whether_or_not_anyone_watches(case: Case) -> None:
    """A run nobody watches has a loop of its own (``Stepper.moves``): the same result and calls as a watched one."""
    assert _arun(case, watched=False) == _arun(case, watched=True)


def _agent(k: int, window: int) -> Agent:
    return Agent(Distinct(k), demo_registry(), max_steps=k + 1, cycle_window=window, **ALL_LIMITS)  # type: ignore[arg-type]


def test_cycle_guard_looks_back_over_the_window_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """However long the run, the cycle guard is handed at most cycle_window calls, once per tool call."""
    seen: list[int] = []
    original = guards_module.find_cycle

    def counting(recent: object) -> int:
        seen.append(len(recent))  # type: ignore[arg-type]
        return original(recent)  # type: ignore[arg-type]

    monkeypatch.setattr(guards_module, "find_cycle", counting)
    run = _agent(300, 6).start("q")
    while not run.done:
        run.advance()
        assert len(run.recent) <= 6
    assert run.result.ok
    assert max(seen) == 6
    assert len(seen) <= 300


ENGINE_FILES = (str(Path(fsm_agent.__file__).parent), str(Path(transitions.__file__).parent))


@contextmanager
def _counting_lines() -> Iterator[list[int]]:
    """Count the Python lines executed in fsm_agent and transitions; C code (json, deque) is not counted."""
    count = [0]

    def local(frame: types.FrameType, event: str, arg: object) -> object:
        if event == "line":
            count[0] += 1
        return local

    def outer(frame: types.FrameType, event: str, arg: object) -> object:
        return local if frame.f_code.co_filename.startswith(ENGINE_FILES) else None

    previous = sys.gettrace()
    sys.settrace(outer)
    try:
        yield count
    finally:
        sys.settrace(previous)


def _lines_for(k: int) -> int:
    """The engine's lines in a run of ``k`` tool turns, every limit set, driven by ``advance()`` on this thread.

    ``run()`` with a timeout runs on a reused daemon worker, where this thread's trace sees nothing: counted that
    way, a run came to about 300 lines whatever its length, and the test compared nothing but noise.
    """
    agent = _agent(k, 6)
    with _counting_lines() as count:
        run = agent.start("q")
        while not run.done:
            run.advance()
    assert run.result.ok
    return count[0]


def test_engine_work_per_tool_turn_does_not_grow_with_the_run() -> None:
    """Lines executed per extra tool turn are the same at 64 and at 512 turns: no guard rescans the history."""
    _lines_for(1)  # the first run fills what every later run of any length finds (the table's walk, the schemas)
    small, middle, large = _lines_for(64), _lines_for(128), _lines_for(512)
    early = (middle - small) / 64
    late = (large - middle) / 384
    assert early > 100, f"{early:.1f} lines per tool turn: the trace does not see the engine"
    assert late == pytest.approx(early, rel=0.01), f"{early:.1f} lines per turn near 64 turns, {late:.1f} near 512"


@pytest.mark.slow
def test_generated_cases_take_every_row_a_sync_run_can_take() -> None:
    """The generator is not degenerate: across a fixed sample of cases every reachable row of the table is taken.

    Unreachable here by design: ``hook_error`` rows (generated agents have no
    hooks), the output check's rows (nor an ``output_type``: test_typed_answers.py), the
    context overflow's (their models fail with ConnectionError: test_long_runs.py), the
    child stop's (no sub-agents: test_sub_agents.py), the cost budget's (nothing is priced: test_cost_budget.py),
    ``interrupted`` rows (only the async driver is interrupted) and
    ``resume`` rows (``Agent.resume`` takes them; ``test_stateful.py`` does),
    ``expired`` rows (a call still in flight at the deadline: real time, in
    ``test_transitions.py``) and ``start`` rows (test_transitions.py and test_stops.py).
    """
    taken: set[tuple[str, str, str, str | None, str | None]] = set()

    @settings(max_examples=1200, derandomize=True, database=None, deadline=None)
    @given(cases())
    def collect(case: Case) -> None:
        run, _ = walk(build(case))
        taken.update(as_row(t) for t in run.result.trace)

    collect()
    elsewhere = {INTERRUPTED, RESUME, EXPIRED, START}
    unused = {
        "hook_raised",
        "output_invalid",
        "output_rejected",
        "context_overflowed",
        "compacts_history",
        "passes_child_stop",
        "cost_spent",
        "finalize_on_cost_budget",
    }
    reachable = [row for row in TABLE.rows if row.guard_name not in unused and row.trigger not in elsewhere]
    assert [edge_id(row) for row in reachable if as_row(row) not in taken] == []
