"""The office run paused in a store, and ``runs resume`` on it from the command line, with every tool call counted.

The agent module written for the command line counts each tool call in the
file ``OFFICE_EFFECTS`` names, so a call made by any process (or twice) shows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent
from fsm_agent.__main__ import main as cli
from fsm_agent.persist import open_store

RUN = "job"

AGENT_MODULE = """
from pathlib import Path
import os
from support.shared_runs import Effects, office

def make():
    return office(Effects(Path(os.environ["OFFICE_EFFECTS"])), approve=False)[0]
"""


def paused(store_target: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, module: str, agent: Agent) -> Path:
    """``agent``'s office run paused in ``store_target``; an agent module ``module:make`` logging its calls; the log."""
    with open_store(store_target) as store:
        assert agent.run("tidy up", store=store, run_id=RUN).reason == "paused"
    log = tmp_path / "effects.txt"
    (tmp_path / f"{module}.py").write_text(AGENT_MODULE, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("OFFICE_EFFECTS", str(log))
    return log


def stored(store_target: str) -> dict[str, Any]:
    """The run as ``store_target`` holds it."""
    with open_store(store_target) as store:
        return store.load(RUN)


def resume(store_target: str, module: str, *decisions: str) -> int:
    """``runs resume`` of the run with ``module:make``, quietly, with ``decisions``: its exit code."""
    return cli(["runs", "resume", RUN, "--store", store_target, "--agent", f"{module}:make", "--quiet", *decisions])
