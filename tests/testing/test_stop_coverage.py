"""Stop-path coverage: ``pytest --fsm-coverage`` counts exactly the rows a session's runs took, draws and judges them.

Each test runs a small pytest session of its own (``pytester``) whose tests
run agents on scripted models and keep each run's trace; the report is
checked against those traces, counted here independently of the recorder.
"""

from __future__ import annotations

import json
import subprocess
import sys
import xml.etree.ElementTree as ET
from collections import Counter
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest

import fsm_agent.pytest_plugin  # noqa: F401 - imported once here, not inside (and dropped after) an inner session
from fsm_agent import TABLE, Row
from fsm_agent.testing import edge_id
from fsm_agent.testing.coverage import below

pytest_plugins = ["pytester"]

SESSION = """
import json
from pathlib import Path

import pytest
from fsm_agent import Agent, AgentLoopError, RunView, StopCondition
from fsm_agent.testing import CounterModel, FakeModel, LoopingModel, demo_registry, reply, tool_call, tool_turn


def keep(result):
    entries = [[t.source, t.trigger, t.dest, t.guard, t.reason] for t in result.trace]
    with Path("traces.jsonl").open("a") as traces:
        traces.write(json.dumps(entries) + "\\n")


def test_answers_after_a_tool_call():
    keep(Agent(FakeModel(tool_turn(tool_call("echo", text="x")), reply("hi")), demo_registry()).run("q"))


def test_stops_on_a_repeated_call():
    with pytest.raises(AgentLoopError) as stop:
        Agent(LoopingModel(tool_call("echo", text="x")), demo_registry()).run("q")
    keep(stop.value.result)


def test_stops_on_max_steps():
    with pytest.raises(AgentLoopError) as stop:
        Agent(CounterModel(), demo_registry(), max_steps=2).run("q")
    keep(stop.value.result)


def every_call(view: RunView) -> bool:
    return True


def test_stops_on_a_users_condition():
    review = StopCondition("needs_review", "Dispatch", every_call, "every call needs a person")
    model = FakeModel(tool_turn(tool_call("echo", text="x")), reply("hi"))
    with pytest.raises(AgentLoopError) as stop:
        Agent(model, demo_registry(), stop_conditions=[review]).run("q")
    keep(stop.value.result)
"""
"""The inner session: an answer, two built-in stops and one stop of a user's own, each run's trace kept."""

Key = tuple[str, str, str, str | None, str | None]


def _session(pytester: pytest.Pytester, *args: str) -> pytest.RunResult:
    pytester.makepyfile(test_runs=SESSION)
    return pytester.runpytest("-p", "no:cacheprovider", *args)


def _report(pytester: pytest.Pytester, name: str = "report.json") -> dict[str, Any]:
    report: dict[str, Any] = json.loads((pytester.path / name).read_text(encoding="utf-8"))
    return report


def _taken_by_the_runs(pytester: pytest.Pytester) -> Counter[Key]:
    """Every row the inner runs took, counted from their traces."""
    lines = (pytester.path / "traces.jsonl").read_text(encoding="utf-8").splitlines()
    return Counter(tuple(entry) for line in lines for entry in json.loads(line))  # type: ignore[misc]


def _key(row: Row | dict[str, Any]) -> Key:
    if isinstance(row, Row):
        return str(row.source), row.trigger, str(row.dest), row.guard_name, row.reason
    return row["source"], row["trigger"], row["dest"], row["guard"], row["reason"]


def _row(edge: str) -> Row:
    return next(row for row in TABLE.rows if edge_id(row) == edge)


def test_the_report_counts_exactly_the_rows_the_sessions_runs_took(pytester: pytest.Pytester) -> None:
    """Each row's count is how often the runs' traces hold it; every table row is listed, a user's row by its id."""
    outcome = _session(pytester, "--fsm-coverage=report.json")
    outcome.assert_outcomes(passed=4)
    report, expected = _report(pytester), _taken_by_the_runs(pytester)
    assert {_key(row): row["taken"] for row in report["rows"] if row["taken"]} == expected
    assert [row["row"] for row in report["rows"] if row["row"] is not None] == list(range(len(TABLE.rows)))
    assert [_key(row) for row in report["rows"][: len(TABLE.rows)]] == [_key(row) for row in TABLE.rows]
    user = [row for row in report["rows"] if row["row"] is None]
    assert [(row["id"], row["taken"]) for row in user] == [("Dispatch->Failed[needs_review]", 1)]
    reached = Counter({key[4]: count for key, count in expected.items() if key[4] is not None})
    assert {reason: count for reason, count in report["reasons"].items() if count} == reached
    assert set(report["never_reached"]) == {row.reason for row in TABLE.rows if row.reason} - set(reached)
    own = {_key(row) for row in TABLE.rows}
    taken = len(own & set(expected))
    assert report["totals"] == {
        "rows": len(TABLE.rows),
        "rows_taken": taken,
        "percent": round(100 * taken / len(TABLE.rows), 1),
        "transitions": sum(expected.values()),
        "other_rows": 1,
    }
    outcome.stdout.fnmatch_lines([f"rows taken {taken}/{len(TABLE.rows)} (*%); rows of users' stops taken: 1; *"])


@pytest.mark.slow
def test_under_xdist_one_report_counts_the_rows_of_every_worker_s_runs(pytester: pytest.Pytester) -> None:
    """``pytest -n 2 --dist each``: both workers run every test; the controller's one report counts all their runs."""
    outcome = _session(pytester, "-n", "2", "--dist", "each", "--fsm-coverage=report.json")
    outcome.assert_outcomes(passed=8)
    expected = _taken_by_the_runs(pytester)
    assert len((pytester.path / "traces.jsonl").read_text(encoding="utf-8").splitlines()) == 8
    report = _report(pytester)
    assert {_key(row): row["taken"] for row in report["rows"] if row["taken"]} == expected
    assert report["totals"]["transitions"] == sum(expected.values())
    assert [(row["id"], row["taken"]) for row in report["rows"] if row["row"] is None] == [
        ("Dispatch->Failed[needs_review]", 2)
    ]


def test_rows_sharing_an_edge_id_carry_their_trigger() -> None:
    """``cancelled`` on ``start`` and on ``interrupted`` leave AwaitModel alike: their ids name the trigger."""
    from fsm_agent.testing.coverage import coverage_report

    ids = [row["id"] for row in coverage_report({})["rows"]]
    assert len(set(ids)) == len(ids) == len(TABLE.rows)
    assert {"AwaitModel->Failed[cancelled] (start)", "AwaitModel->Failed[cancelled] (interrupted)"} <= set(ids)
    assert "Dispatch->Failed[repeated_action]" in ids


def _drawn_edge(svg: Path, index: int) -> tuple[str | None, str, str]:
    """The dashes, tooltip and label of row ``index``'s edge in an SVG drawing."""
    ns = {"svg": "http://www.w3.org/2000/svg", "xlink": "http://www.w3.org/1999/xlink"}
    group = ET.parse(svg).getroot().find(f".//svg:g[@id='row{index}']", ns)
    assert group is not None, f"row{index} is not drawn"
    path, link, label = group.find(".//svg:path", ns), group.find(".//svg:a", ns), group.find(".//svg:text", ns)
    assert path is not None
    assert link is not None
    assert label is not None
    return path.get("stroke-dasharray"), link.get(f"{{{ns['xlink']}}}title", ""), label.text or ""


@pytest.mark.parametrize(
    "row",
    [_row("Dispatch->Failed[repeated_action]"), _row("ExecuteTool->Failed[max_steps]"), _row("Dispatch->ExecuteTool")],
    ids=edge_id,
)
def test_a_row_the_session_took_is_drawn_solid_with_its_count(pytester: pytest.Pytester, dot: str, row: Row) -> None:
    """A taken row's edge has no dashes, and its label ends in how often the runs took it."""
    _session(pytester, "--fsm-coverage=out/report.json").assert_outcomes(passed=4)
    dashes, tip, label = _drawn_edge(pytester.path / "out" / "report.svg", TABLE.rows.index(row))
    assert dashes is None
    assert not tip.startswith("never taken")
    assert label.endswith(f"×{_taken_by_the_runs(pytester)[_key(row)]}")


@pytest.mark.parametrize(
    "row", [_row("CheckTruncation->Failed[max_tokens]"), _row("Failed->AwaitModel[retries_model_call]")], ids=edge_id
)
def test_a_row_no_run_took_is_drawn_dashed_and_marked(pytester: pytest.Pytester, dot: str, row: Row) -> None:
    """A never-taken row's edge is dashed red, counted 0 on its label, its tooltip saying it was never taken."""
    _session(pytester, "--fsm-coverage=report.json").assert_outcomes(passed=4)
    dashes, tip, label = _drawn_edge(pytester.path / "report.svg", TABLE.rows.index(row))
    assert dashes is not None
    assert tip.startswith("never taken: ")
    assert label.endswith("×0")


@pytest.mark.parametrize(("floor", "exit_code"), [(5.0, 0), (95.0, 1)])
def test_fail_under_fails_a_passing_session_only_below_the_floor(
    pytester: pytest.Pytester, floor: float, exit_code: int
) -> None:
    """Every test passes; the session fails only when fewer than ``floor`` percent of the rows were taken."""
    outcome = _session(pytester, "--fsm-coverage=report.json", f"--fsm-coverage-fail-under={floor:g}")
    outcome.assert_outcomes(passed=4)
    assert below(_report(pytester), floor) == bool(exit_code)
    assert outcome.ret == exit_code
    failing = [line for line in outcome.outlines if line.startswith("FAIL: row coverage")]
    assert len(failing) == exit_code


def test_fail_under_compares_the_exact_share_not_the_rounded_percent() -> None:
    """23 of 46 rows is exactly 50%: not below 50, below 50.01."""
    report = {"totals": {"rows": 46, "rows_taken": 23}}
    assert not below(report, 50)
    assert below(report, 50.01)


def test_without_the_flag_nothing_is_recorded_and_no_file_is_written(pytester: pytest.Pytester) -> None:
    """No ``--fsm-coverage``: no recorder registered, no summary, no report or drawing anywhere in the session's dir."""
    recorded = pytester.inline_run(pytester.makepyfile(test_runs=SESSION), "-p", "no:cacheprovider")
    recorded.assertoutcome(passed=4)
    config = recorded.getcall("pytest_sessionfinish").session.config
    assert config.pluginmanager.get_plugin("fsm-coverage") is None
    written = {path.name for path in pytester.path.rglob("*") if path.suffix in (".json", ".svg", ".dot")}
    assert written == set()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--fsm-coverage", "tests"], "*--fsm-coverage takes a .json path after '='*"),
        (["--fsm-coverage-fail-under=50"], "*--fsm-coverage-fail-under needs --fsm-coverage*"),
    ],
)
def test_a_mistaken_option_is_a_usage_error(pytester: pytest.Pytester, args: list[str], message: str) -> None:
    """A report path that is no .json file, or a floor without coverage, stops the session before it runs."""
    outcome = _session(pytester, *args)
    assert outcome.ret == pytest.ExitCode.USAGE_ERROR
    outcome.stderr.fnmatch_lines([message])


def test_the_plugin_is_registered_through_the_pytest11_entry_point(pytester: pytest.Pytester) -> None:
    """pip's metadata lists it, and a session without any ``-p`` has it loaded under the entry point's name."""
    found = {ep.name: ep.value for ep in entry_points(group="pytest11")}
    assert found.get("fsm_agent") == "_fsm_agent_pytest"
    recorded = pytester.inline_run("--fsm-coverage=report.json", "-p", "no:cacheprovider")
    plugins = recorded.getcall("pytest_sessionfinish").session.config.pluginmanager
    assert getattr(plugins.get_plugin("fsm_agent"), "__name__", None) == "_fsm_agent_pytest"
    assert type(plugins.get_plugin("fsm-coverage")).__name__ == "CoveragePlugin"


@pytest.mark.subprocess
def test_loading_the_plugin_imports_nothing_of_fsm_agent() -> None:
    """The entry point pytest imports in every session leaves the package (engine, drivers) unloaded."""
    code = "import sys, _fsm_agent_pytest; print(sorted(m for m in sys.modules if m.startswith('fsm_agent')))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
