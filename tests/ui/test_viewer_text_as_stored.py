"""Stored text reaches the viewer's JSON exactly as the store keeps it: astral characters and lone surrogates.

A provider can send half an emoji (a lone surrogate); the store keeps it
(``fsm_agent.jsontext``) and the command line shows it escaped.  The viewer's
run page, its event stream and its compare page must still answer, with the
very string the store holds.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient

from fsm_agent import Agent, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.ui import create_app

BASE = "http://127.0.0.1:8765"
ASTRAL = "\U0001f600 \U0001d49c \U00010348 <b>bold</b> & \u202etxet"
"""Characters outside the BMP, markup and a bidi override: all text, kept as it is."""
HALF = "half an emoji: \ud83d, and a low half \udc80 alone"
"""Two lone surrogates, as a provider can send them."""


def text_run(store: SqliteStore, run_id: str, answer: str, argument: str) -> None:
    """A finished run: one ``echo`` call with ``argument``, then ``answer``."""
    model = FakeModel([tool_turn(tool_call("echo", id="call_e", text=argument), content=argument), reply(answer)])
    Agent(model, demo_registry()).run(f"say {argument}", store=store, run_id=run_id)


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store with one run of astral text (``astral``) and one with lone surrogates (``half``)."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        text_run(opened, "astral", ASTRAL, ASTRAL)
        text_run(opened, "half", HALF, HALF)
        assert opened.load("half")["final"] == HALF  # the store keeps them
        yield opened


def client(store: SqliteStore) -> TestClient:
    """A viewer over ``store`` that answers a server error with a 500 instead of raising it here."""
    return TestClient(create_app(store), base_url=BASE, raise_server_exceptions=False)


def texts(page: dict[str, Any]) -> tuple[str, str, str]:
    """The final text, the tool call's argument and the tool result's text of a run page."""
    call = next(m["call"] for m in page["moments"] if m["call"] is not None)
    result = next(m["result"] for m in page["moments"] if m["result"] is not None)
    return page["final"], call["arguments"]["text"], json.loads(result["content"])


def events(viewer: TestClient, run_id: str) -> str:
    """The whole event stream of a finished run."""
    with viewer.stream("GET", "/api/events", params={"id": run_id}) as response:
        assert response.status_code == 200
        return "".join(response.iter_text())


def test_astral_characters_and_markup_come_back_exactly_on_the_run_page_and_the_stream(store: SqliteStore) -> None:
    """The page's JSON and the followed run's digest hold the stored strings, character for character."""
    viewer = client(store)
    answer = viewer.get("/api/run", params={"id": "astral"})
    assert answer.status_code == 200
    assert texts(answer.json()) == (ASTRAL, ASTRAL, ASTRAL)
    stream = events(viewer, "astral")
    assert stream.endswith("event: end\ndata: {}\n\n")
    digest = json.loads(stream.split("data: ", 1)[1].split("\n\n", 1)[0])
    assert texts(digest) == (ASTRAL, ASTRAL, ASTRAL)


def test_a_run_with_a_lone_surrogate_is_shown_with_it(store: SqliteStore) -> None:
    """The run page answers 200, with the lone surrogates as the store holds them."""
    answer = client(store).get("/api/run", params={"id": "half"})
    assert answer.status_code == 200
    assert texts(answer.json()) == (HALF, HALF, HALF)


def test_following_a_run_with_a_lone_surrogate_sends_it_and_ends(store: SqliteStore) -> None:
    """The event stream of the finished run is its digest, then ``end``."""
    stream = events(client(store), "half")
    assert stream.count('data: {"run_id"') == 1
    assert stream.endswith("event: end\ndata: {}\n\n")


def test_a_run_with_a_lone_surrogate_compares_with_another(store: SqliteStore) -> None:
    """Compare answers 200 and finds where the two runs' messages part."""
    answer = client(store).get("/api/compare", params={"a": "half", "b": "astral"})
    assert answer.status_code == 200
    assert answer.json()["first_message"] == 0
