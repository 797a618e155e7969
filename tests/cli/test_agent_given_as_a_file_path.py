"""``--agent`` given a file path where MODULE goes: one line, exit 1, naming the module spelling or the missing file.

Before, ``./shop.py:make`` escaped ``main()`` as importlib's traceback about
relative imports, and ``shop.py:make`` imported ``shop`` then said "No module
named 'shop.py'", naming no fix.
"""

from __future__ import annotations

import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm_agent.cli.main import main

FACTORY = """
from fsm_agent import Agent
from fsm_agent.testing import FakeModel, reply


def make():
    return Agent(FakeModel(reply("hi")), [])
"""


@pytest.fixture
def agent_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """A module name whose file, ``NAME.py``, sits in the working directory with a ``make`` factory."""
    name = f"path_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(FACTORY, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the working directory on it
    yield name
    sys.modules.pop(name, None)


def refused(agent: str, capsys: pytest.CaptureFixture[str]) -> str:
    """The one line ``run --agent AGENT`` printed, after checking it exited 1 with exactly one line."""
    assert main(["run", "q", "--agent", agent, "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: --agent")
    assert err.count("\n") == 1
    return err.strip()


@pytest.mark.parametrize("written", ["./{name}.py", "{name}.py", "{cwd}/{name}", "{cwd}/{name}.py"])
def test_a_path_to_a_file_here_names_the_module_spelling(
    written: str, agent_file: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The file is in the working directory: write ``NAME:make``; the file is not imported."""
    spec = written.format(name=agent_file, cwd=Path.cwd()) + ":make"
    assert refused(spec, capsys) == f"error: --agent: MODULE is a module name, not a file: write {agent_file}:make"
    assert agent_file not in sys.modules


def test_a_path_to_a_file_elsewhere_names_its_directory(
    agent_file: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Run from another directory: the line says to run from the file's, and names it."""
    (tmp_path / "elsewhere").mkdir()
    monkeypatch.chdir(tmp_path / "elsewhere")
    line = refused(f"../{agent_file}.py:make", capsys)
    assert line.endswith(f"write {agent_file}:make, run from the file's directory ({tmp_path})")


@pytest.mark.parametrize("written", ["./missing.py", "missing.py", "/no/such/dir/missing"])
def test_a_path_to_no_file_says_so(written: str, agent_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    """No such file: said first, then the module spelling."""
    file = written if written.endswith(".py") else f"{written}.py"
    line = refused(f"{written}:make", capsys)
    assert line == (
        f"error: --agent: no such file {file!r}; MODULE is a module name: write missing:make, run from its directory"
    )


def test_a_relative_module_name_is_one_line(agent_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``.NAME:make``: importlib's TypeError about relative imports stays inside; one line names the dot."""
    assert "relative module name" in refused(f".{agent_file}:make", capsys)


def test_the_module_spelling_still_runs(agent_file: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``NAME:make`` from the file's directory: the run answers."""
    assert main(["run", "q", "--agent", f"{agent_file}:make", "--quiet"]) == 0
    assert capsys.readouterr().out.strip() == "hi"
