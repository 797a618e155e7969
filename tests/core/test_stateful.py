"""Stateful testing: runs advanced one transition at a time while the world outside changes between transitions.

Hypothesis interleaves ``run.advance()`` with what can happen between two
transitions of a real run (time passes; another thread cancels), with
snapshotting a run through JSON and carrying on with the resumed copy, with
resuming stopped runs under larger limits (``Agent.resume``), and with
starting further runs of the same agent.  After every step it checks that the
run is consistent: its trace a path of the table, each edge the one the
independent shadow predicts (resume edges included), its counters within
their limits, and nothing the model asked for or the tools did unaccounted
for.  The whole-run invariants of ``scenarios.check_result`` are checked as
soon as a run ends, and a run nothing outside touched must end exactly like
``Agent.run`` on the same case, snapshots and all.
"""

from __future__ import annotations

import json
from typing import Any

import attrs
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from support.hypothesis_profiles import PROFILE, progress
from support.scenarios import (
    USER_INPUT,
    Case,
    Setup,
    Shadow,
    as_row,
    build,
    cases,
    check_conversation,
    check_result,
    check_trace,
    edge_name,
    finalize_calls_again,
    finalize_reasons,
)

from fsm_agent import AgentLoopError, CancelToken, RunStateError, State
from fsm_agent.drivers.agent import AgentRun

RESUMABLE = ("max_steps", "token_budget", "cost_budget", "timeout", "max_tool_calls", "cancelled", "model_error")
"""Stops Agent.resume may continue (model_error only with retry=True); others must be refused."""


def _round_trips(snapshot: dict[str, Any]) -> bool:
    """JSON keeps the snapshot as it is (it would not keep a tool call's non-string keys, which no model sends)."""
    return bool(json.loads(json.dumps(snapshot)) == snapshot)


def _more_calls(caps: int | dict[str, int] | None, more: int) -> int | dict[str, int] | None:
    """The same caps with ``more`` room each; no cap stays no cap (here only limits that are set get more room)."""
    if caps is None:
        return None
    if isinstance(caps, int):
        return caps + more
    return {tool: cap + more for tool, cap in caps.items()}


class RunByRun(RuleBasedStateMachine):
    """One generated case at a time, advanced edge by edge, with outside events in between."""

    setup: Setup
    run: AgentRun
    shadow: Shadow
    disturbed: bool

    _tick = staticmethod(progress("TestRunByRun"))

    def _begin(self, case: Case) -> None:
        self._tick()  # one generated case, one example
        self.setup = build(case)
        self.run = self.setup.start()
        self.shadow = Shadow(self.setup)
        # Whether anything outside the case touched the run; an undisturbed run must equal Agent.run's.
        self.disturbed = False

    @initialize(case=cases())
    def start(self, case: Case) -> None:
        """Build a case and start its run (nothing is called yet)."""
        self._begin(case)

    @precondition(lambda self: not self.run.done)
    @rule()
    def advance(self) -> None:
        """One transition, which must be the edge the shadow predicts."""
        before = self.run.state
        self.shadow.check_edge(before, self.run.advance)

    # No precondition on the outside world: it acts on stopped runs too (which matters once they resume), and
    # fewer preconditions mean fewer rule draws that Hypothesis has to throw away.
    @rule(seconds=st.sampled_from([1, 3, 10]))
    def time_passes(self, seconds: int) -> None:
        """The clock moves between two transitions (a slow network, a busy machine) or while a run is stopped."""
        self.setup.clock.advance(seconds)
        self.disturbed = True

    @rule()
    def another_thread_cancels(self) -> None:
        """The run's cancel token is set between two transitions (again, if it already was)."""
        self.setup.token.cancel("another thread pressed stop")
        self.disturbed = True

    @precondition(lambda self: self.run.done)
    @rule()
    def a_finished_run_refuses_to_advance(self) -> None:
        """advance() on a finished run raises RunStateError and changes nothing."""
        before = (self.run.state, len(self.run.trace), self.run.result)
        with pytest.raises(RunStateError, match="already finished"):
            self.run.advance()
        assert (self.run.state, len(self.run.trace), self.run.result) == before

    @precondition(lambda self: self.run.done)
    @rule(case=cases())
    def start_another_run(self, case: Case) -> None:
        """A new case after the last one finished, so one machine walks several runs."""
        self._begin(case)

    @precondition(lambda self: not self.run.done and _round_trips(self.run.snapshot()))
    @rule()
    def snapshot_and_resume(self) -> None:
        """Snapshot between two transitions, through JSON text, into a new run object that carries on."""
        before = self.run
        resumed = self.setup.agent.resume(json.dumps(before.snapshot()), cancel=self.setup.token)
        assert (resumed.state, resumed.trace, resumed.messages, resumed.steps) == (
            before.state,
            before.trace,
            before.messages,
            before.steps,
        )
        assert (list(resumed.pending), resumed.counters()) == (list(before.pending), before.counters())
        # Nothing from outside: the resumed run must still end exactly like Agent.run on the same case.
        event("snapshot round trip")
        self.run = resumed

    @precondition(lambda self: self.run.state is State.Failed and self.run.result.reason in RESUMABLE)
    @rule(
        steps=st.sampled_from([0, 1, 3]),
        tokens=st.sampled_from([0, 100]),
        seconds=st.sampled_from([0, 20]),
        calls=st.sampled_from([0, 4]),
        retry=st.booleans(),
    )
    def resume_a_stopped_run(self, steps: int, tokens: int, seconds: int, calls: int, retry: bool) -> None:
        """Agent.resume with more room and a fresh token takes the predicted resume edge, or refuses if none holds."""
        stopped, limits = self.run.result, self.run.limits
        # Limits can be raised, never removed: only a limit that is set gets more room (0 = leave as is).
        overrides: dict[str, Any] = {
            "max_steps": steps and limits.max_steps + steps,
            "token_budget": tokens and limits.token_budget and limits.token_budget + tokens,
            "timeout": seconds and limits.timeout and limits.timeout + seconds,
            "max_tool_calls": calls and _more_calls(limits.max_tool_calls, calls),
        }
        overrides = {name: value for name, value in overrides.items() if value}
        token = CancelToken()
        expected = self.shadow.resume(stopped.reason, attrs.evolve(limits, **overrides), token, retry=retry)
        if expected is None:
            event("resume refused")
            with pytest.raises(ValueError, match="which these limits do not lift"):
                self.setup.agent.resume(stopped, retry=retry, cancel=token, **overrides)
            return
        resumed = self.setup.agent.resume(stopped, retry=retry, cancel=token, **overrides)
        self.setup.tokens.append(token)
        event(f"resumed {edge_name(resumed.trace[-1])}")
        assert as_row(resumed.trace[-1]) == as_row(expected)
        assert resumed.limits == self.shadow.limits
        self.run = resumed
        self.disturbed = True

    @invariant()
    def trace_is_a_path_of_the_table(self) -> None:
        """Every edge so far is a row, each starting where the last ended; the state is where the trace ends."""
        check_trace(self.setup.agent, self.run.trace, finished=self.run.done)
        expected = State(self.run.trace[-1].dest) if self.run.trace else self.setup.agent.table.initial
        assert self.run.state is expected

    @invariant()
    def counters_stay_within_their_limits(self) -> None:
        """A run still going has not run past any limit its guards enforce."""
        run, limits = self.run, self.run.limits
        assert run.turns == self.setup.model.calls
        assert run.tool_calls == len(self.setup.registry.executed)
        assert len(run.recent) <= max(limits.cycle_window, 1)
        if run.done:
            return
        assert run.failures < limits.max_consecutive_failures
        assert run.turns <= limits.max_steps + len(finalize_reasons(run.trace)) + finalize_calls_again(run.trace)
        caps = limits.total_tool_calls
        assert caps is None or run.tool_calls <= caps

    @invariant()
    def nothing_is_lost_so_far(self) -> None:
        """Messages, tool answers, steps and pending calls account for all the I/O so far."""
        run = self.run
        check_conversation(
            self.setup,
            run.messages,
            run.steps,
            run.pending,
            trace=run.trace,
            done=run.state is State.Done,
        )

    @invariant()
    def a_finished_run_satisfies_every_invariant(self) -> None:
        """Once in Done or Failed, the result passes every whole-run check."""
        if self.run.done:
            check_result(self.setup, self.run.result, self.run.limits)

    @invariant()
    def undisturbed_run_ends_like_agent_run(self) -> None:
        """Walked edge by edge with nothing from outside, a run ends exactly as Agent.run ends on the same case."""
        if not self.run.done or self.disturbed:
            return
        twin = build(self.setup.case)
        try:
            result = twin.agent.run(USER_INPUT, cancel=twin.token)
        except AgentLoopError as exc:
            result = exc.result
        assert result == self.run.result


class TestRunByRun(RunByRun.TestCase):  # type: ignore[name-defined]
    """Generated runs walked transition by transition, with outside events between, keep every invariant."""

    # About 40 steps fit two or three whole runs; longer walks mostly repeat the finished-run rules.
    settings = settings(PROFILE, stateful_step_count=40)
