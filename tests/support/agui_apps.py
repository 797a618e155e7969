"""The AG-UI adapter's test agents (tool run, streamed answer, stop, approval, sub-agent), and the app served.

``scenario_app()`` builds one app whose ``agent_factory`` picks the agent by
the request's ``forwardedProps["scenario"]``; the model of each thread is
kept across its requests, so a resumed turn's model goes on with its script
as one model serving a conversation would.  ``Served`` runs an app under
uvicorn on a free loopback port, for clients in another process (node) and
for a client that goes away.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.agui import AgUiApp, app
from fsm_agent.cli.ui import bind, url_of
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class StreamingModel(FakeModel):
    """A ``FakeModel`` that streams each scripted reply's text in pieces of ``size`` characters."""

    def __init__(self, *script: ModelResponse, size: int = 4) -> None:
        super().__init__(*script)
        self.size = size

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], text: Callable[[str], object]
    ) -> ModelResponse:
        """The next scripted reply, its text handed to ``text`` piece by piece first."""
        response = self.complete(messages, tools)
        content = response.message.content
        for start in range(0, len(content), self.size):
            text(content[start : start + self.size])
            await asyncio.sleep(0)
        return response


STREAMED = "The answer, streamed in pieces."
"""The streamed scenario's answer."""


class Scenarios:
    """The agents of the scenarios, one model per thread kept across requests; ``executed`` counts each tool's runs."""

    def __init__(self) -> None:
        self.models: dict[str, Any] = {}
        self.executed: dict[str, int] = {}
        self.gate = threading.Event()
        """What the ``wait`` tool waits for (set it to let the tool finish)."""
        self.entered = threading.Event()
        """Set when the ``wait`` tool starts."""
        self.server: AgUiApp | None = None

    def registry(self) -> ToolRegistry:
        """``demo_registry`` with counted tools: ``send`` (to approve), ``wait`` (holds on ``gate``), ``stop_me``."""
        registry = demo_registry()
        executed = self.executed

        @registry.register
        def send(to: str) -> str:
            """Send a message (counted)."""
            executed["send"] = executed.get("send", 0) + 1
            return f"sent to {to}"

        @registry.register
        def wait() -> str:
            """Wait until the test lets go."""
            executed["wait"] = executed.get("wait", 0) + 1
            self.entered.set()
            self.gate.wait(30)
            return "waited"

        @registry.register
        def stop_me(thread: str) -> str:
            """Cancel this thread's turn from the server's side."""
            assert self.server is not None
            return "cancelling" if self.server.cancel(thread, "the user pressed stop") else "no turn"

        return registry

    def model(self, thread: str, scenario: str) -> Any:
        """The thread's model, made on its first request."""
        if thread not in self.models:
            self.models[thread] = _MODELS[scenario](thread)
        return self.models[thread]

    def agent(self, run_input: Any) -> Agent:
        """The ``agent_factory``: a fresh agent per request, over the thread's model."""
        scenario = (run_input.forwarded_props or {}).get("scenario", "tool")
        model = self.model(run_input.thread_id, scenario)
        registry = self.registry()
        if scenario == "subagent":
            helper = Agent(
                FakeModel(tool_turn(tool_call("echo", id="k1", text="inner")), reply("inner done")), registry
            )
            registry = self.registry()
            registry.register(helper.as_tool("helper", "Asks the helper agent."))
        if scenario == "stop":
            return Agent(model, registry, max_steps=2)
        if scenario == "returned":
            return Agent(model, registry, max_steps=2, on_stop={"max_steps": "return"})
        if scenario == "approve":
            return Agent(model, registry, approve={"send"})
        return Agent(model, registry)


def _tool(_: str) -> Any:
    return FakeModel(
        tool_turn(tool_call("add", id="c1", a=2, b=3), usage=Usage(10, 2)), reply("2 + 3 = 5", usage=Usage(20, 3))
    )


def _stream(_: str) -> Any:
    return StreamingModel(reply(STREAMED, usage=Usage(7, 8)))


def _loop(_: str) -> Any:
    return FakeModel(tool_turn(tool_call("echo", id=f"e{n}", text=f"turn {n}")) for n in range(1, 9))


def _approve(_: str) -> Any:
    return FakeModel(
        tool_turn(tool_call("send", id="s1", to="ada"), usage=Usage(4, 1)), reply("Sent.", usage=Usage(6, 2))
    )


def _wait(_: str) -> Any:
    return FakeModel(tool_turn(tool_call("wait", id="w1")), reply("after the wait"), reply("second turn"))


def _cancel(thread: str) -> Any:
    return FakeModel(tool_turn(tool_call("stop_me", id="x1", thread=thread)), reply("never said"))


def _subagent(_: str) -> Any:
    return FakeModel(tool_turn(tool_call("helper", id="h1", input="look it up")), reply("the helper said so"))


_MODELS: dict[str, Callable[[str], Any]] = {
    "tool": _tool,
    "stream": _stream,
    "stop": _loop,
    "returned": _loop,
    "approve": _approve,
    "wait": _wait,
    "cancel": _cancel,
    "subagent": _subagent,
}


def scenario_app(**options: Any) -> tuple[AgUiApp, Scenarios]:
    """The app serving every scenario, and the scenarios (their models and tool counts)."""
    scenarios = Scenarios()
    served = app(scenarios.agent, **options)
    scenarios.server = served
    return served, scenarios


def run_input(thread: str, scenario: str, text: str = "go", run_id: str = "r1", **extra: Any) -> dict[str, Any]:
    """A ``RunAgentInput`` as a client sends it: the user's message, the scenario in ``forwardedProps``."""
    message = {"id": f"{run_id}-user", "role": "user", "content": text}
    return {
        "threadId": thread,
        "runId": run_id,
        "messages": [message],
        "forwardedProps": {"scenario": scenario},
        **extra,
    }


def parse_sse(lines: Sequence[str]) -> list[dict[str, Any]]:
    """The events of a server-sent event stream's lines (``data: {json}``, blank lines between)."""
    return [json.loads(line.removeprefix("data: ")) for line in lines if line.startswith("data: ")]


class Served:
    """An app served by uvicorn on a free loopback port in a thread of this process."""

    def __init__(self, asgi: Any) -> None:
        import uvicorn  # the agui extra; only the tests that serve over a socket need it

        self.socket = bind("127.0.0.1", 0)
        self.url = url_of(self.socket)
        config = uvicorn.Config(asgi, log_level="warning", lifespan="off", timeout_graceful_shutdown=1)
        self.server = uvicorn.Server(config)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.socket]}, daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 10
        while not self.server.started and time.monotonic() < deadline:
            time.sleep(0.02)
        assert self.server.started, "the AG-UI app did not start"

    def close(self) -> None:
        """Stop serving and wait for the thread."""
        self.server.should_exit = True
        self.thread.join(10)
        self.socket.close()


def post(client: Any, body: dict[str, Any]) -> list[dict[str, Any]]:
    """POST ``body`` through ``client`` (starlette's ``TestClient``): the events, each checked as an AG-UI event."""
    from ag_ui.core import Event
    from pydantic import TypeAdapter

    with client.stream("POST", "/", json=body) as response:
        assert response.status_code == 200, response.read()
        assert response.headers["content-type"].startswith("text/event-stream")
        events = parse_sse(list(response.iter_lines()))
    checker: TypeAdapter[Any] = TypeAdapter(Event)
    for event in events:
        checker.validate_python(event)
    return events


def outline(events: Sequence[dict[str, Any]]) -> list[str]:
    """The events' types, a step's name after its type, without the state snapshots: the shape a test reads."""
    shown = []
    for event in events:
        kind = event["type"]
        if kind == "STATE_SNAPSHOT":
            continue
        name = event.get("stepName") or event.get("toolCallName")
        shown.append(f"{kind} {name}" if name else kind)
    return shown
