"""``/api/test`` (the page's "Save as test") for every kind of run: unpacked in a temporary folder, pytest is green.

The tutorial (viewer.md, "Re-running, comparing, saving as a test") says the
zip's pytest file replays the agent against the recording and fails only
where it departs from it: so for the agent that made the run it passes,
whether the run answered, stopped on a limit, paused for approval, or holds
astral characters, markup and half an emoji.
"""

from __future__ import annotations

import contextlib
import importlib
import io
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient

from fsm_agent import AgentLoopError, SqliteStore
from fsm_agent.ui import create_app

pytestmark = pytest.mark.subprocess

AGENTS = '''
"""The agents whose runs are saved as tests."""

from fsm_agent import Agent
from fsm_agent.testing import CounterModel, FakeModel, demo_registry, reply, tool_call, tool_turn

ODD = "\\U0001f600 <script>alert(1)</script> \\ud83d"


def answering():
    return Agent(FakeModel([tool_turn(tool_call("add", id="c1", a=2, b=3)), reply("5")]), demo_registry())


def counting():
    return Agent(CounterModel(), demo_registry(), max_steps=2)


def careful():
    model = FakeModel([tool_turn(tool_call("echo", id="c1", text="hi")), reply("said")])
    return Agent(model, demo_registry(), approve={"echo"})


def odd():
    return Agent(FakeModel([tool_turn(tool_call("echo", id="c1", text=ODD)), reply(ODD)]), demo_registry())
'''


def save_and_replay(tmp_path: Path, factory: str) -> subprocess.CompletedProcess[str]:
    """Run ``saved_agents:<factory>``'s agent into a store, save it from the viewer, replay the zip with pytest."""
    (tmp_path / "saved_agents.py").write_text(AGENTS, encoding="utf-8")
    sys.path.insert(0, str(tmp_path))
    try:
        module = importlib.import_module("saved_agents")
        agent = getattr(module, factory)()
        with SqliteStore(tmp_path / "runs.db") as store:
            with contextlib.suppress(AgentLoopError):  # a stop is stored like any other ending
                agent.run("go", store=store, run_id=f"{factory}-run")
            viewer = TestClient(
                create_app(store, agent=agent, agent_spec=f"saved_agents:{factory}"), base_url="http://127.0.0.1:8765"
            )
            answer = viewer.get("/api/test", params={"id": f"{factory}-run"})
    finally:
        sys.path.remove(str(tmp_path))
        sys.modules.pop("saved_agents", None)
    assert answer.status_code == 200, answer.text
    folder = tmp_path / "saved"
    zipfile.ZipFile(io.BytesIO(answer.content)).extractall(folder)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)]
    return subprocess.run(command, capture_output=True, text=True, cwd=folder, env=env, timeout=120, check=False)


@pytest.mark.parametrize("factory", ["answering", "counting", "odd"])
def test_a_saved_run_replays_green_in_a_temporary_folder(tmp_path: Path, factory: str) -> None:
    """An answer, a max_steps stop, and a run of odd text: each zip's test passes against its recording."""
    outcome = save_and_replay(tmp_path, factory)
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert "1 passed" in outcome.stdout


def test_a_saved_paused_run_replays_green_in_a_temporary_folder(tmp_path: Path) -> None:
    """A run paused for approval, saved and replayed with the agent that made it: the test passes."""
    outcome = save_and_replay(tmp_path, "careful")
    assert outcome.returncode == 0, outcome.stdout + outcome.stderr
    assert "1 passed" in outcome.stdout
