"""Diagrams: a run's path over the machine (DOT), and the Mermaid flowchart with and without a run."""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable

import pytest
from support.diagrams import (
    SCENARIOS,
    TABLES,
    dot_edges,
    dot_nodes,
    entry_key,
    extended_table,
    index_of,
    row_edges,
    row_key,
    scenario_max_steps,
    scenario_repeated_action,
    small_table,
    trunks,
    wall_clock_passed,
)

from fsm_agent import TABLE, Row, RunResult, State, Table, Transition
from fsm_agent.render.dot import to_dot
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import (
    FADED_COLOR,
    FAILURE_COLOR,
    FINALIZE_COLOR,
    HEX,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    diagram_edges,
    row_index,
)

S = State
LINK = re.compile(r"^    (\w+) (==>|-->|---|-\.->)(?:\|\"(.*)\"\|)? (\w+)$")
STYLE = re.compile(r"^    linkStyle (\d+) (.*)$")


def mermaid_links(text: str) -> list[tuple[str, str, str, str, str]]:
    """The links of Mermaid text in order, as (source, arrow, label, dest, linkStyle)."""
    lines = text.splitlines()
    links = [m.groups(default="") for m in map(LINK.match, lines) if m is not None]
    styles = dict(m.groups() for m in map(STYLE.match, lines) if m is not None)
    assert sorted(map(int, styles)) == list(range(len(links))), "one linkStyle per link"
    return [(src, arrow, label, dst, styles[str(i)]) for i, (src, arrow, label, dst) in enumerate(links)]


# --- a run's path, DOT -----------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_run_overlay_highlights_exactly_the_trace_edges(scenario: Callable[[], RunResult]) -> None:
    """The highlighted row edges are the trace's edges, each labelled with how often it was taken; the rest fade."""
    result = scenario()
    taken: Counter[tuple[str, str, str, str | None, str | None]] = Counter()
    for index, (_, _, attrs) in row_edges(to_dot(TABLE, result)).items():
        row = TABLE.rows[index]
        count = re.search(r" ×(\d+)$", attrs["label"])
        if count is None:
            assert attrs["color"] == FADED_COLOR, row
        else:
            assert attrs["color"] != FADED_COLOR, row
            taken[row_key(row)] = int(count[1])
    assert taken == Counter(entry_key(entry) for entry in result.trace)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_run_overlay_emphasises_the_final_edge(scenario: Callable[[], RunResult]) -> None:
    """Only the last trace edge (and, for a stop, its state's trunk) is bold, red into Failed or green into Done."""
    result = scenario()
    source = to_dot(TABLE, result)
    bold = [attrs for _, _, attrs in dot_edges(source) if attrs.get("style") == "bold"]
    last = TABLE.rows[row_index(TABLE, result.trace[-1])]
    expected = [f"row{TABLE.rows.index(last)}"] + ([f"stops_{last.source}"] if last.reason else [])
    assert sorted(attrs["id"] for attrs in bold) == sorted(expected)
    assert {attrs["penwidth"] for attrs in bold} == {"4"}
    assert {attrs["color"] for attrs in bold} == {SUCCESS_COLOR if result.ok else FAILURE_COLOR}
    ending = "Done" if result.ok else f"Failed({result.reason})"
    assert f"<B>run ended in {ending} after {len(result.trace)} transitions</B>" in source
    assert dot_nodes(source)[result.trace[-1].dest]["penwidth"] == "3"


def test_run_overlay_colours_repeated_edges_as_taken() -> None:
    """In the max_steps run the loop edges are blue with their counts (3 turns, 2 returns to the model)."""
    edges = row_edges(to_dot(TABLE, scenario_max_steps()))
    replied = edges[index_of(TABLE, S.AwaitModel, "replied", S.CheckTruncation)][2]
    back = edges[index_of(TABLE, S.ExecuteTool, "tool_done", S.AwaitModel)][2]
    stop = edges[index_of(TABLE, S.ExecuteTool, "tool_done", S.Failed, "steps_exhausted")][2]
    assert (replied["label"], replied["color"]) == ("replied ×3", TAKEN_COLOR)
    assert (back["label"], back["color"]) == ("tool_done ×2", TAKEN_COLOR)
    assert (stop["label"], stop["color"]) == ("max_steps ×1", FAILURE_COLOR)


def test_run_overlay_fades_the_junctions_the_run_never_reached() -> None:
    """Only the stopping state's junction and trunk keep their colour; every other stop trunk is faded."""
    source = to_dot(TABLE, scenario_max_steps())
    colours = {name: attrs["color"] for name, (_, attrs) in trunks(source).items() if name.startswith("stops_")}
    assert colours.pop("stops_ExecuteTool") == FAILURE_COLOR
    assert set(colours.values()) == {FADED_COLOR}


def test_compact_run_overlay_sums_a_state_s_stops_on_its_folded_edge() -> None:
    """--compact with a run: the folded edge of the stopping state counts the stop and is bold."""
    source = to_dot(TABLE, scenario_max_steps(), compact=True)
    folded = {attrs["id"]: attrs for _, _, attrs in dot_edges(source)}["stops_ExecuteTool"]
    assert "max_steps ×1" in folded["label"].split("\\n")
    assert (folded["style"], folded["color"]) == ("bold", FAILURE_COLOR)


def test_edge_model_counts_match_the_trace() -> None:
    """diagram_edges gives each row its count and marks only the last trace row final."""
    result = scenario_max_steps()
    edges = diagram_edges(TABLE, result)
    assert sum(edge.count for edge in edges) == len(result.trace)
    assert [edge.index for edge in edges if edge.final] == [row_index(TABLE, result.trace[-1])]
    assert all(edge.count == 0 and not edge.final for edge in diagram_edges(TABLE))


def test_trace_entry_matching_no_row_is_a_value_error() -> None:
    """A trace from another table (here with a user's wall_clock stop) cannot be drawn over the default one."""
    entry = Transition("ExecuteTool", "tool_done", "Failed", "wall_clock_passed", "wall_clock")
    result = RunResult(messages=[], steps=[], final="", reason="wall_clock", trace=[entry])
    with pytest.raises(ValueError, match=r"ExecuteTool->Failed on 'tool_done' .*'wall_clock'\) matches no row"):
        to_dot(TABLE, result)
    with pytest.raises(ValueError, match="matches no row"):
        to_mermaid(TABLE, result)
    table = extended_table()
    assert row_index(table, entry) == index_of(table, S.ExecuteTool, "tool_done", S.Failed, "wall_clock_passed")


def test_run_over_a_hand_built_table() -> None:
    """A trace through user-defined rows (a guard-only trigger, a new stop) is drawn over the table it came from."""
    table = small_table()
    loop = [
        Transition("AwaitModel", "replied", "CheckTruncation"),
        Transition("CheckTruncation", "check", "Dispatch"),
        Transition("Dispatch", "finalize", "AwaitModel", "wants_summary"),
    ]
    last = Transition("Dispatch", "finalize", "Failed", "abort_requested", "user_abort")
    result = RunResult(messages=[], steps=[], final="", reason="user_abort", trace=[*loop, *loop, *loop[:2], last])
    edges = row_edges(to_dot(table, result))
    assert edges[2][2]["label"] == "wants_summary ×2"
    assert edges[3][2]["label"] == "user_abort ×1"
    assert edges[3][2]["style"] == "bold"
    assert {index for index, (_, _, attrs) in edges.items() if attrs["color"] != FADED_COLOR} == {0, 1, 2, 3}
    with pytest.raises(ValueError, match="matches no row"):
        to_dot(TABLE, result)


# --- Mermaid ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", TABLES)
def test_mermaid_draws_every_state_and_one_link_per_row(make: Callable[[], Table]) -> None:
    """A flowchart with every state, an entry, one link per row (stops into their state's junction), one trunk each."""
    table = make()
    text = to_mermaid(table)
    lines = text.splitlines()
    assert lines[0] == "flowchart LR"
    for state in table.states:
        shape = f"((({state})))" if state in table.terminal else f"({state})"
        assert f"    {state}{shape}" in lines
    links = mermaid_links(text)
    assert links[0][:4] == ("start", "==>", "", "AwaitModel")
    rows = [link for link in links[1:] if not link[0].startswith("stops_")]
    expected = Counter()
    for edge in diagram_edges(table):
        dest = f"stops_{edge.row.source}" if edge.kind == "failure" else str(edge.row.dest)
        expected[(str(edge.row.source), edge.label, dest)] += 1
    assert Counter((src, label, dst) for src, _, label, dst, _ in rows) == expected
    sources = {str(row.source) for row in table.rows if row.reason is not None}
    assert {(src, dst) for src, _, _, dst, _ in links if src.startswith("stops_")} == {
        (f"stops_{s}", "Failed") for s in sources
    }


def test_mermaid_styles_each_kind_of_edge() -> None:
    """Loop thick black, answer green, stops red, finalize dashed orange, resume dotted grey; terminals coloured."""
    links = {(src, label, dst): (arrow, style) for src, arrow, label, dst, style in mermaid_links(to_mermaid(TABLE))}
    loop = ("==>", "stroke:#000000,stroke-width:3px,color:#000000")
    assert links[("ExecuteTool", "tool_done", "AwaitModel")] == loop
    assert links[("Dispatch", "has_no_tool_calls", "Done")][1].startswith(f"stroke:{HEX[SUCCESS_COLOR]}")
    arrow, style = links[("ExecuteTool", "max_steps", "stops_ExecuteTool")]
    assert (arrow, style.split(",")[0]) == ("---", f"stroke:{HEX[FAILURE_COLOR]}")
    arrow, style = links[("ExecuteTool", "max_steps", "AwaitModel")]
    assert (arrow, style.split(",")[0]) == ("-.->", f"stroke:{HEX[FINALIZE_COLOR]}")
    assert "stroke-dasharray:6 4" in style
    assert "stroke-dasharray:2 4" in links[("Failed", "resumes_before_tool", "Dispatch")][1]
    lines = to_mermaid(TABLE).splitlines()
    assert "    class Failed failure" in lines
    assert "    class Done success" in lines


def test_mermaid_escapes_what_would_end_a_label_or_inject_markup() -> None:
    """A reason with a quote, a pipe, a colon or a tag becomes entity codes, so the label stays one label."""
    reason = 'a"b|c:d<i>'
    table = TABLE.with_rows([Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, reason)], [reason])
    line = next(line for line in to_mermaid(table).splitlines() if "#34;" in line)
    assert line == '    ExecuteTool ---|"a#34;b#124;c#58;d#60;i#62;"| stops_ExecuteTool'


def test_mermaid_overlay_counts_and_colours_taken_edges() -> None:
    """The Mermaid path shows counts on taken links, blue; the last bold; the rest faded; visited states marked."""
    result = scenario_repeated_action()
    links = {(src, label, dst): style for src, _, label, dst, style in mermaid_links(to_mermaid(TABLE, result))}
    assert links[("Dispatch", "repeated_action ×1", "stops_Dispatch")].startswith(f"stroke:{HEX[FAILURE_COLOR]}")
    assert "stroke-width:4px" in links[("Dispatch", "repeated_action ×1", "stops_Dispatch")]
    assert links[("AwaitModel", "replied ×2", "CheckTruncation")].startswith(f"stroke:{HEX[TAKEN_COLOR]}")
    assert links[("CheckTruncation", "max_tokens", "stops_CheckTruncation")].startswith(f"stroke:{HEX[FADED_COLOR]}")
    assert "    class AwaitModel,CheckTruncation,Dispatch,ExecuteTool taken" in to_mermaid(TABLE, result).splitlines()


def test_mermaid_compact_folds_each_state_s_stops_into_one_link() -> None:
    """--compact: one red link per state into Failed naming its reasons, one finalize link per state."""
    links = mermaid_links(to_mermaid(TABLE, compact=True))
    stops = {src: label for src, _, label, dst, _ in links if dst == "Failed" and src != "stops_"}
    assert stops["CheckTruncation"] == "hook_error, max_tokens, refusal"
    finalize = {src: label for src, arrow, label, dst, _ in links if label.startswith("finalize")}
    assert finalize["Dispatch"] == "finalize (timeout, repeated_action, max_tool_calls)"
    assert not any(src.startswith("stops_") for src, *_ in links)
