"""A loopback HTTP server that answers like a model provider, from recorded response bodies queued per test.

The official SDK clients talk to it over real HTTP (``base_url``), so the
tests exercise the SDKs' own request building, response parsing, error
classes and retries rather than mocks of them.  It binds 127.0.0.1 only, on a
free port, and records every request so tests can check the converted bodies.
The helpers at the end are what the adapter tests of both providers share.
"""

from __future__ import annotations

import json
import threading
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from types import TracebackType
from typing import Any, Self

import pytest

from fsm_agent import Agent, AgentLoopError

BODIES = Path(__file__).parent / "provider_bodies"
QUESTION = "What is (2+3)*4?"
FAST = {"retry-after-ms": "1"}  # the SDK honours it, so retries in these tests wait a millisecond


def body(provider: str, name: str) -> dict[str, Any]:
    """A recorded response body, ``tests/support/provider_bodies/<provider>/<name>.json``."""
    loaded: dict[str, Any] = json.loads((BODIES / provider / f"{name}.json").read_text(encoding="utf-8"))
    return loaded


def openai_tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The recorded OpenAI tool-call body, asking for tool ``name`` with ``arguments``."""
    data = body("openai", "tool_call")
    function = data["choices"][0]["message"]["tool_calls"][0]["function"]
    function.update(name=name, arguments=json.dumps(arguments))
    return data


@dataclass
class Received:
    """One request the server got: path, headers (lower-cased names) and the decoded JSON body."""

    method: str
    path: str
    headers: dict[str, str]
    json: Any


@dataclass
class Reply:
    """One queued answer: status, JSON body (or a function of the request building it) and extra headers."""

    body: dict[str, Any] | Callable[[Received], dict[str, Any]]
    status: int = 200
    headers: dict[str, str] = field(default_factory=dict)
    sse: str | None = None
    """A streamed answer: this server-sent-events text is sent as ``text/event-stream`` instead of ``body``."""
    html: str | None = None
    """An answer that is not JSON (a proxy's error page, say): sent as ``text/html`` instead of ``body``."""


def streamed(provider: str, name: str) -> Reply:
    """A recorded streaming body, ``tests/support/provider_bodies/<provider>/<name>.sse``, as a reply."""
    return Reply({}, sse=(BODIES / provider / f"{name}.sse").read_text(encoding="utf-8"))


def _events(sse: str) -> list[dict[str, Any]]:
    """The JSON objects of a server-sent-events text (its ``data:`` lines), as a rule sees a streamed answer."""
    data = (line.removeprefix("data:").strip() for line in sse.splitlines() if line.startswith("data:"))
    return [json.loads(text) for text in data if text.startswith("{")]


Rule = Callable[[Received, list[dict[str, Any]]], "Reply | None"]
"""A provider's check of a request, given every body served so far: the provider's error reply, or ``None``."""


class ProviderServer:
    """Serves queued replies in order and records the requests; an unexpected request gets a 400.

    ``rules`` are checked before a queued reply is taken: the first that
    finds fault answers with the provider's own error, as the real API
    would, and the queued reply stays for the next request.
    """

    def __init__(self) -> None:
        self.replies: deque[Reply] = deque()
        self.requests: list[Received] = []
        self.rules: list[Rule] = []
        self.served: list[dict[str, Any]] = []
        self._lock = threading.Lock()
        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        # A short poll interval makes shutdown (which waits for the next poll) take milliseconds, not half a second.
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, args=(0.01,), name="provider-server", daemon=True
        )

    @property
    def url(self) -> str:
        """The server's root URL, e.g. ``http://127.0.0.1:40123``."""
        host, port = self._httpd.server_address[:2]
        return f"http://{host!s}:{port}"

    def queue(self, *replies: Reply | dict[str, Any]) -> None:
        """Append replies; a bare dict is a 200 with that JSON body."""
        with self._lock:
            self.replies.extend(r if isinstance(r, Reply) else Reply(r) for r in replies)

    def bodies(self) -> list[Any]:
        """The JSON bodies received so far, in order."""
        return [r.json for r in self.requests]

    def __enter__(self) -> Self:
        self._thread.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._httpd.shutdown()
        self._httpd.server_close()
        self._thread.join()

    def _next(self, received: Received) -> Reply:
        with self._lock:
            self.requests.append(received)
            for rule in self.rules:
                rejection = rule(received, self.served)
                if rejection is not None:
                    return rejection
            if self.replies:
                return self.replies.popleft()
        return Reply({"error": {"message": "no reply queued for this request", "type": "test_error"}}, 400)

    def _sent(self, status: int, payload: dict[str, Any] | list[dict[str, Any]]) -> None:
        if status == 200:  # only answers count as issued content, errors issue nothing
            with self._lock:
                self.served.extend(payload if isinstance(payload, list) else [payload])

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        server = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0: one request per connection, so no handler thread outlives the test waiting on keep-alive.
            protocol_version = "HTTP/1.0"

            def do_POST(self) -> None:
                length = int(self.headers.get("content-length", "0"))
                raw = self.rfile.read(length)
                headers = {name.lower(): value for name, value in self.headers.items()}
                received = Received("POST", self.path, headers, json.loads(raw) if raw else None)
                reply = server._next(received)
                payload = reply.body(received) if callable(reply.body) else reply.body
                server._sent(reply.status, payload if reply.sse is None else _events(reply.sse))
                data, kind = json.dumps(payload).encode(), "application/json"
                if reply.sse is not None:
                    data, kind = reply.sse.encode(), "text/event-stream"
                elif reply.html is not None:
                    data, kind = reply.html.encode(), "text/html; charset=utf-8"
                self.send_response(reply.status)
                self.send_header("content-type", kind)
                self.send_header("content-length", str(len(data)))
                for name, value in reply.headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the stdlib's signature
                """Keep the test output clean."""

        return Handler


def stop_of(agent: Agent, question: str = QUESTION) -> AgentLoopError:
    """The stop that ``agent.run(question)`` raises; the test fails if the run returns."""
    with pytest.raises(AgentLoopError) as info:
        agent.run(question)
    return info.value
