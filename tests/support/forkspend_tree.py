"""``support.prepaid_cuts``'s tree with every reply priced and its usage its own: what a fork of it spent, read.

The parent asks ``helper`` once (call ``c1``), then answers ``done``; the
helper works through ``HELPER_SCRIPT`` (asking ``deep`` in step 2) and the
deep run through ``DEEP_SCRIPT``, one tool call per reply, then answer.
Each reply reports usage of its own (``usage_of``: by who made it and how
many calls were made for that input so far, every token part set), so a
reply counted short or twice shows; each agent has prices of its own
(``PRICES``), or, with ``unpriced``, the deep agent has none, so its calls'
cost is unknown.  The held ``wait`` calls, the cancel and the counts are
``support.prepaid_cuts``'s (``Counts`` of ``support.storeless_children``).
A run is driven here one transition at a time, its counters read after
each (``Seen``), so a fork is compared with its source where it was taken.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Sequence
from typing import Any

from fsm_agent import (
    Agent,
    AgentLoopError,
    AgentRun,
    CancelToken,
    Message,
    ModelResponse,
    Price,
    RunResult,
    ToolRegistry,
    Usage,
)
from fsm_agent.persist.recording_format import SPENT
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema
from support.cancelled_with_parent import Canceller  # reads only the counts' started, go and hold
from support.prepaid_cuts import DEEP_SCRIPT, EVERY_CALL, FIRST_CUT, HELPER_SCRIPT
from support.storeless_children import Counts, child_tools

PRICES = {"parent": Price(3, 15, 0.3), "helper": Price(1, 4, 0.1), "deep": Price(0.5, 2)}
"""Each level's prices, US dollars per million tokens: a cost counted at the wrong level or twice shows."""
_BASE = {"parent": 1000, "c1": 200, "deep c1": 30}
Seen = dict[int, dict[str, Any]]
"""A run's counters (its snapshot's) after each transition, by the transition's index in its trace."""


def usage_of(who: str, made: int) -> Usage:
    """The usage of ``who``'s ``made``-th model call: its own figures, every part set (no cost: the agent prices it)."""
    n = _BASE[who] + 7 * made
    return Usage(n, n // 2 + 1, n // 5, n // 10, n // 20 + 1)


class ParentModel:
    """Asks ``helper`` for ``c1``, then answers ``done``; its n-th reply in a run reports ``usage_of("parent", n)``."""

    def __init__(self, counts: Counts) -> None:
        self.counts = counts

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            self.counts.child["parent"] += 1
        replies = sum(1 for m in messages if m.role == "assistant")
        usage = usage_of("parent", replies + 1)  # the same reply of a fork as of its source: the same usage
        if replies == 0:
            return tool_turn(tool_call("helper", id="c1", input="c1"), usage=usage)
        return reply("done", usage=usage)


class Worker:
    """A sub-agent's model: the next call of ``script`` (by its tool messages), then ``found <input>``; each reply
    reports ``usage_of(input, calls made for that input so far)``."""

    def __init__(self, counts: Counts, script: Sequence[tuple[str, int]]) -> None:
        self.counts, self.script = counts, script

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        asked, made = self.counts.asked(messages)
        usage = usage_of(asked, made)
        done = sum(1 for m in messages if m.role == "tool")
        if done >= len(self.script):
            return reply(f"found {asked}", usage=usage)
        name, step = self.script[done]
        call_id = f"{asked}-{step}-{made}"  # unique to this run's reply: a fresh run's ids need not be the cut one's
        if name == "deep":
            return tool_turn(tool_call("deep", id=call_id, input=f"deep {asked}"), usage=usage)
        return tool_turn(tool_call(name, id=call_id, item=asked, step=step), usage=usage)


def parent_agent(counts: Counts, driver: str, *, unpriced: bool = False) -> Agent:
    """The parent, its ``helper`` and the helper's ``deep``, each priced (``PRICES``); ``unpriced``: deep is not."""
    deep_prices = {} if unpriced else {"prices": PRICES["deep"]}
    deep = Agent(Worker(counts, DEEP_SCRIPT), child_tools(counts, driver), **deep_prices)
    helper_tools = child_tools(counts, driver)
    helper_tools.register(deep.as_tool("deep", "Looks deeper."))
    helper = Agent(Worker(counts, HELPER_SCRIPT), helper_tools, prices=PRICES["helper"])
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts), tools, prices=PRICES["parent"])


def spent(counters: dict[str, Any]) -> dict[str, Any]:
    """What a run spent as its snapshot's ``counters`` say (``SPENT``), through JSON, its cost None if unknown."""
    read = {name: json.loads(json.dumps(counters[name])) for name in SPENT}
    return {**read, "cost": None if read["unpriced"] else read["cost"]}


def driven(
    agent: Agent, driver: str, start: Any, *, store: Any = None, cancel: CancelToken | None = None, **given: Any
) -> tuple[RunResult, Seen]:
    """The run ``start(agent)`` opens (``agent.start``/``resume``/``fork``, named by ``start`` with ``given``),
    driven one transition at a time to its end or stop: its result and its counters after each transition.

    ``start`` is the name of the method (its async twin is ``a`` + it); its
    first argument is ``given["source"]`` (the question, the snapshot, the
    fork's source).
    """
    seen: Seen = {}
    source = given.pop("source")

    def read(run: AgentRun) -> None:
        seen[len(run.trace) - 1] = run.snapshot()["counters"]

    async def arun() -> RunResult:
        run = await getattr(agent, f"a{start}")(source, store=store, cancel=cancel, **given)
        read(run)
        try:
            while not run.done:
                await run.aadvance()
                read(run)
        except AgentLoopError as stop:
            return stop.result
        return run.result

    if driver == "async":
        return asyncio.run(arun()), seen
    run = getattr(agent, start)(source, store=store, cancel=cancel, **given)
    read(run)
    try:
        while not run.done:
            run.advance()
            read(run)
    except AgentLoopError as stop:
        return stop.result, seen
    return run.result, seen


def cut(
    counts: Counts, driver: str, source: Any = None, store: Any = None, *, unpriced: bool = False
) -> tuple[RunResult, Seen]:
    """Run ``p`` (or resume ``source``) with ``store`` until a cancel cuts it while the held ``wait`` is in flight:
    its result, and its counters after each transition."""
    return cut_by_token(parent_agent(counts, driver, unpriced=unpriced), counts, driver, 1, source, store)


def cut_by_token(
    agent: Agent, counts: Any, driver: str, holds: int, source: Any = None, store: Any = None
) -> tuple[RunResult, Seen]:
    """``agent``'s run ``p`` started (or ``source`` resumed) with ``store``, cut by its token from another thread
    once ``holds`` held calls are in flight (``Canceller``): its result, and its counters after each transition."""
    token = CancelToken()
    with Canceller(counts, token, holds) as canceller:
        if source is None:
            result, seen = driven(agent, driver, "start", store=store, cancel=token, source="go", run_id="p")
        else:
            result, seen = driven(agent, driver, "resume", store=store, cancel=token, source=source)
    assert canceller.done.is_set(), "the cancel came while the held calls were in flight"
    assert result.reason == "cancelled"
    return result, seen


def stored_cut_then_finished(counts: Counts, driver: str, store: Any, *, unpriced: bool = False) -> Seen:
    """``p`` cut in the deep run's wait with ``store``, then resumed to its end: its counters after each transition
    of both legs (each tool call of the tree ran once)."""
    _, cut_seen = cut(counts, driver, store=store, unpriced=unpriced)
    assert counts.tools == FIRST_CUT
    counts.hold = False
    agent = parent_agent(counts, driver, unpriced=unpriced)
    result, seen = driven(agent, driver, "resume", store=store, source=json.loads(json.dumps(store.load("p"))))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL
    return {**cut_seen, **seen}


def storeless_then_stored_cut(counts: Counts, driver: str, store: Any) -> Seen:
    """``p`` cut without a store, resumed with ``store`` and cut again in the new helper's wait, then resumed to its
    end: its counters after each transition of all three legs (each tool call of the tree ran once)."""
    first, seen = cut(counts, driver)
    counts.arm()
    seen.update(cut(counts, driver, json.loads(json.dumps(first.snapshot)), store)[1])
    counts.hold = False
    agent = parent_agent(counts, driver)
    result, last = driven(agent, driver, "resume", store=store, source=json.loads(json.dumps(store.load("p"))))
    assert result.final == "done"
    assert counts.tools == EVERY_CALL
    return {**seen, **last}


def forked_from(counts: Counts, driver: str, recording: dict[str, Any], at: int) -> Seen:
    """``recording`` forked after transition ``at`` with no store, driven to its end: its counters after each
    transition; it ran no tool and asked no model but its parent's last reply."""
    tools, models = Counter(counts.tools), Counter(counts.child)
    result, seen = driven(parent_agent(counts, driver), driver, "fork", source=recording, at=at)
    assert result.final == "done"
    assert counts.tools == tools
    assert counts.child - models == Counter({"parent": 1})
    return seen
