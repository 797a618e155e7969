"""Diagrams: DOT and Mermaid text drawn from the table (and a run's trace), the committed files, the CLI."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

import fsm_agent.cli.diagram
from fsm_agent import TABLE, Agent, AgentLoopError, Row, RunResult, State, Table, Transition, run
from fsm_agent.__main__ import main as cli
from fsm_agent.cli.diagram import load_table
from fsm_agent.definition.guards import has_no_tool_calls
from fsm_agent.definition.run import Run
from fsm_agent.render.dot import SPINE_WEIGHT, render, to_dot, write_runs
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.render.model import (
    FADED_COLOR,
    FAILURE_COLOR,
    SUCCESS_COLOR,
    TAKEN_COLOR,
    diagram_edges,
    row_index,
    spine,
)
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, reply, tool_call, tool_turn

DIAGRAMS = Path(__file__).resolve().parent.parent / "diagrams"
needs_dot = pytest.mark.skipif(shutil.which("dot") is None, reason="Graphviz's dot is not installed (CI installs it)")

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


@pytest.mark.parametrize("make", TABLES)
def test_dot_draws_every_state_with_terminals_as_double_circles(make: Callable[[], Table]) -> None:
    """Every state of the table is a node; Done and Failed are double circles, the others rounded boxes."""
    table = make()
    nodes = dot_nodes(to_dot(table))
    assert set(nodes) == {"__start__", *map(str, table.states)}
    for state in table.states:
        expected = "doublecircle" if state in table.terminal else "box"
        assert nodes[str(state)]["shape"] == expected, state


@pytest.mark.parametrize("make", TABLES)
def test_dot_draws_one_edge_per_row_in_row_order(make: Callable[[], Table]) -> None:
    """Each row is exactly one edge, in table order, with id row<index>, even when rows join the same states."""
    table = make()
    edges = dot_edges(to_dot(table))
    assert [(src, dst) for src, dst, _ in edges] == [(str(r.source), str(r.dest)) for r in table.rows]
    assert [attrs["id"] for _, _, attrs in edges] == [f"row{i}" for i in range(len(table.rows))]


@pytest.mark.parametrize("row", TABLE.rows, ids=str)
def test_each_row_of_the_default_table_is_labelled_and_styled(row: Row) -> None:
    """An edge reads `trigger [guard]` (reason on a second line); red into Failed, green into Done, else plain."""
    _, _, attrs = by_id(to_dot(TABLE))[f"row{TABLE.rows.index(row)}"]
    head = row.trigger if row.guard is None else f"{row.trigger} [{row.guard_name}]"
    assert lines_of(attrs["label"]) == ([head] if row.reason is None else [head, row.reason])
    if row.dest is S.Failed:
        assert (attrs["color"], attrs["fontcolor"]) == (FAILURE_COLOR, FAILURE_COLOR)
    elif row.dest is S.Done:
        assert (attrs["color"], attrs["penwidth"]) == (SUCCESS_COLOR, "2")
    else:
        assert "color" not in attrs
        assert "penwidth" not in attrs


@pytest.mark.parametrize("make", TABLES)
def test_one_red_edge_per_reason_row(make: Callable[[], Table]) -> None:
    """The red edges are exactly the rows with a reason, each labelled with its own reason."""
    table = make()
    red = [lines_of(attrs["label"])[-1] for _, _, attrs in dot_edges(to_dot(table)) if attrs.get("color") == "red3"]
    assert red == [row.reason for row in table.rows if row.reason is not None]
    assert set(red) == set(table.reasons)


def test_user_defined_stops_are_drawn_without_touching_the_renderer() -> None:
    """Extra stop rows added to the default table appear as red edges with their reason and guard."""
    edges = dot_edges(to_dot(extended_table()))
    assert len(edges) == len(TABLE.rows) + 2
    red = {(src, dst, attrs["label"]) for src, dst, attrs in edges if attrs.get("color") == FAILURE_COLOR}
    assert ("ExecuteTool", "Failed", "tool_done [wall_clock_passed]\\nwall_clock") in red
    assert ("AwaitModel", "Failed", "replied [abort_requested]\\nuser_abort") in red


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


def test_dot_is_deterministic() -> None:
    """The same table, even rebuilt, renders byte-identical DOT."""
    rebuilt = Table(TABLE.rows, TABLE.reasons)
    assert to_dot(TABLE) == to_dot(TABLE) == to_dot(rebuilt)
    assert to_mermaid(TABLE) == to_mermaid(rebuilt)


def test_user_text_is_escaped_in_dot() -> None:
    """A reason with quotes and a backslash stays one label line and keeps its characters."""
    table = TABLE.with_rows(
        [Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, 'odd "q" \\ r')], ['odd "q" \\ r']
    )
    row = index_of(table, S.ExecuteTool, "tool_done", S.Failed, "wall_clock_passed")
    label = by_id(to_dot(table))[f"row{row}"][2]["label"]
    assert lines_of(label) == ["tool_done [wall_clock_passed]", 'odd "q" \\\\ r']


# --- the committed files ---------------------------------------------------------------------


def test_committed_dot_matches_a_fresh_render() -> None:
    """diagrams/agent_loop.dot is what the current table renders to."""
    committed = (DIAGRAMS / "agent_loop.dot").read_text(encoding="utf-8")
    assert committed == to_dot(TABLE), "diagrams/agent_loop.dot is stale: run `make diagram` and commit diagrams/"


def test_committed_mermaid_matches_a_fresh_render() -> None:
    """diagrams/agent_loop.mmd is what the current table renders to."""
    committed = (DIAGRAMS / "agent_loop.mmd").read_text(encoding="utf-8")
    assert committed == to_mermaid(TABLE), "diagrams/agent_loop.mmd is stale: run `make diagram` and commit diagrams/"


def test_committed_svg_shows_every_state_and_reason() -> None:
    """diagrams/agent_loop.svg names all six states and every stop reason of the table."""
    svg = (DIAGRAMS / "agent_loop.svg").read_text(encoding="utf-8")
    missing = [name for name in [*map(str, TABLE.states), *TABLE.reasons] if f">{name}</text>" not in svg]
    assert not missing, f"diagrams/agent_loop.svg lacks {missing}: run `make diagram` and commit diagrams/"


# --- Mermaid ---------------------------------------------------------------------------------


@pytest.mark.parametrize("make", TABLES)
def test_mermaid_lists_states_rows_and_final_states(make: Callable[[], Table]) -> None:
    """stateDiagram-v2 with every state, one transition per row in order, a start, and Done/Failed as final."""
    table = make()
    lines = to_mermaid(table).splitlines()
    assert lines[:2] == ["stateDiagram-v2", "    direction LR"]
    for state in table.states:
        assert f"    {state}" in lines
    assert "    [*] --> AwaitModel" in lines
    assert "    Done --> [*]" in lines
    assert "    Failed --> [*]" in lines
    transitions = [line for line in lines if " --> " in line and "[*]" not in line]
    expected = []
    for row in table.rows:
        head = row.trigger if row.guard is None else f"{row.trigger} [{row.guard_name}]"
        expected.append(f"    {row.source} --> {row.dest}: {head}" + (f" → {row.reason}" if row.reason else ""))
    assert transitions == expected


def test_mermaid_styles_terminal_states() -> None:
    """Failed gets the failure class and Done the success class, each defined with its colour."""
    lines = to_mermaid(TABLE).splitlines()
    assert "    class Failed failure" in lines
    assert "    class Done success" in lines
    assert any(line.startswith("    classDef failure ") and "#cd0000" in line for line in lines)
    assert any(line.startswith("    classDef success ") and "#228b22" in line for line in lines)


def test_mermaid_labels_drop_characters_that_end_a_label() -> None:
    """A ':' or ';' in a reason would cut Mermaid's label short, so it becomes a space."""
    table = TABLE.with_rows(
        [Row(S.ExecuteTool, "tool_done", S.Failed, wall_clock_passed, "limit:time;x")], ["limit:time;x"]
    )
    line = next(line for line in to_mermaid(table).splitlines() if "wall_clock_passed" in line)
    assert line == "    ExecuteTool --> Failed: tool_done [wall_clock_passed] → limit time x"


# --- a run's path ----------------------------------------------------------------------------


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_run_overlay_highlights_exactly_the_trace_edges(scenario: Callable[[], RunResult]) -> None:
    """The highlighted edges are the trace's edges, each labelled with how often it was taken; the rest fade."""
    result = scenario()
    source = to_dot(TABLE, result)
    taken: Counter[tuple[str, str, str, str | None, str | None]] = Counter()
    for _, _, attrs in dot_edges(source):
        row = TABLE.rows[int(attrs["id"].removeprefix("row"))]
        count = re.search(r" ×(\d+)$", attrs["label"])
        if count is None:
            assert attrs["color"] == FADED_COLOR, row
        else:
            assert attrs["color"] != FADED_COLOR, row
            taken[row_key(row)] = int(count[1])
    assert taken == Counter(entry_key(entry) for entry in result.trace)


@pytest.mark.parametrize("scenario", SCENARIOS, ids=lambda f: f.__name__.removeprefix("scenario_"))
def test_run_overlay_emphasises_the_final_edge(scenario: Callable[[], RunResult]) -> None:
    """Only the last trace edge is bold, in red into Failed or green into Done; the title names the ending."""
    result = scenario()
    source = to_dot(TABLE, result)
    bold = [attrs for _, _, attrs in dot_edges(source) if attrs.get("style") == "bold"]
    assert len(bold) == 1
    assert TABLE.rows[int(bold[0]["id"].removeprefix("row"))] == TABLE.rows[row_index(TABLE, result.trace[-1])]
    assert bold[0]["penwidth"] == "4"
    assert bold[0]["color"] == (SUCCESS_COLOR if result.ok else FAILURE_COLOR)
    ending = "Done" if result.ok else f"Failed({result.reason})"
    assert f'label="run ended in {ending} after {len(result.trace)} transitions"' in source
    final_node = dot_nodes(source)[result.trace[-1].dest]
    assert final_node["penwidth"] == "3"


def test_run_overlay_colours_repeated_edges_as_taken() -> None:
    """In the max_steps run the loop edges are blue with their counts (3 turns, 2 returns to the model)."""
    edges = by_id(to_dot(TABLE, scenario_max_steps()))
    replied = edges[f"row{index_of(TABLE, S.AwaitModel, 'replied', S.CheckTruncation)}"][2]
    back = edges[f"row{index_of(TABLE, S.ExecuteTool, 'tool_done', S.AwaitModel)}"][2]
    stop = edges[f"row{index_of(TABLE, S.ExecuteTool, 'tool_done', S.Failed, 'steps_exhausted')}"][2]
    assert (replied["label"], replied["color"]) == ("replied ×3", TAKEN_COLOR)
    assert (back["label"], back["color"]) == ("tool_done ×2", TAKEN_COLOR)
    assert (stop["label"], stop["color"]) == ("tool_done [steps_exhausted]\\nmax_steps ×1", FAILURE_COLOR)


def test_edge_model_counts_match_the_trace() -> None:
    """diagram_edges gives each row its count and marks only the last trace row final."""
    result = scenario_done()
    edges = diagram_edges(TABLE, result)
    assert sum(edge.count for edge in edges) == len(result.trace)
    assert [edge.index for edge in edges if edge.final] == [row_index(TABLE, result.trace[-1])]
    assert all(edge.count == 0 and not edge.final for edge in diagram_edges(TABLE))


def test_mermaid_overlay_counts_taken_edges() -> None:
    """The Mermaid path shows counts on taken transitions only and marks the visited states."""
    result = scenario_repeated_action()
    lines = to_mermaid(TABLE, result).splitlines()
    assert "    Dispatch --> Failed: dispatch [repeats_last_call] → repeated_action ×1" in lines
    assert "    AwaitModel --> CheckTruncation: replied ×2" in lines
    assert "    CheckTruncation --> Failed: check [is_truncated] → max_tokens" in lines
    assert "    class AwaitModel,CheckTruncation,Dispatch,ExecuteTool taken" in lines


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
    edges = by_id(to_dot(table, result))
    assert edges["row2"][2]["label"] == "finalize [wants_summary] ×2"
    assert edges["row3"][2]["label"] == "finalize [abort_requested]\\nuser_abort ×1"
    assert edges["row3"][2]["style"] == "bold"
    assert {key for key, (_, _, attrs) in edges.items() if attrs["color"] != FADED_COLOR} == {
        "row0",
        "row1",
        "row2",
        "row3",
    }
    with pytest.raises(ValueError, match="matches no row"):
        to_dot(TABLE, result)


# --- rendering with dot ----------------------------------------------------------------------


@needs_dot
def test_svg_render_shows_every_state_and_reason() -> None:
    """Graphviz draws the table as SVG with all six states and every reason as text."""
    svg = render(to_dot(TABLE)).decode()
    assert svg.lstrip().startswith("<?xml")
    assert "<svg" in svg
    for name in [*map(str, TABLE.states), *TABLE.reasons]:
        assert f">{name}</text>" in svg, name


@needs_dot
def test_svg_render_of_a_run_carries_the_counts() -> None:
    """A run's picture renders, with the count of the loop edge in its text."""
    svg = render(to_dot(TABLE, scenario_max_steps())).decode()
    assert ">replied ×3</text>" in svg


# --- files, CLI, demo ------------------------------------------------------------------------


@needs_dot
def test_cli_without_options_writes_dot_mermaid_and_svg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m fsm_agent diagram` writes diagrams/agent_loop.dot, .mmd and .svg, exit 0."""
    monkeypatch.chdir(tmp_path)
    assert cli(["diagram"]) == 0
    assert (tmp_path / "diagrams/agent_loop.dot").read_text(encoding="utf-8") == to_dot(TABLE)
    assert (tmp_path / "diagrams/agent_loop.mmd").read_text(encoding="utf-8") == to_mermaid(TABLE)
    assert b"<svg" in (tmp_path / "diagrams/agent_loop.svg").read_bytes()


def test_cli_without_dot_writes_text_and_one_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Graphviz the .dot and .mmd are still written, one stderr line says how to install it, exit 0."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli(["diagram"]) == 0
    assert sorted(p.name for p in (tmp_path / "diagrams").iterdir()) == ["agent_loop.dot", "agent_loop.mmd"]
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "apt-get install graphviz" in err[0]
    assert "brew install graphviz" in err[0]


def test_cli_explicit_svg_without_dot_falls_back_to_dot_text(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Asked for an SVG without Graphviz, the CLI writes the DOT beside it and says how to install Graphviz."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli(["diagram", "--format", "svg", "--out", str(tmp_path / "m.svg")]) == 0
    assert (tmp_path / "m.dot").read_text(encoding="utf-8") == to_dot(TABLE)
    assert not (tmp_path / "m.svg").exists()
    assert "apt-get install graphviz" in capsys.readouterr().err


def test_cli_svg_to_stdout_without_dot_fails(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With nothing it could write, the CLI exits 1 and says why."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli(["diagram", "--format", "svg", "--out", "-"]) == 1
    assert "brew install graphviz" in capsys.readouterr().err


def test_cli_mermaid_to_stdout(capsys: pytest.CaptureFixture[str]) -> None:
    """--format mermaid --out - prints the Mermaid text."""
    assert cli(["diagram", "--format", "mermaid", "--out", "-"]) == 0
    assert capsys.readouterr().out == to_mermaid(TABLE)


def test_cli_infers_format_from_out_suffix(tmp_path: Path) -> None:
    """--out picks the format from its suffix; an unknown suffix is refused unless --format is given."""
    assert cli(["diagram", "--out", str(tmp_path / "x.mmd")]) == 0
    assert (tmp_path / "x.mmd").read_text(encoding="utf-8") == to_mermaid(TABLE)
    assert cli(["diagram", "--out", str(tmp_path / "x.txt")]) == 1
    assert not (tmp_path / "x.txt").exists()
    assert cli(["diagram", "--format", "dot", "--out", str(tmp_path / "x.gv")]) == 0
    assert (tmp_path / "x.gv").read_text(encoding="utf-8") == to_dot(TABLE)


@needs_dot
def test_cli_png(tmp_path: Path) -> None:
    """--format png writes a PNG file."""
    assert cli(["diagram", "--format", "png", "--out", str(tmp_path / "m.png")]) == 0
    assert (tmp_path / "m.png").read_bytes().startswith(b"\x89PNG")


def test_cli_reports_an_unwritable_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A path that cannot be written exits 1 with the OS error, not a traceback."""
    (tmp_path / "file").write_text("", encoding="utf-8")
    assert cli(["diagram", "--format", "dot", "--out", str(tmp_path / "file" / "x.dot")]) == 1
    assert "could not write" in capsys.readouterr().err


def test_cli_draws_another_table(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """--table module:attribute draws that Table, or the .table of an Agent."""
    agent = Agent(CounterModel(), demo_registry())
    agent.table = extended_table()
    monkeypatch.setattr(fsm_agent.cli.diagram, "SOME_AGENT", agent, raising=False)
    assert load_table("fsm_agent.cli.diagram:SOME_AGENT") is agent.table
    out = tmp_path / "x.dot"
    assert cli(["diagram", "--table", "fsm_agent.cli.diagram:SOME_AGENT", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == to_dot(extended_table())
    assert cli(["diagram", "--table", "fsm_agent.definition.table:Row", "--out", str(out)]) == 1
    assert cli(["diagram", "--table", "fsm_agent.definition.table", "--out", str(out)]) == 1


def test_write_runs_without_dot_writes_dot_text(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run pictures fall back to <name>.dot when Graphviz is missing."""
    monkeypatch.setenv("PATH", str(tmp_path))
    result = scenario_max_tokens()
    assert write_runs([("C_max_tokens", result)], tmp_path / "runs", TABLE) == [tmp_path / "runs" / "C_max_tokens.dot"]
    assert (tmp_path / "runs" / "C_max_tokens.dot").read_text(encoding="utf-8") == to_dot(TABLE, result)


@needs_dot
def test_demo_draws_one_picture_per_scenario(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --out DIR` (what `make demo` runs, with diagrams/runs) writes DIR/<scenario>.svg for each scenario."""
    assert cli(["demo", "--out", str(tmp_path / "runs")]) == 0
    assert capsys.readouterr().out.endswith(f"run paths drawn in {tmp_path / 'runs'}/\n")
    names = sorted(p.name for p in (tmp_path / "runs").iterdir())
    assert names == [
        "A_max_steps.svg",
        "B_repeated_action.svg",
        "C_max_tokens.svg",
        "D_tool_failures.svg",
        "E_done.svg",
    ]


def test_demo_succeeds_without_dot(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Graphviz the demo still exits 0, writes .dot paths and prints one install line."""
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli(["demo", "--out", str(tmp_path / "runs")]) == 0
    assert len(list((tmp_path / "runs").glob("*.dot"))) == 5
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1
    assert "apt-get install graphviz" in err[0]


def test_run_path_does_not_import_the_diagram_code() -> None:
    """A whole run in a fresh interpreter loads none of fsm_agent.render, fsm_agent.cli or graphviz."""
    code = (
        "import sys, fsm_agent\n"
        "from fsm_agent.testing import FakeModel, demo_registry, reply\n"
        "fsm_agent.run(FakeModel([reply('hi')]), demo_registry(), 'go')\n"
        "print(sorted(m for m in sys.modules if m.startswith(('fsm_agent.render', 'fsm_agent.cli', 'graphviz'))))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
