"""Diagrams: the machine as DOT text drawn from the table, the committed files, and the SVG Graphviz makes of it."""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest
from support.diagrams import (
    TABLES,
    S,
    dot_edges,
    dot_nodes,
    drawn_dest,
    extended_table,
    index_of,
    lines_of,
    needs_dot,
    row_edges,
    scenario_max_steps,
    small_table,
    trunks,
    wall_clock_passed,
)

from fsm_agent import TABLE, Row, RunResult, Table
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

DIAGRAMS = Path(__file__).resolve().parents[2] / "diagrams"


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
    """AwaitModel stops `cancelled` on start and on interrupted, Dispatch on dispatch and on interrupted (a check
    cut): the labels name the trigger; a reason taken once from its state (ExecuteTool's `cycle`) is its label."""
    labels = {(str(e.row.source), e.label) for e in diagram_edges(TABLE) if e.row.reason in ("cancelled", "cycle")}
    assert ("AwaitModel", "cancelled (start)") in labels
    assert ("AwaitModel", "cancelled (interrupted)") in labels
    assert ("Dispatch", "cancelled (dispatch)") in labels
    assert ("Dispatch", "cancelled (interrupted)") in labels
    assert ("ExecuteTool", "cycle") in labels  # a reason once from a state: its label alone


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
