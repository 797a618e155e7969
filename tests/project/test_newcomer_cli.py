"""A newcomer's ``--agent MODULE:FUNCTION`` that is not what the command line wants: one line saying what it is.

Each test drives ``main([...])`` in this process, with an agent module
written to a fresh directory under a name no other test imported.  Nothing
here reaches a model: each mistake is refused before a run starts.
"""

from __future__ import annotations

import gc
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from fsm_agent.cli.main import main

AGENTS = """
from fsm_agent import Agent
from fsm_agent.testing import FakeModel, reply

AGENT = Agent(FakeModel(reply("hi")), [])


def make():
    return Agent(FakeModel(reply("hi")), [])


def forgets_return():
    Agent(FakeModel(reply("hi")), [])


async def make_async():
    return make()
"""


@pytest.fixture
def module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    """The agents above, importable from the working directory as the command line imports them."""
    name = f"newcomer_agents_{uuid.uuid4().hex[:8]}"
    (tmp_path / f"{name}.py").write_text(AGENTS, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the loader puts the working directory on it
    yield name
    sys.modules.pop(name, None)


def test_a_function_the_module_lacks_is_one_line_naming_both(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``--agent agents:nosuch``: exit 1 and one line naming the module and the function."""
    assert main(["run", "q", "--agent", f"{module}:nosuch", "--quiet"]) == 1
    assert capsys.readouterr().err == f"error: --agent: {module} has no function 'nosuch'\n"


@pytest.mark.parametrize(
    ("argv", "error"),
    [
        (["run", "q"], "error: the agent factory must return an Agent, got NoneType\n"),
        (["check"], "error: {spec} must return an Agent or a Table, got NoneType\n"),
    ],
    ids=["run", "check"],
)
def test_a_factory_that_forgets_to_return_says_it_returned_none(
    argv: list[str], error: str, module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """A factory without ``return``: exit 1 and one line saying it gave None, not an Agent."""
    spec = f"{module}:forgets_return"
    flags = [spec] if argv == ["check"] else ["--agent", spec, "--quiet"]
    assert main([*argv, *flags]) == 1
    assert capsys.readouterr().err == error.format(spec=spec)


def test_an_agent_object_instead_of_a_function_is_named_as_what_it_is(
    module: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``--agent agents:AGENT``: the line says AGENT is an Agent, and that a function returning it is wanted."""
    assert main(["run", "q", "--agent", f"{module}:AGENT", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert "has no function" not in err
    assert "AGENT is an Agent" in err


@pytest.mark.filterwarnings("ignore:coroutine .* was never awaited:RuntimeWarning")
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
def test_an_async_factory_is_named_as_async(module: str, capsys: pytest.CaptureFixture[str]) -> None:
    """``async def make_async()``: exit 1 and one line saying the factory is ``async def``, not a plain ``def``."""
    assert main(["run", "q", "--agent", f"{module}:make_async", "--quiet"]) == 1
    gc.collect()
    assert "async def" in capsys.readouterr().err
