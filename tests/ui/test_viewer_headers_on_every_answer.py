"""The viewer's security headers on every answer: pages, API, static files, errors, refusals, streams, zips.

``app.HEADERS`` says they are "Sent with every response"; the tutorial's
"Who can see it" lists the Host check and the Origin/JSON check on POSTs.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.fork_agents import make
from support.ui_runs import all_runs

from fsm_agent import SqliteStore
from fsm_agent.ui import create_app
from fsm_agent.ui.app import HEADERS

BASE = "http://127.0.0.1:8765"
JSON = {"content-type": "application/json"}


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A stopped, a finished, a paused and a hostile run."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        all_runs(opened)
        yield opened


def client(store: SqliteStore) -> TestClient:
    """A viewer that decides and re-runs, as a browser on this machine addresses it."""
    viewer = create_app(store, allow_decisions=True, agent=make(), agent_spec="support.fork_agents:make")
    return TestClient(viewer, base_url=BASE, raise_server_exceptions=False)


def assert_guarded(headers: object, what: str) -> None:
    """Every one of ``HEADERS``, with its value."""
    got = {name: headers.get(name) for name in HEADERS}  # type: ignore[attr-defined]
    assert got == HEADERS, what


@pytest.mark.parametrize(
    ("method", "path", "kwargs", "status"),
    [
        ("GET", "/", {}, 200),
        ("GET", "/run?id=finished", {}, 200),
        ("GET", "/static/app.js", {}, 200),
        ("GET", "/static/app.css", {}, 200),
        ("GET", "/static/missing.js", {}, 404),
        ("GET", "/nowhere", {}, 404),
        ("GET", "/api/runs?offset=x", {}, 400),
        ("GET", "/api/run?id=gone", {}, 404),
        ("GET", "/api/test?id=finished", {}, 200),
        ("GET", "/api/compare?a=finished&b=gone", {}, 404),
        ("POST", "/api/runs", {}, 405),
        ("POST", "/api/decide?id=paused", {"content": b"call_id=call_mail&approve=1"}, 415),
        ("POST", "/api/decide?id=paused", {"json": {"call_id": "call_mail"}, "headers": {"origin": BASE}}, 400),
        (
            "POST",
            "/api/decide?id=paused",
            {"json": {"call_id": "call_mail", "approve": True}, "headers": {"origin": "http://evil.example"}},
            403,
        ),
        ("POST", "/api/fork?id=finished", {"json": {"at": "x"}, "headers": {"origin": BASE}}, 400),
    ],
)
def test_every_answer_carries_the_security_headers(
    store: SqliteStore, method: str, path: str, kwargs: dict[str, object], status: int
) -> None:
    """Pages, static files, API answers and their errors and refusals all carry the CSP and its companions."""
    answer = client(store).request(method, path, **kwargs)  # type: ignore[arg-type]
    assert answer.status_code == status, answer.text
    assert_guarded(answer.headers, f"{method} {path}")


def test_the_event_stream_carries_the_security_headers(store: SqliteStore) -> None:
    """A followed run's stream is an answer too."""
    with client(store).stream("GET", "/api/events", params={"id": "finished"}) as answer:
        assert answer.status_code == 200
        assert_guarded(answer.headers, "/api/events")


def test_a_refused_post_changes_nothing(store: SqliteStore) -> None:
    """A form post, a post from another origin, and one for another host: the call stays undecided."""
    viewer = client(store)
    body = {"call_id": "call_mail", "approve": True}
    assert viewer.post("/api/decide", params={"id": "paused"}, content=b"call_id=call_mail").status_code == 415
    refused = viewer.post("/api/decide", params={"id": "paused"}, json=body, headers={"origin": "http://evil.example"})
    assert refused.status_code == 403
    rebound = viewer.post("/api/decide", params={"id": "paused"}, json=body, headers={"host": "evil.example"})
    assert rebound.status_code == 421
    elsewhere = {"host": "evil.example"}
    assert viewer.post("/api/fork", params={"id": "finished"}, json={"at": 1}, headers=elsewhere).status_code == 421
    assert store.load("paused")["approvals"] == {}
    assert [run.run_id for run in store.list_runs()] == ["hostile", "paused", "finished", "stopped"]


def test_a_refused_host_is_answered_with_the_security_headers(store: SqliteStore) -> None:
    """The 421 for a Host the viewer was not bound to is an answer too, and carries the headers."""
    answer = client(store).get("/", headers={"host": "evil.example"})
    assert answer.status_code == 421
    assert_guarded(answer.headers, "421")
