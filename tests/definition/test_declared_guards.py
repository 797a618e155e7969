"""Guards as declarations: what each row reads and which limit bounds it, and every firing against ``transitions``.

The table answers, per row, the meters and facts its guard reads
(``Table.reads``), the ``Limits`` field that bounds it (``Table.bounds``) and
whether it is opaque (a user's check); and, per meter, the edges whose
outcome moves it (``Table.increments``).  The last tests hold every firing of
whole runs to the row the ``transitions`` library's own ``trigger()`` takes.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from fsm_agent import Agent, AgentLoopError, Limits, Message, RunResult, StopCondition, ToolRegistry
from fsm_agent.core import firing, stepper, walker
from fsm_agent.core.walker import library_machine
from fsm_agent.definition import table as table_module
from fsm_agent.definition.guards import STEPS, AtLimit, is_opaque
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.table import TABLE, Row, Table
from fsm_agent.definition.views import RunView
from fsm_agent.records import Usage
from fsm_agent.testing import FakeModel, demo_registry, edge_id, reply, tool_call, tool_turn

BOUNDED = {
    "max_steps": (("steps",), "max_steps"),
    "token_budget": (("tokens",), "token_budget"),
    "cost_budget": (("cost",), "cost_budget"),
    "tool_failures": (("failures",), "max_consecutive_failures"),
    "timeout": (("seconds",), "timeout"),
    "max_tool_calls": (("tool_calls", "calls_by_tool", "pending"), "max_tool_calls"),
    "cycle": (("recent",), "cycle_window"),
}
"""Each limit's stop: what its guard reads and the ``Limits`` field that bounds it."""

STOP_ROWS = [row for row in TABLE.rows if row.reason is not None and row.guard is not None]


@pytest.mark.parametrize("row", STOP_ROWS, ids=edge_id)
def test_each_guarded_stop_row_declares_what_it_reads_and_its_bound(row: Row) -> None:
    """A limit's row names its meter and Limits field; a fact's row names what it reads and has no bound."""
    assert not TABLE.opaque(row)
    assert TABLE.reads(row)
    if row.reason in BOUNDED:
        assert (TABLE.reads(row), TABLE.bounds(row)) == BOUNDED[row.reason], (
            f"{row.reason}'s guard declares reads {TABLE.reads(row)} and bound {TABLE.bounds(row)!r}; "
            "BOUNDED, written by hand, says otherwise"
        )
    else:
        assert TABLE.bounds(row) is None, (
            f"{row.reason}'s guard declares bound={TABLE.bounds(row)!r}: add it to BOUNDED, written by hand, as "
            f"{row.reason!r}: ({TABLE.reads(row)!r}, {TABLE.bounds(row)!r})"
        )


def test_every_guard_of_the_built_in_table_is_declared() -> None:
    """No built-in row is opaque: each guard says what it reads."""
    assert [edge_id(row) for row in TABLE.rows if TABLE.opaque(row)] == []
    assert all(TABLE.reads(row) for row in TABLE.rows if row.guard is not None)


def test_an_unguarded_row_reads_nothing_and_is_not_opaque() -> None:
    """A fallback has no guard: no reads, no bound, nothing opaque."""
    fallback = TABLE.rows_from(State.CheckTruncation, "check")[-1]
    assert (TABLE.reads(fallback), TABLE.bounds(fallback), TABLE.opaque(fallback)) == ((), None, False)


def test_steps_exhausted_is_steps_at_max_steps() -> None:
    """The max_steps row reads the steps meter (run.turns) against Limits.max_steps, as data."""
    (row,) = [row for row in TABLE.rows if row.reason == "max_steps"]
    assert isinstance(row.guard, AtLimit)
    assert row.guard.meter is STEPS
    assert (row.guard.__name__, TABLE.reads(row), TABLE.bounds(row)) == ("steps_exhausted", ("steps",), "max_steps")


@given(turns=st.integers(0, 12), limit=st.integers(1, 10))
def test_a_limit_guard_holds_exactly_when_its_meter_reached_the_limit(turns: int, limit: int) -> None:
    """steps_exhausted(run) is turns >= max_steps, for any counts."""
    (row,) = [row for row in TABLE.rows if row.reason == "max_steps"]
    run = Run(Limits(max_steps=limit), [], table=TABLE)
    run.counts.turns = turns
    assert row.guard is not None
    assert row.guard(run) is (turns >= limit)


def test_a_limit_guard_without_its_limit_never_holds() -> None:
    """budget_spent is false for a run without token_budget, however many tokens it used."""
    (row,) = [row for row in TABLE.rows if row.reason == "token_budget"]
    run = Run(Limits(), [], table=TABLE)
    run.counts.input_tokens = 10**9
    assert row.guard is not None
    assert not row.guard(run)


def test_the_steps_meter_moves_on_the_model_outcome_edges() -> None:
    """increments('steps') is every edge out of AwaitModel on a model outcome, and no other."""
    rows = TABLE.increments("steps")
    assert {(row.source, row.trigger) for row in rows} == {
        (State.AwaitModel, trigger) for trigger in ("replied", "model_failed", "interrupted", "expired")
    }


def test_the_failures_and_tool_calls_meters_move_on_tool_done() -> None:
    """A finished tool call moves failures and tool_calls: the rows out of ExecuteTool on tool_done (or finalize)."""
    expected = TABLE.rows_from(State.ExecuteTool, "tool_done") + tuple(
        row for row in TABLE.rows_from(State.ExecuteTool, "finalize")
    )
    assert TABLE.increments("failures") == expected
    assert TABLE.increments("tool_calls") == expected


def test_the_clock_moves_on_every_edge() -> None:
    """increments('seconds') is the whole table: the driver writes elapsed before each transition."""
    assert TABLE.increments("seconds") == TABLE.rows


def test_an_unknown_meter_is_refused_naming_the_meters() -> None:
    """increments() of a name no stop counts is a KeyError listing the table's meters."""
    with pytest.raises(KeyError, match=r"no meter 'laps'.*steps"):
        TABLE.increments("laps")


def test_a_stop_condition_row_is_opaque() -> None:
    """A user's StopCondition is called, never read: opaque, with no reads and no bound."""

    def too_long(view: RunView) -> bool:
        """The conversation grew past ten messages."""
        return len(view.messages) > 10

    table = TABLE.with_stops([StopCondition("chatty", State.Dispatch, too_long)])
    (row,) = [row for row in table.rows if row.reason == "chatty"]
    assert (table.opaque(row), table.reads(row), table.bounds(row)) == (True, (), None)
    assert row.guard is not None
    assert is_opaque(row.guard)


def another_look(run: Run) -> bool:
    """The answer is looked at once more before the run ends."""
    return False


def test_a_plain_function_in_a_row_is_opaque_and_still_walked() -> None:
    """A row whose guard is a user's function is valid, opaque, and tried in its place."""
    table = TABLE.with_rows([Row(State.Dispatch, "dispatch", State.AwaitModel, guard=another_look)], [])
    (row,) = [row for row in table.rows if row.guard is another_look]
    assert table.opaque(row)
    assert table.rows_from(State.Dispatch, "dispatch")[-2] is row


def test_meters_move_only_on_the_edges_that_increment_them() -> None:
    """In whole runs, each change of a counter shows on an edge Table.increments lists for it."""
    for agent, script in _scenarios():
        changes: list[tuple[str, str]] = []
        before: dict[str, Any] = {}

        def seen(event: Any, before: dict[str, Any] = before, changes: list[tuple[str, str]] = changes) -> None:
            for name, (used, _limit) in event.counters.items():
                if before.get(name, 0) != used:
                    changes.append((name, f"{event.source}->{event.dest}:{event.trigger}"))
                before[name] = used

        agent.on("transition", seen)
        _run(agent, script)
        for name, edge in changes:
            if name == "seconds":
                continue
            allowed = {f"{r.source}->{r.dest}:{r.trigger}" for r in agent.table.increments(name)}
            assert edge in allowed, f"{name} moved on {edge}"


# --- every firing against the library's own trigger() ----------------------------------------------------


class Probe:
    """A model for the library's machine (a plain class: the library sets its trigger methods on it)."""

    state: str


class LibraryOracle:
    """Asks ``transitions``' own ``trigger()`` which row a run takes, on a machine built from ``table``."""

    def __init__(self) -> None:
        self.table = TABLE
        self.machine: Any = None
        self.taken: list[int] = []
        self.seen: list[str] = []

    def use(self, table: Table) -> None:
        self.table = table
        self.machine = library_machine(table, on_taken=lambda index, _run: self.taken.append(index))

    def row(self, run: Run, trigger: str) -> Row | None:
        probe = Probe()
        self.machine.add_model(probe, initial=str(run.at.state))
        self.taken.clear()
        try:
            moved = probe.trigger(trigger, run)  # type: ignore[attr-defined]  # set by the library
        finally:
            self.machine.remove_model(probe)
        return self.table.rows[self.taken[0]] if moved else None


@pytest.fixture
def oracle(monkeypatch: pytest.MonkeyPatch) -> LibraryOracle:
    """Every row the engine looks up is first asked of the library; the engine's row must be the same."""
    real = table_module.first_row
    oracle = LibraryOracle()

    def checked(run: Run, trigger: str) -> Row | None:
        expected = oracle.row(run, trigger)
        row = real(run, trigger)
        assert row is expected, f"{run.at.state} on {trigger}: the engine took {row}, the library {expected}"
        if row is not None:
            oracle.seen.append(edge_id(row))
        return row

    for module in (firing, stepper, walker):
        monkeypatch.setattr(module, "first_row", checked)
    return oracle


def test_every_firing_of_whole_runs_takes_the_row_the_library_takes(oracle: LibraryOracle) -> None:
    """For scripted runs reaching most stops, each lookup agrees with transitions' trigger() on the same run."""
    for agent, script in _scenarios():
        oracle.use(agent.table)
        _run(agent, script)
    expected = {"Dispatch->ExecuteTool", "Dispatch->Done[has_no_tool_calls]", "ExecuteTool->Failed[max_steps]"}
    assert expected <= set(oracle.seen)
    assert len(oracle.seen) > 50


def _run(agent: Agent, script: list[Any]) -> RunResult:
    agent.model = FakeModel(script)
    try:
        return agent.run("go")
    except AgentLoopError as stop:
        return stop.result


def _scenarios() -> list[tuple[Agent, list[Any]]]:
    """Agents and scripts that reach the common path and most stops."""
    registry: ToolRegistry = demo_registry()

    def echo(i: int) -> Any:
        return tool_turn(tool_call("echo", text=f"t{i}"))

    usage = Usage(input_tokens=40, output_tokens=30)
    return [
        (Agent(FakeModel(), registry), [echo(1), echo(2), reply("done")]),
        (Agent(FakeModel(), registry, max_steps=2), [echo(1), echo(2), echo(3)]),
        (Agent(FakeModel(), registry, max_steps=2, on_stop={"max_steps": "finalize"}), [echo(1), echo(2), reply("ok")]),
        (Agent(FakeModel(), registry), [echo(1), echo(1)]),
        (Agent(FakeModel(), registry), [tool_turn(tool_call("echo", text="a"), tool_call("echo", text="a"))]),
        (Agent(FakeModel(), registry), [tool_turn(*[tool_call("fail") for _ in range(3)])]),
        (Agent(FakeModel(), registry, token_budget=100), [tool_turn(tool_call("echo", text="x"), usage=usage)] * 3),
        (Agent(FakeModel(), registry), [reply("cut", stop_reason="max_tokens")]),
        (Agent(FakeModel(), registry), [reply("no", stop_reason="refusal")]),
        (
            Agent(FakeModel(), registry, max_tool_calls=1),
            [tool_turn(tool_call("echo", text="a"), tool_call("add", a=1, b=2))],
        ),
        (Agent(FakeModel(), registry), [echo(1), echo(2), echo(1), echo(2), echo(1), echo(2)]),
        (Agent(FakeModel(), registry), [RuntimeError("down")]),
        (Agent(FakeModel(), registry, system="be brief"), [Message("assistant", "odd")]),
    ]
