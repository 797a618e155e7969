"""What the diagram tests share: DOT parsed back into edges and nodes, hand-built tables, scenario runs."""

from __future__ import annotations

import re
from collections.abc import Callable

import pytest

from fsm_agent import TABLE, AgentLoopError, Row, RunResult, State, Table, Transition, run
from fsm_agent.definition.guards import has_no_tool_calls
from fsm_agent.definition.run import Run
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, reply, tool_call, tool_turn

needs_dot = pytest.mark.usefixtures("dot")  # conftest: skips without Graphviz, fails under CI

S = State
EDGE = re.compile(r"^\t(\w+) -> (\w+) \[(.*)\]$")
NODE = re.compile(r"^\t(\w+) \[(.*)\]$")
ATTRIBUTE = re.compile(r'(\w+)=("(?:[^"\\]|\\.)*"|[^\s\]]+)')


def _attributes(text: str) -> dict[str, str]:
    return {
        key: value[1:-1].replace('\\"', '"') if value.startswith('"') else value
        for key, value in ATTRIBUTE.findall(text)
    }


def dot_edges(source: str) -> list[tuple[str, str, dict[str, str]]]:
    """The edges of DOT text in order, as (source, dest, attributes), without the entry arrow."""
    found = [EDGE.match(line) for line in source.splitlines()]
    return [(m[1], m[2], _attributes(m[3])) for m in found if m is not None and m[1] != "__start__"]


def dot_nodes(source: str) -> dict[str, dict[str, str]]:
    """The nodes of DOT text with their attributes."""
    found = [NODE.match(line) for line in source.splitlines()]
    return {m[1]: _attributes(m[2]) for m in found if m is not None and m[1] not in ("graph", "node", "edge")}


def by_id(source: str) -> dict[str, tuple[str, str, dict[str, str]]]:
    """The edges of DOT text keyed by their ``id`` (``row<index>``)."""
    return {attrs["id"]: (src, dst, attrs) for src, dst, attrs in dot_edges(source)}


def lines_of(label: str) -> list[str]:
    """A DOT label split at its ``\\n`` line breaks."""
    return label.split("\\n")


# Guards for hand-built tables: named, as the table requires, and never called by a renderer.
def quota_spent(current: Run) -> bool:
    """Stand-in stop guard for a user-defined quota."""
    return False


def wall_clock_passed(current: Run) -> bool:
    """Stand-in stop guard for a user-defined deadline."""
    return False


def abort_requested(current: Run) -> bool:
    """Stand-in stop guard for a user's abort."""
    return False


def wants_summary(current: Run) -> bool:
    """Stand-in guard for a guard-only trigger that goes back to the model."""
    return False


def default_table() -> Table:
    """The table every agent runs unless told otherwise."""
    return TABLE


def small_table() -> Table:
    """A hand-built table: a guard-only ``finalize`` trigger, two stops between ExecuteTool and Failed."""
    return Table(
        rows=[
            Row(S.AwaitModel, "replied", S.CheckTruncation),
            Row(S.CheckTruncation, "check", S.Dispatch),
            Row(S.Dispatch, "finalize", S.AwaitModel, wants_summary),
            Row(S.Dispatch, "finalize", S.Failed, abort_requested, "user_abort"),
            Row(S.Dispatch, "dispatch", S.Done, has_no_tool_calls),
            Row(S.Dispatch, "dispatch", S.ExecuteTool),
            Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, "wall_clock"),
            Row(S.ExecuteTool, "tool_done", S.Failed, quota_spent, "quota"),
            Row(S.ExecuteTool, "tool_done", S.AwaitModel),
        ],
        reasons=["user_abort", "wall_clock", "quota"],
    )


def extended_table() -> Table:
    """The default table plus user-defined stops, as an agent with extra stop conditions would run."""
    extra = [
        Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, "wall_clock"),
        Row(S.AwaitModel, "replied", S.Failed, abort_requested, "user_abort"),
    ]
    return TABLE.with_rows(extra, ["wall_clock", "user_abort"])


TABLES = [default_table, small_table, extended_table]
"""Factories, so a table that fails validation fails its tests rather than the whole module's collection."""


def index_of(table: Table, source: State, trigger: str, dest: State, guard: str | None = None) -> int:
    """The position of the row with these fields, so tests do not hard-code positions in a growing table."""
    return next(
        i
        for i, row in enumerate(table.rows)
        if (row.source, row.trigger, row.dest, row.guard_name) == (source, trigger, dest, guard)
    )


def outcome(go: Callable[[], RunResult]) -> RunResult:
    """A run's result, whether it finished or stopped with ``AgentLoopError``."""
    try:
        return go()
    except AgentLoopError as exc:
        return exc.result


def scenario_max_steps() -> RunResult:
    """Seed scenario A: a model that never converges."""
    return outcome(lambda: run(CounterModel(), demo_registry(), "go", max_steps=3))


def scenario_repeated_action() -> RunResult:
    """Seed scenario B: the same call again and again."""
    return outcome(lambda: run(LoopingModel(tool_call("echo", text="ping")), demo_registry(), "go"))


def scenario_max_tokens() -> RunResult:
    """Seed scenario C: a reply cut off at the length limit."""
    return outcome(lambda: run(FakeModel([reply("half", stop_reason="max_tokens")]), demo_registry(), "go"))


def scenario_tool_failures() -> RunResult:
    """Seed scenario D: three failing tool calls in a row."""
    model = FakeModel([tool_turn(tool_call("fail")), tool_turn(tool_call("missing")), tool_turn(tool_call("fail"))])
    return outcome(lambda: run(model, demo_registry(), "go"))


def scenario_done() -> RunResult:
    """Seed scenario E: two tool turns (one with two calls), then an answer."""
    model = FakeModel(
        [
            tool_turn(tool_call("add", a=2, b=3)),
            tool_turn(tool_call("add", a=5, b=5), tool_call("add", a=10, b=10)),
            reply("20"),
        ]
    )
    return outcome(lambda: run(model, demo_registry(), "go"))


def scenario_model_error() -> RunResult:
    """The model raises on its first call."""
    return outcome(lambda: run(FakeModel([RuntimeError("boom")]), demo_registry(), "go"))


def scenario_refusal() -> RunResult:
    """The provider refuses the reply."""
    return outcome(lambda: run(FakeModel([reply("no", stop_reason="refusal")]), demo_registry(), "go"))


SCENARIOS = [
    scenario_max_steps,
    scenario_repeated_action,
    scenario_max_tokens,
    scenario_tool_failures,
    scenario_done,
    scenario_model_error,
    scenario_refusal,
]


def row_key(row: Row) -> tuple[str, str, str, str | None, str | None]:
    """What identifies a row in a trace entry."""
    return (str(row.source), row.trigger, str(row.dest), row.guard_name, row.reason)


def entry_key(entry: Transition) -> tuple[str, str, str, str | None, str | None]:
    """A trace entry's identifying fields, comparable with ``row_key``."""
    return (entry.source, entry.trigger, entry.dest, entry.guard, entry.reason)


# --- the table's diagram, DOT ----------------------------------------------------------------


def row_edges(source: str) -> dict[int, tuple[str, str, dict[str, str]]]:
    """The edges that stand for table rows, by row index, as drawn (reversed edges set the right way round)."""
    found = {}
    for src, dst, attrs in dot_edges(source):
        if attrs.get("id", "").startswith("row"):
            found[int(attrs["id"].removeprefix("row"))] = (
                (dst, src, attrs)
                if attrs.get("dir") == "back"
                else (
                    src,
                    dst,
                    attrs,
                )
            )
    return found


def trunks(source: str) -> dict[str, tuple[str, dict[str, str]]]:
    """Each junction's one outgoing trunk: junction -> (the state it leads into, its attributes)."""
    found = {}
    for src, dst, attrs in dot_edges(source):
        if attrs.get("id", "").startswith(("stops_", "finalize_")):
            junction, dest = (dst, src) if attrs.get("dir") == "back" else (src, dst)
            found[junction] = (dest, attrs)
    return found


def drawn_dest(source: str, row: int) -> str:
    """Where a row's edge ends up, following it through its junction's trunk."""
    _, dest, _ = row_edges(source)[row]
    return trunks(source)[dest][0] if dest in trunks(source) else dest
