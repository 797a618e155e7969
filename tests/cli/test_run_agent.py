"""``python -m fsm_agent run "question" --agent MODULE:FUNCTION``: the user's own agent, as ``batch`` takes."""

from __future__ import annotations

import textwrap
import uuid
from pathlib import Path

import pytest

from fsm_agent.__main__ import main

AGENT = textwrap.dedent(
    '''
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

    calls = []


    def add(a: int, b: int) -> int:
        """Add two numbers."""
        calls.append((a, b))
        return a + b


    def make():
        return Agent(FakeModel(tool_turn(tool_call("add", a=20, b=22)), reply("forty-two")), [add], max_steps=3)
    '''
)


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module in the working directory defining ``make()``, under a name no other test imported."""
    name = f"my_agent_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(AGENT, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return name


def test_run_with_an_agent_factory_answers_with_its_tools(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """The factory's model and tools run the question; the answer is on stdout, exit 0, the tool called once."""
    import importlib

    assert main(["run", "what is 20 + 22?", "--agent", f"{module}:make", "--quiet"]) == 0
    assert capsys.readouterr().out == "forty-two\n"
    assert importlib.import_module(module).calls == [(20, 22)]


def test_run_with_an_agent_stores_the_run(module: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """--store works as with --model: the run is checkpointed under its id."""
    from fsm_agent import SqliteStore

    args = ["run", "q", "--agent", f"{module}:make", "--quiet", "--store", str(tmp_path / "runs.db"), "--run-id", "r1"]
    assert main(args) == 0
    with SqliteStore(tmp_path / "runs.db") as store:
        assert store.load("r1")["state"] == "Done"


@pytest.mark.parametrize(
    "extra", [["--files", "."], ["--max-steps", "2"], ["--base-url", "http://x"], ["--system", "be brief"]]
)
def test_flags_of_the_built_in_agent_are_refused_with_an_agent(
    module: str, extra: list[str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A flag only the --model agent reads is one line naming it, exit 1: the user's agent brings its own."""
    assert main(["run", "q", "--agent", f"{module}:make", *extra]) == 1
    expected = f"error: --agent brings its own model, prompt, tools and limits: drop {extra[0]}\n"
    assert capsys.readouterr().err == expected


@pytest.mark.parametrize(
    ("target", "error"),
    [
        ("nomodule_here:make", "error: --agent: cannot import 'nomodule_here'"),
        ("no-colon", "error: --agent wants MODULE:FUNCTION, got 'no-colon'"),
    ],
)
def test_an_agent_that_cannot_be_loaded_is_one_line(
    target: str, error: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """The loader's errors, as batch and runs resume say them."""
    assert main(["run", "q", "--agent", target]) == 1
    assert capsys.readouterr().err.startswith(error)


def test_run_needs_a_model_or_an_agent_but_not_both(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--model and --agent are one required choice: neither or both is a usage error, one line, exit 1."""
    assert main(["run", "q"]) == 1
    assert "one of the arguments --model --agent is required" in capsys.readouterr().err
    assert main(["run", "q", "--model", "openai:gpt-4o-mini", "--agent", f"{module}:make"]) == 1
    assert "not allowed with argument" in capsys.readouterr().err
