"""Diagrams: the machine as DOT text drawn from the table, the committed files, and the SVG Graphviz makes of it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from fsm_agent import TABLE, AgentLoopError, Row, RunResult, State, Table, Transition, run
from fsm_agent.definition.guards import has_no_tool_calls
from fsm_agent.definition.run import Run
from fsm_agent.render.dot import SPINE_WEIGHT, render, to_dot
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import (
    FAILURE_COLOR,
    FINALIZE_COLOR,
    KIND_COLOR,
    LEGEND,
    RESUME_COLOR,
    SUCCESS_COLOR,
    diagram_edges,
    spine,
)
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, reply, tool_call, tool_turn

DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"
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


@pytest.mark.parametrize("make", TABLES)
@pytest.mark.parametrize("compact", [False, True], ids=["full", "compact"])
def test_dot_draws_every_state_with_terminals_as_double_circles(make: Callable[[], Table], compact: bool) -> None:
    """Every state of the table is a node; Done and Failed are double circles, the others rounded boxes."""
    table = make()
    nodes = dot_nodes(to_dot(table, compact=compact))
    assert {*map(str, table.states), "__start__"} <= set(nodes)
    assert all(name.startswith(("stops_", "finalize_")) for name in set(nodes) - {*map(str, table.states), "__start__"})
    for state in table.states:
        expected = "doublecircle" if state in table.terminal else "box"
        assert nodes[str(state)]["shape"] == expected, state


@pytest.mark.parametrize("make", TABLES)
def test_dot_draws_one_edge_per_row_from_its_state_to_its_destination(make: Callable[[], Table]) -> None:
    """Each row is exactly one edge with id row<index>, leaving its state and reaching its dest (via a junction)."""
    table = make()
    source = to_dot(table)
    drawn = row_edges(source)
    assert sorted(drawn) == list(range(len(table.rows)))
    for index, row in enumerate(table.rows):
        assert drawn[index][0] == str(row.source), row
        assert drawn_dest(source, index) == str(row.dest), row


@pytest.mark.parametrize("make", TABLES)
def test_each_state_s_stops_run_into_a_junction_of_their_own(make: Callable[[], Table]) -> None:
    """The stops of one state end in stops_<state>, one trunk of which goes to Failed: a stop's state is traceable."""
    table = make()
    source = to_dot(table)
    drawn = row_edges(source)
    for index, row in enumerate(table.rows):
        if row.reason is not None:
            assert drawn[index][1] == f"stops_{row.source}", row
            assert drawn[index][2]["arrowhead"] == "none"
    sources = {str(row.source) for row in table.rows if row.reason is not None}
    assert {name for name in trunks(source) if name.startswith("stops_")} == {f"stops_{s}" for s in sources}


def test_drawing_starts_with_the_happy_loop() -> None:
    """The first row edges in the DOT text are the loop (model, check, dispatch, tool, back), before any stop."""
    drawn = [int(attrs["id"][3:]) for _, _, attrs in dot_edges(to_dot(TABLE)) if attrs["id"].startswith("row")]
    loop = [i for i, row in enumerate(TABLE.rows) if diagram_edges(TABLE)[i].kind == "loop"]
    assert drawn[: len(loop)] == loop
    assert [str(TABLE.rows[i]) for i in loop][-1] == "ExecuteTool->AwaitModel"


@pytest.mark.parametrize("row", TABLE.rows, ids=str)
def test_each_row_of_the_default_table_has_a_short_label_a_tooltip_and_its_style(row: Row) -> None:
    """A stop reads its reason, a finalize edge the stop it answers; the tooltip has trigger, guard and meaning."""
    index = TABLE.rows.index(row)
    attrs = row_edges(to_dot(TABLE))[index][2]
    edge = diagram_edges(TABLE)[index]
    assert attrs["label"] == edge.label
    assert f" on {row.trigger}" in attrs["tooltip"]
    if row.guard is not None:
        assert f"[{row.guard_name}]" in attrs["tooltip"]
    if row.reason is not None:
        assert attrs["label"].split(" (")[0] == row.reason
        assert (attrs["color"], attrs["fontcolor"]) == (FAILURE_COLOR, FAILURE_COLOR)
    elif row.dest is S.Done:
        assert (attrs["color"], attrs["penwidth"]) == (SUCCESS_COLOR, "2.5")
    elif row.trigger == "finalize":
        assert (attrs["color"], attrs["style"]) == (FINALIZE_COLOR, "dashed")
        assert attrs["label"] == row.guard_name.removeprefix("finalize_on_")
    elif row.trigger == "resume":
        assert (attrs["color"], attrs["style"], attrs["constraint"]) == (RESUME_COLOR, "dotted", "false")
    else:
        assert attrs["color"] == "black"
        assert attrs["penwidth"] == ("3" if row.guard is None else "1.8")


def test_a_reason_twice_from_one_state_is_told_apart_by_its_trigger() -> None:
    """AwaitModel stops `cancelled` on start and on interrupted: the labels name the trigger; Dispatch's does not."""
    labels = {(str(e.row.source), e.label) for e in diagram_edges(TABLE) if e.row.reason == "cancelled"}
    assert ("AwaitModel", "cancelled (start)") in labels
    assert ("AwaitModel", "cancelled (interrupted)") in labels
    assert ("Dispatch", "cancelled") in labels


@pytest.mark.parametrize("make", TABLES)
def test_one_red_edge_per_reason_row(make: Callable[[], Table]) -> None:
    """The red row edges are exactly the rows with a reason, each labelled with its own reason."""
    table = make()
    drawn = row_edges(to_dot(table))
    red = [drawn[i][2]["label"].split(" (")[0] for i in sorted(drawn) if drawn[i][2].get("color") == FAILURE_COLOR]
    assert red == [row.reason for row in table.rows if row.reason is not None]
    assert set(red) == set(table.reasons)


def test_user_defined_stops_are_drawn_without_touching_the_renderer() -> None:
    """Extra stop rows added to the default table appear as red edges with their reason and guard."""
    table = extended_table()
    drawn = row_edges(to_dot(table))
    assert len(drawn) == len(TABLE.rows) + 2
    wall = drawn[index_of(table, S.ExecuteTool, "tool_done", S.Failed, "wall_clock_passed")]
    abort = drawn[index_of(table, S.AwaitModel, "replied", S.Failed, "abort_requested")]
    assert (wall[0], wall[1], wall[2]["label"]) == ("ExecuteTool", "stops_ExecuteTool", "wall_clock")
    assert "[wall_clock_passed]: Stand-in stop guard for a user-defined deadline." in wall[2]["tooltip"]
    assert (abort[0], abort[2]["label"], abort[2]["color"]) == ("AwaitModel", "user_abort", FAILURE_COLOR)


def test_happy_path_is_one_weighted_line_left_to_right() -> None:
    """Layout is LR; AwaitModel..ExecuteTool share a group and their edges carry the heavy weight."""
    source = to_dot(TABLE)
    assert spine(TABLE) == (S.AwaitModel, S.CheckTruncation, S.Dispatch, S.ExecuteTool)
    assert "rankdir=LR" in source
    nodes = dot_nodes(source)
    assert [name for name, attrs in nodes.items() if attrs.get("group") == "spine"] == [
        "__start__",
        "AwaitModel",
        "CheckTruncation",
        "Dispatch",
        "ExecuteTool",
    ]
    weighted = [(src, dst) for src, dst, attrs in dot_edges(source) if attrs.get("weight") == str(SPINE_WEIGHT)]
    assert weighted == [("AwaitModel", "CheckTruncation"), ("CheckTruncation", "Dispatch"), ("Dispatch", "ExecuteTool")]


def test_spine_of_a_hand_built_table_follows_first_rows() -> None:
    """The happy path is derived from row order, not from a list of state names."""
    assert spine(small_table()) == (S.AwaitModel, S.CheckTruncation, S.Dispatch, S.ExecuteTool)


def test_finalize_edges_run_back_through_a_junction_under_the_loop() -> None:
    """Each state's finalize edges meet in finalize_<state>, whose one dashed trunk goes to AwaitModel."""
    source = to_dot(TABLE)
    found = trunks(source)
    assert set(found) >= {"finalize_Dispatch", "finalize_ExecuteTool"}
    for name in ("finalize_Dispatch", "finalize_ExecuteTool"):
        dest, attrs = found[name]
        assert (dest, attrs["style"], attrs["color"], attrs["label"]) == (
            "AwaitModel",
            "dashed",
            FINALIZE_COLOR,
            "finalize",
        )


def test_the_machine_drawing_carries_a_legend_of_every_kind_of_edge() -> None:
    """The graph label is a table with a sample line in each kind's colour and what it means."""
    source = to_dot(TABLE)
    for kind, meaning in LEGEND:
        assert meaning in source
        assert f'COLOR="{KIND_COLOR[kind]}"' in source


@pytest.mark.parametrize("make", TABLES)
def test_compact_folds_each_state_s_stops_into_one_labelled_edge(make: Callable[[], Table]) -> None:
    """--compact: one red edge per state into Failed, labelled with its reasons one a line, and no junctions."""
    table = make()
    source = to_dot(table, compact=True)
    assert not any(name.startswith(("stops_", "finalize_")) for name in dot_nodes(source))
    red = {src: attrs for src, dst, attrs in dot_edges(source) if attrs["id"].startswith("stops_")}
    for state in {row.source for row in table.rows if row.reason is not None}:
        reasons = list(dict.fromkeys(row.reason for row in table.rows_from(state) if row.reason is not None))
        assert lines_of(red[str(state)]["label"]) == reasons
    assert not any(attrs.get("color") == FAILURE_COLOR for _, _, attrs in dot_edges(source) if attrs["id"][:3] == "row")


def test_compact_folds_finalize_edges_per_state() -> None:
    """--compact: one dashed orange edge per state back to AwaitModel, naming the stops it answers."""
    source = to_dot(TABLE, compact=True)
    folded = {src: (dst, attrs) for src, dst, attrs in dot_edges(source) if attrs["id"].startswith("finalize_")}
    assert lines_of(folded["Dispatch"][1]["label"]) == ["finalize:", "timeout", "repeated_action", "max_tool_calls"]
    assert folded["ExecuteTool"][0] == "AwaitModel"


def test_dot_is_deterministic() -> None:
    """The same table, even rebuilt, renders byte-identical DOT."""
    rebuilt = Table(TABLE.rows, TABLE.reasons)
    assert to_dot(TABLE) == to_dot(TABLE) == to_dot(rebuilt)
    assert to_dot(TABLE, compact=True) == to_dot(rebuilt, compact=True)
    assert to_mermaid(TABLE) == to_mermaid(rebuilt)


def test_user_text_is_escaped_in_dot() -> None:
    """A reason with quotes and a backslash stays one label line and keeps its characters."""
    table = TABLE.with_rows(
        [Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, 'odd "q" \\ r')], ['odd "q" \\ r']
    )
    row = index_of(table, S.ExecuteTool, "tool_done", S.Failed, "wall_clock_passed")
    label = row_edges(to_dot(table))[row][2]["label"]
    assert lines_of(label) == ['odd "q" \\\\ r']


def test_user_text_is_escaped_in_the_run_legend() -> None:
    """A reason with markup in it is HTML-escaped in the run picture's title, not read as a tag."""
    result = RunResult(messages=[], steps=[], final="", reason="<b>&x", trace=[])
    source = to_dot(TABLE, result)
    assert "Failed(&lt;b&gt;&amp;x)" in source
    assert "<b>&x" not in source


# --- the committed files ---------------------------------------------------------------------


def test_committed_dot_matches_a_fresh_render() -> None:
    """diagrams/agent_loop.dot is what the current table renders to."""
    committed = (DIAGRAMS / "agent_loop.dot").read_text(encoding="utf-8")
    assert committed == to_dot(TABLE), "diagrams/agent_loop.dot is stale: run `make diagram` and commit diagrams/"


def test_committed_mermaid_matches_a_fresh_render() -> None:
    """diagrams/agent_loop.mmd is what the current table renders to."""
    committed = (DIAGRAMS / "agent_loop.mmd").read_text(encoding="utf-8")
    assert committed == to_mermaid(TABLE), "diagrams/agent_loop.mmd is stale: run `make diagram` and commit diagrams/"


def test_committed_compact_dot_matches_a_fresh_render() -> None:
    """diagrams/agent_loop_compact.dot is what the current table renders to with --compact."""
    committed = (DIAGRAMS / "agent_loop_compact.dot").read_text(encoding="utf-8")
    assert committed == to_dot(TABLE, compact=True), "diagrams/agent_loop_compact.dot is stale: run `make diagram`"


def svg_lacks(svg: str) -> list[str]:
    """The states and reasons an SVG of the machine does not show as text (a reason may carry its trigger)."""
    names = [*map(str, TABLE.states), *TABLE.reasons]
    return [name for name in names if not re.search(rf">{re.escape(name)}( \(\w+\))?</text>", svg)]


@pytest.mark.parametrize("name", ["agent_loop.svg", "agent_loop_compact.svg"])
def test_committed_svg_shows_every_state_and_reason(name: str) -> None:
    """The committed SVGs name all six states and every stop reason of the table."""
    svg = (DIAGRAMS / name).read_text(encoding="utf-8")
    missing = svg_lacks(svg)
    assert not missing, f"diagrams/{name} lacks {missing}: run `make diagram` and commit diagrams/"


# --- rendering with dot ----------------------------------------------------------------------


@needs_dot
def test_svg_render_shows_every_state_and_reason() -> None:
    """Graphviz draws the table as SVG with all six states and every reason as text."""
    svg = render(to_dot(TABLE)).decode()
    assert svg.lstrip().startswith("<?xml")
    assert "<svg" in svg
    assert not svg_lacks(svg)
    assert 'id="row0"' in svg
    assert "<title>" in svg
    assert "Failed (cancelled) on start [is_cancelled]: Another thread called cancel() on the run" in svg


@needs_dot
def test_svg_render_of_a_run_carries_the_counts() -> None:
    """A run's picture renders, with the count of the loop edge in its text."""
    svg = render(to_dot(TABLE, scenario_max_steps())).decode()
    assert ">replied ×3</text>" in svg
