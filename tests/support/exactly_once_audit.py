"""What the exactly-once audit tests share: a three-level agent (parent, child, grandchild) whose every call is counted.

The parent's model asks, in one reply, for ``work("a")`` and the ``outer``
sub-agent; the child (``outer``) asks, in one reply, for ``work("c")`` and the
``inner`` sub-agent; the grandchild (``inner``) asks for ``work("g")``.  Each
then answers with the tool results it got back.  Every model answers by the
conversation it is sent, so any agent built here continues a run another one
started, in this process or another.

Everything is counted in a file (``Tally``), one line per event, so a run
killed in a child process (``os._exit``) and resumed in the test's process is
counted alike: ``try <label>`` as a tool call starts, ``done <label>`` once its
side effect is made, ``model <who>`` for each model call.
"""

from __future__ import annotations

import asyncio
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.exactly_once import Cut
from support.store_cases import child_process, durable_calls

WAIT = 60.0
"""How long a cut waits for the outcomes it needs to be durable; measured well under 2 s on a loaded machine."""
LEASE = 0.5
"""A cut owner's lease: short, so a new owner takes the run over soon; a live owner's heartbeat keeps it."""

_LOCK = threading.Lock()


class Tally:
    """Events appended to a file, one per line, readable from any process."""

    def __init__(self, path: Path | str) -> None:
        self.path = Path(path)

    def add(self, line: str) -> None:
        with _LOCK:
            fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
            try:
                os.write(fd, (line + "\n").encode())
            finally:
                os.close(fd)

    def lines(self) -> list[str]:
        return self.path.read_text(encoding="utf-8").splitlines() if self.path.exists() else []

    def counts(self, kind: str) -> dict[str, int]:
        """How often each label was seen with ``kind`` (``try``, ``done``, ``model``)."""
        found: Counter[str] = Counter()
        for line in self.lines():
            head, _, label = line.partition(" ")
            if head == kind:
                found[label] += 1
        return dict(found)


Ready = Callable[[], bool]


class Cutter(Cut):
    """``Cut`` named by label first: how a call with label ``at`` (a tool's label, or ``answer:<who>``: a model's
    answer) is cut, once, after ``ready()`` holds."""

    def __init__(self, at: str, ready: Ready | None = None, how: str = "ctrl_c") -> None:
        super().__init__(ready, at, how=how)


class ByHistory:
    """A model whose reply depends only on the history: ``first`` first, then an answer naming the tool results."""

    def __init__(self, who: str, first: ModelResponse, tally: Tally, cut: Cutter | None = None) -> None:
        self.who, self.first, self.tally, self.cut = who, first, tally, cut

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.tally.add(f"model {self.who}")
        if not any(m.role == "assistant" for m in messages):
            return self.first
        if self.cut is not None:
            self.cut.fire(f"answer:{self.who}")  # the cut of a model call: its answer
        results = sorted(m.content for m in messages if m.role == "tool")
        return reply(f"{self.who}: " + ", ".join(results))


def work_registry(tally: Tally, cut: Cutter | None) -> ToolRegistry:
    """``work(label)``: counts its try, may be cut before its side effect, then counts the side effect."""
    tools = ToolRegistry()

    def work(label: str) -> str:
        """Do one piece of work with a side effect."""
        tally.add(f"try {label}")
        if cut is not None:
            cut.fire(label)
        tally.add(f"done {label}")
        return f"{label} ok"

    tools.register(work)
    return tools


def nested_levels(
    tally: Tally,
    cut: Cutter | None = None,
    *,
    inner_approve: Iterable[str] | None = None,
    **options: Any,
) -> dict[str, Agent]:
    """The three agents of the module by level: ``parent`` -> ``child`` (its ``outer``) -> ``grand`` (``inner``)."""
    grand = Agent(
        ByHistory("grand", tool_turn(tool_call("work", id="g", label="g")), tally, cut),
        work_registry(tally, cut),
        approve=set(inner_approve) if inner_approve is not None else None,
        max_concurrency=4,
    )
    child_tools = work_registry(tally, cut)
    child_tools.register(grand.as_tool("inner", "A helper's helper."))
    child_first = tool_turn(tool_call("work", id="c", label="c"), tool_call("inner", id="gc", input="deep"))
    child = Agent(ByHistory("child", child_first, tally, cut), child_tools, max_concurrency=4)
    tools = work_registry(tally, cut)
    tools.register(child.as_tool("outer", "A helper."))
    first = tool_turn(tool_call("work", id="a", label="a"), tool_call("outer", id="sub", input="help"))
    options.setdefault("max_steps", 6)
    parent = Agent(ByHistory("parent", first, tally, cut), tools, max_concurrency=4, **options)
    return {"parent": parent, "child": child, "grand": grand}


def nested_agent(
    tally: Tally,
    cut: Cutter | None = None,
    *,
    inner_approve: Iterable[str] | None = None,
    **options: Any,
) -> Agent:
    """The three-level agent of the module: parent -> ``outer`` (child) -> ``inner`` (grandchild)."""
    return nested_levels(tally, cut, inner_approve=inner_approve, **options)["parent"]


NESTED_FINAL = 'parent: "a ok", "child: \\"c ok\\", \\"grand: \\\\\\"g ok\\\\\\"\\""'
"""The parent's answer once every call at every level came back."""
NESTED_EFFECTS = {"a": 1, "c": 1, "g": 1}
"""Each side effect of a finished nested run made exactly once."""
NESTED_MODELS = {"parent": 2, "child": 2, "grand": 2}
"""Each model's calls in a finished nested run: its tool turn and its answer."""


def durable_in(target: str, wanted: Mapping[str, Iterable[str]]) -> Ready:
    """A check that, for each stored run id, the outcomes of the named calls are in it (read through a new store)."""

    def ready() -> bool:
        with open_store(target) as store:
            for run_id, calls in wanted.items():
                try:
                    snapshot = store.load(run_id)
                except KeyError:
                    return False
                if not set(calls) <= durable_calls(snapshot):
                    return False
        return True

    return ready


def drive(agent: Agent, driver: str, store: Any, run_id: str, text: str = "go") -> Any:
    """Run ``agent`` as ``run_id`` on ``driver`` to its end (or until something cuts it)."""
    if driver == "sync":
        return agent.run(text, store=store, run_id=run_id)
    return asyncio.run(agent.arun(text, store=store, run_id=run_id))


def cut_in_process(target: str, driver: str, tally_path: str, at: str, wanted: Mapping[str, list[str]]) -> None:
    """In a fresh process: run the nested agent as ``cut`` on ``driver`` until ``at`` kills the process."""
    tally = Tally(tally_path)
    store = open_store(target, lease=LEASE)
    drive(nested_agent(tally, Cutter(at, durable_in(target, wanted), how="kill")), driver, store, "cut")
    raise AssertionError("the run was never cut")


def in_child(function: Callable[..., None], *args: Any) -> int | None:
    """Run ``function(*args)`` in a new process (``support.store_cases.child_process``) and return its exit code."""
    process = child_process(function, *args)
    process.start()
    process.join(120)
    return process.exitcode


class Hang:
    """An async ``hang`` tool that waits, the first time, until its task is cancelled (a call in flight at a cut)."""

    def __init__(self, tally: Tally) -> None:
        self.tally = tally
        self.armed = True

    def register(self, tools: ToolRegistry) -> None:
        async def hang(label: str) -> str:
            """Wait for something slow, then make a side effect."""
            self.tally.add(f"try {label}")
            if self.armed:
                self.armed = False
                await asyncio.Event().wait()
            self.tally.add(f"done {label}")
            return f"{label} ok"

        tools.register(hang)


def batch_with_child_in_flight(tally: Tally, cut: Cutter | None = None, hang: Hang | None = None) -> Agent:
    """The parent asks ``work("a")``, the ``outer`` sub-agent and ``work("z")`` in one reply; the child asks
    ``work("c")`` and ``hang("h")`` in one reply.  Cut ``z`` while ``h`` hangs: a Ctrl-C beside a child in flight."""
    child_tools = work_registry(tally, cut)
    (hang or Hang(tally)).register(child_tools)
    child_first = tool_turn(tool_call("work", id="c", label="c"), tool_call("hang", id="h", label="h"))
    child = Agent(ByHistory("child", child_first, tally), child_tools, max_concurrency=4)
    tools = work_registry(tally, cut)
    tools.register(child.as_tool("outer", "A helper."))
    first = tool_turn(
        tool_call("work", id="a", label="a"),
        tool_call("outer", id="sub", input="help"),
        tool_call("work", id="z", label="z"),
    )
    return Agent(ByHistory("parent", first, tally), tools, max_concurrency=4, max_steps=6)


def started(tally: Tally, label: str) -> Ready:
    """A check that the call labelled ``label`` has started."""
    return lambda: tally.counts("try").get(label, 0) > 0


class McpBatch:
    """Asks, in one reply, for the MCP audit server's ``bump(a)`` and ``hang(h)``; then answers with the results."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("bump", id="b1", label="a"), tool_call("hang", id="h1", label="h"))
        return reply(" | ".join(m.content for m in messages if m.role == "tool"))


MCP_SERVER = Path(__file__).resolve().parent / "mcp_audit_server.py"


def mcp_tools(counts: str) -> Any:
    """The MCP audit server over stdio, counting its calls in ``counts``."""
    import sys

    from fsm_agent.mcp import stdio_tools

    return stdio_tools(sys.executable, [str(MCP_SERVER)], {"FSM_AGENT_TEST_COUNTS": counts})


def mcp_run_until_killed(target: str, driver: str, counts: str, every: str) -> None:
    """In a fresh process: run ``McpBatch`` as ``r`` with the audit server's tools; the test kills this process."""
    with mcp_tools(counts) as tools:
        store = open_store(target, lease=LEASE, every=every)
        drive(Agent(McpBatch(), tools, max_concurrency=2), driver, store, "r")
    raise AssertionError("the run was never killed")


def keys_named(counts: Path) -> tuple[dict[str, list[str]], set[str]]:
    """What the audit server's requests named in their ``_meta``: ``"<run> <call>"`` by label, and every start id."""
    by_label = json.loads(counts.with_name(f"{counts.stem}.keys.json").read_text())
    named = {label: [entry.rsplit(" ", 1)[0] for entry in entries] for label, entries in by_label.items()}
    return named, {entry.rsplit(" ", 1)[1] for entries in by_label.values() for entry in entries}
