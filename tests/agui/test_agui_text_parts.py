"""A user message made of content parts: its text parts reach the model as paragraphs; other parts are refused.

AG-UI's ``UserMessage.content`` is a string or an ordered list of parts
(text, image, audio, video, document; the legacy ``binary`` part left the
protocol in 1.0).  The agent's ``Message`` holds one text, so the text parts
become its paragraphs, a blank line between them (``PART_BREAK``), each as
sent: ``["2+3?", "In French."]`` is ``"2+3?\\n\\nIn French."``, never
``"2+3?In French."``.  A part the agent cannot take is refused naming its
type before the agent is even built, never dropped.  Sent over HTTP (both
stores) and by the official JS client under node; the model counts its
calls (``seen``), the tool its runs by call id, the app its agents built.
"""

from __future__ import annotations

import json
import subprocess
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from ag_ui.core import RunAgentInput
from starlette.testclient import TestClient
from support.agui_apps import Served, post
from support.programs import require_program

from fsm_agent import Agent, RunContext, ToolRegistry
from fsm_agent.agui import app
from fsm_agent.agui.protocol import PART_BREAK, RequestError, user_text
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

JS = Path(__file__).resolve().parent / "js"
PARTS = [{"type": "text", "text": "2+3?"}, {"type": "text", "text": "In French."}]
MEDIA = {
    "image": {"type": "image", "source": {"type": "url", "value": "https://example.com/cat.png"}},
    "audio": {"type": "audio", "source": {"type": "data", "value": "UklGRg==", "mimeType": "audio/wav"}},
    "video": {"type": "video", "source": {"type": "url", "value": "https://example.com/clip.mp4"}},
    "document": {"type": "document", "source": {"type": "file", "value": "file-123", "provider": "openai"}},
}


class Parts:
    """The app's agents: a scripted model per thread (its calls in ``seen``), a counted ``add``; agents counted."""

    def __init__(self) -> None:
        self.models: dict[str, FakeModel] = {}
        self.built: Counter[str] = Counter()
        self.ran: Counter[str] = Counter()

    def agent(self, run_input: RunAgentInput) -> Agent:
        thread = run_input.thread_id
        self.built[thread] += 1
        script = (tool_turn(tool_call("add", id="c1", a=2, b=3)), reply("cinq"))
        model = self.models.setdefault(thread, FakeModel(*script))
        registry = ToolRegistry()

        @registry.register
        def add(a: int, b: int, ctx: RunContext[None]) -> int:
            """Add two numbers."""
            self.ran[str(ctx.call_id)] += 1
            return a + b

        return Agent(model, registry)

    def asked(self, thread: str) -> list[str]:
        """The text of the user's message each model call of ``thread`` was sent."""
        return [next(m.content for m in sent if m.role == "user") for sent in self.models[thread].seen]


def body(thread: str, content: Any, run_id: str = "r1") -> dict[str, Any]:
    """A ``RunAgentInput`` whose one message is the user's, with ``content``."""
    return {
        "threadId": thread,
        "runId": run_id,
        "messages": [{"id": f"{run_id}-u", "role": "user", "content": content}],
    }


def test_text_parts_become_paragraphs_in_the_order_sent_each_as_sent() -> None:
    """A blank line between parts; a part's own spaces and newlines kept; an empty part adds no paragraph."""

    def text(content: Any) -> str:
        return user_text(RunAgentInput.model_validate(body("t", content)))

    assert PART_BREAK == "\n\n"
    assert text(PARTS) == "2+3?\n\nIn French."
    assert text([{"type": "text", "text": "one part"}]) == "one part"
    assert text("plain content, as sent") == "plain content, as sent"
    kept = [{"type": "text", "text": " a\nb "}, {"type": "text", "text": ""}, {"type": "text", "text": "c"}]
    assert text(kept) == " a\nb \n\nc"
    with pytest.raises(RequestError, match="the agent takes text only; the user's message holds audio, image parts"):
        text([MEDIA["image"], {"type": "text", "text": "and"}, MEDIA["audio"]])


@pytest.fixture
def served(store_target: str) -> Iterator[tuple[TestClient, Parts]]:
    """The app over ``store_target`` (SQLite, then PostgreSQL), in-process, and its agents' counts."""
    parts = Parts()
    with TestClient(app(parts.agent, store=store_target)) as client:
        yield client, parts


def test_over_http_the_model_is_sent_the_parts_as_paragraphs_and_the_thread_keeps_them(
    served: tuple[TestClient, Parts], store_target: str
) -> None:
    """The turn runs once (the tool once, two model calls), every call sent the joined text, and it is stored so."""
    client, parts = served
    events = post(client, body("t-parts", PARTS))
    end = events[-1]
    assert (end["type"], end["outcome"], end["result"]) == ("RUN_FINISHED", {"type": "success"}, "cinq")
    assert parts.asked("t-parts") == ["2+3?\n\nIn French."] * 2
    assert (parts.built, parts.ran) == (Counter({"t-parts": 1}), Counter({"c1": 1}))
    with open_store(store_target) as store:
        stored = store.load("t-parts/1")
    assert [m["content"] for m in stored["messages"] if m["role"] == "user"] == ["2+3?\n\nIn French."]


@pytest.mark.parametrize("kind", sorted(MEDIA))
def test_a_part_the_agent_cannot_take_is_refused_naming_its_type_before_anything_is_built(
    served: tuple[TestClient, Parts], store_target: str, kind: str
) -> None:
    """RUN_ERROR naming the part's type; no agent built, no call, no turn stored; the thread's next turn is turn 1."""
    client, parts = served
    events = post(client, body("t-media", [{"type": "text", "text": "Look:"}, MEDIA[kind]]))
    assert [e["type"] for e in events] == ["RUN_STARTED", "RUN_ERROR"]
    assert events[-1]["message"] == f"the agent takes text only; the user's message holds {kind} parts"
    assert (events[-1]["code"], parts.built, parts.models) == ("RequestError", Counter(), {})
    with open_store(store_target) as store, pytest.raises(KeyError):
        store.load("t-media/1")
    assert post(client, body("t-media", PARTS, run_id="r2"))[-1]["result"] == "cinq"
    assert (parts.asked("t-media"), parts.ran) == (["2+3?\n\nIn French."] * 2, Counter({"c1": 1}))
    with open_store(store_target) as store:
        assert store.load("t-media/1")["final"] == "cinq"


def test_a_legacy_binary_part_is_refused_with_422_naming_it(served: tuple[TestClient, Parts]) -> None:
    """``binary`` left the protocol in 1.0: the request is no RunAgentInput, a 422 that names the part's tag."""
    client, parts = served
    legacy = {"type": "binary", "mimeType": "application/pdf", "data": "JVBERi0xLjQK"}
    refused = client.post("/", json=body("t-binary", [{"type": "text", "text": "Read this."}, legacy]))
    assert refused.status_code == 422
    assert "is not an AG-UI RunAgentInput" in refused.json()["error"]
    assert "'binary'" in refused.json()["error"]
    assert (parts.built, parts.ran) == (Counter(), Counter())


@pytest.mark.subprocess
def test_the_official_client_sends_parts_that_reach_the_model_as_paragraphs_and_media_refused(tmp_path: Path) -> None:
    """@ag-ui/client under node: two text parts make one turn sent "2+3?\\n\\nIn French."; an image (and a legacy
    binary part, which the client upgrades on its way out) end in RUN_ERROR naming the part's type, nothing built."""
    node = require_program("node", "install Node.js 20 or later")
    if not (JS / "node_modules" / "@ag-ui" / "client").is_dir():
        pytest.fail(f"@ag-ui/client is not installed: run `npm ci` in {JS} (.ci/run does)")
    parts = Parts()
    served = Served(app(parts.agent, store=str(tmp_path / "threads.db")))
    try:
        # Measured: 1 s on an idle machine, under 3 s beside two CPU hogs; the timeout is 40 times that.
        done = subprocess.run(
            [node, "run_text_parts.mjs", served.url], cwd=JS, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        served.close()
    assert done.returncode == 0, done.stderr
    seen = json.loads(done.stdout)
    assert seen["parts"]["sent"] == PARTS  # the client sent the parts as parts
    assert (seen["parts"]["failed"], seen["parts"]["finished"]) == (None, {"outcome": "success", "result": "cinq"})
    assert parts.asked("js-parts") == ["2+3?\n\nIn French."] * 2
    assert seen["image"]["error"] == {
        "code": "RequestError",
        "message": "the agent takes text only; the user's message holds image parts",
    }
    assert seen["image"]["events"] == ["RUN_STARTED", "RUN_ERROR"]
    # The client keeps the legacy part it was given and sends it upgraded (a PDF: a document part), refused as one.
    assert seen["binary"]["sent"][1]["type"] == "binary"
    assert seen["binary"]["error"]["message"] == "the agent takes text only; the user's message holds document parts"
    assert (parts.built, parts.ran) == (Counter({"js-parts": 1}), Counter({"c1": 1}))
