"""The viewer's list refuses a page it cannot give instead of quietly giving another one."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.ui_runs import finished

import fsm_agent.ui.app
from fsm_agent import SqliteStore
from fsm_agent.persist import StoredRun
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


@pytest.mark.parametrize(
    "after",
    ["", "x", "r1", "1.5", ":r1", "1.5:", "nan:r1", "inf:r1", "1e999:r1", " 1.5:r1", "1_5:r1", "1.5:\x00"],
)
def test_a_cursor_that_is_no_cursor_is_a_400_naming_after_not_the_first_page(tmp_path: Path, after: str) -> None:
    """``/api/runs?after=x``: refused, saying what a cursor is, not answered with page one or a server error."""
    with SqliteStore(tmp_path / "runs.db") as store:
        finished(store)
        response = TestClient(create_app(store), base_url=BASE).get("/api/runs", params={"after": after})
    assert response.status_code == 400, response.text
    assert response.json()["error"].startswith("after must be the cursor of a page of this list: ")


def test_a_cursor_and_an_offset_at_once_is_a_400_naming_both(tmp_path: Path) -> None:
    """``?after=...&offset=3`` has two starting points: refused, not one of them quietly taken."""
    with SqliteStore(tmp_path / "runs.db") as store:
        finished(store)
        viewer = TestClient(create_app(store), base_url=BASE)
        cursor = "1.5:finished"
        assert viewer.get("/api/runs", params={"after": cursor}).status_code == 200
        response = viewer.get("/api/runs", params={"after": cursor, "offset": "3"})
    assert response.status_code == 400
    assert response.json()["error"] == "give after (the older link's cursor) or offset, not both"


class ListingByOffsetOnly:
    """A store written before list_runs took ``order`` and ``after``: what the viewer pages by, it cannot give."""

    def load(self, run_id: str) -> dict[str, Any]:
        raise KeyError(run_id)

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        raise KeyError(run_id)

    def list_runs(
        self,
        *,
        state: str | None = None,
        reason: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        session: str | None = None,
    ) -> list[StoredRun]:
        return []


def test_a_store_that_cannot_list_in_creation_order_is_a_501_saying_so_not_a_500() -> None:
    """The list over a store without ``list_runs(order=..., after=...)``: a 501 naming what it lacks."""
    response = TestClient(create_app(ListingByOffsetOnly()), base_url=BASE).get("/api/runs")  # type: ignore[arg-type]
    assert response.status_code == 501
    error = response.json()["error"]
    assert error.startswith("this store cannot list its runs in creation order, which the viewer pages by: ")
    assert "order" in error


class ListingNoCreationTime(ListingByOffsetOnly):
    """A store whose list_runs takes ``order`` and ``after`` but lists no ``created``: no cursor follows its runs."""

    def list_runs(self, **filters: Any) -> list[StoredRun]:  # type: ignore[override]
        return [StoredRun(f"r{i}", "Done", "done", False, 1.0) for i in range(3)]


def test_a_store_that_lists_no_creation_time_is_a_501_once_a_next_page_needs_a_cursor(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Three runs without ``created``: one page of three is listed; pages of two need a cursor, which is a 501."""
    viewer = TestClient(create_app(ListingNoCreationTime()), base_url=BASE)  # type: ignore[arg-type]
    assert [run["run_id"] for run in viewer.get("/api/runs").json()["runs"]] == ["r0", "r1", "r2"]
    monkeypatch.setattr(fsm_agent.ui.app, "PAGE_SIZE", 2)
    response = viewer.get("/api/runs")
    assert response.status_code == 501
    assert "run 'r1' was listed without its creation time" in response.json()["error"]
