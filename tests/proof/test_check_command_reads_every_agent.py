"""``python -m fsm_agent check`` on agents the API checks without trouble: the command must agree, not crash or
misname what it was given.  Run in this process (``fsm_agent.cli.main.main``), as the command's own entry point."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest
from support.proof_audit import command

from fsm_agent import Agent
from fsm_agent.cli.stop_tests import plans
from fsm_agent.proof import check
from fsm_agent.proof.driving import exercise
from fsm_agent.testing import FakeModel, demo_registry

PER_TOOL = textwrap.dedent(
    """
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, demo_registry

    def capped():
        return Agent(FakeModel(), demo_registry(), max_steps=1, max_tool_calls={"add": 1})
    """
)

INSTANCE = textwrap.dedent(
    """
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, demo_registry

    AGENT = Agent(FakeModel(), demo_registry(), max_steps=1)
    """
)


def test_the_api_proves_an_agent_with_a_per_tool_cap() -> None:
    """The proof itself is fine: every run stops, within one model call."""
    proof = check(Agent(FakeModel(), demo_registry(), max_steps=1, max_tool_calls={"add": 1}))
    assert proof.ok
    assert proof.model_calls == 1


def test_the_command_checks_an_agent_with_a_per_tool_cap(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command prints the proof and drives its stop paths, as for any agent, and exits 0."""
    code, out, err = command(tmp_path, monkeypatch, capsys, "per_tool_agents", PER_TOOL, "per_tool_agents:capped")
    assert code == 0, err
    assert "every run stops: yes" in out
    assert "driven through the engine" in out


@pytest.mark.parametrize("caps", [{"add": 1}, {"add": 2, "echo": 3}, {"add": 0, "*": 4}])
def test_the_stop_path_to_a_per_tool_cap_is_driven_as_proven(caps: dict[str, int]) -> None:
    """The scripted tools are named after the capped ones, so the path to ``max_tool_calls`` is taken, not left out."""
    agent = Agent(FakeModel(), demo_registry(), max_steps=3, max_tool_calls=caps)
    driven = exercise(agent, plans(check(agent)))
    assert "max_tool_calls" in driven.taken, driven.left_out.get("max_tool_calls")
    assert driven.ok, (driven.crash_faults, driven.gate_faults)


def test_a_fault_in_driving_the_paths_is_one_line_not_a_traceback(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Whatever goes wrong while the stop paths are driven, the command says it in one line and exits 1."""

    def broken(agent: object, paths: object) -> None:
        msg = "the driver broke"
        raise ValueError(msg)

    monkeypatch.setattr("fsm_agent.proof.driving.exercise", broken)
    code, out, err = command(tmp_path, monkeypatch, capsys, "per_tool_agents_2", PER_TOOL, "per_tool_agents_2:capped")
    assert code == 1
    assert "every run stops: yes" in out
    assert err == "error: cannot drive the stop paths through the engine: ValueError: the driver broke\n"


def test_the_command_names_a_missing_attribute_as_missing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The message that fits a name the module really lacks: exit 1, one line."""
    code, _, err = command(tmp_path, monkeypatch, capsys, "agent_objects_2", INSTANCE, "agent_objects_2:NOBODY")
    assert code == 1
    assert err.strip() == "error: check: agent_objects_2 has no function 'NOBODY'"


@pytest.mark.parametrize("flag", ["0", "-3"])
def test_the_command_refuses_a_reply_size_below_one(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], flag: str
) -> None:
    """``--calls-per-reply`` 0 or negative: exit 1 with the API's own message, no proof printed."""
    source = INSTANCE + "\ndef plain():\n    return AGENT\n"
    code, out, err = command(
        tmp_path, monkeypatch, capsys, f"sizes_{flag[-1]}", source, f"sizes_{flag[-1]}:plain", "--calls-per-reply", flag
    )
    assert code == 1
    assert out == ""
    assert err.strip() == f"error: calls_per_reply must be None or an integer >= 1, got {flag}"
