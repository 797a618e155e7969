"""Diagrams from the command line: the files `diagram` writes, its formats and errors, and the demo's pictures."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from support.diagrams import needs_dot, scenario_max_tokens

import fsm_agent.cli.demo
import fsm_agent.cli.diagram
from fsm_agent import TABLE, Agent, SqliteStore, State, StopCondition
from fsm_agent.__main__ import main as cli
from fsm_agent.cli.diagram import load_table
from fsm_agent.render.dot import to_dot, write_runs
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.testing import CounterModel, demo_registry

# --- files, CLI, demo ------------------------------------------------------------------------


@needs_dot
def test_cli_without_options_writes_dot_mermaid_and_svg(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`python -m fsm_agent diagram` writes diagrams/agent_loop.dot, .mmd and .svg, and the compact drawing."""
    monkeypatch.chdir(tmp_path)
    assert cli(["diagram"]) == 0
    assert (tmp_path / "diagrams/agent_loop.dot").read_text(encoding="utf-8") == to_dot(TABLE)
    assert (tmp_path / "diagrams/agent_loop.mmd").read_text(encoding="utf-8") == to_mermaid(TABLE)
    assert b"<svg" in (tmp_path / "diagrams/agent_loop.svg").read_bytes()
    assert b"<svg" in (tmp_path / "diagrams/agent_loop_compact.svg").read_bytes()


def test_cli_without_dot_writes_text_and_one_install_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without Graphviz the .dot and .mmd are still written, one stderr line says how to install it, exit 0."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert cli(["diagram"]) == 0
    assert sorted(p.name for p in (tmp_path / "diagrams").iterdir()) == [
        "agent_loop.dot",
        "agent_loop.mmd",
        "agent_loop_compact.dot",
    ]
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
    stop = StopCondition("user_abort", State.AwaitModel, lambda view: False)
    agent = Agent(CounterModel(), demo_registry(), stop_conditions=[stop])
    assert agent.table != TABLE
    monkeypatch.setattr(fsm_agent.cli.diagram, "SOME_AGENT", agent, raising=False)
    assert load_table("fsm_agent.cli.diagram:SOME_AGENT") is agent.table
    out = tmp_path / "x.dot"
    assert cli(["diagram", "--table", "fsm_agent.cli.diagram:SOME_AGENT", "--out", str(out)]) == 0
    assert out.read_text(encoding="utf-8") == to_dot(agent.table)
    assert "user_abort" in out.read_text(encoding="utf-8")
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
    """`demo --out DIR` writes DIR/<scenario>.svg per scenario, stores the runs, and ends with the `ui` command."""
    store = tmp_path / "demo.db"
    assert cli(["demo", "--out", str(tmp_path / "runs"), "--store", str(store)]) == 0
    out = capsys.readouterr().out.splitlines()
    assert out[-2:] == [
        f"run paths drawn in {tmp_path / 'runs'}/",
        f"see the runs in a browser: {fsm_agent.cli.demo.command()} ui --store {store}",
    ]
    with SqliteStore(store) as saved:
        assert sorted(run.run_id for run in saved.list_runs()) == [
            "A_max_steps",
            "B_repeated_action",
            "C_max_tokens",
            "D_tool_failures",
            "E_done",
        ]
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


@pytest.mark.subprocess
def test_run_path_does_not_import_the_diagram_code() -> None:
    """A whole run in a fresh interpreter loads none of fsm_agent.render, .cli, .ui, graphviz or starlette."""
    code = (
        "import sys, fsm_agent\n"
        "from fsm_agent.testing import FakeModel, demo_registry, reply\n"
        "fsm_agent.run(FakeModel([reply('hi')]), demo_registry(), 'go')\n"
        "watched = ('fsm_agent.render', 'fsm_agent.cli', 'fsm_agent.ui', 'graphviz', 'starlette', 'uvicorn')\n"
        "print(sorted(m for m in sys.modules if m.startswith(watched)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"
