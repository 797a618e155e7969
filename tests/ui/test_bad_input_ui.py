"""The viewer's list refuses a page it cannot give instead of quietly giving another one."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.ui_runs import finished

from fsm_agent import SqliteStore
from fsm_agent.ui import create_app

BASE = "http://127.0.0.1:8765"


@pytest.mark.parametrize("offset", ["-1", "-25"])
def test_a_negative_offset_is_a_400_not_the_first_page(tmp_path: Path, offset: str) -> None:
    """``/api/runs?offset=-1``: refused as the 400 says (a whole number from 0), not answered with page one."""
    with SqliteStore(tmp_path / "runs.db") as store:
        finished(store)
        response = TestClient(create_app(store), base_url=BASE).get("/api/runs", params={"offset": offset})
    assert response.status_code == 400
    assert "offset must be a whole number from 0" in response.json()["error"]
