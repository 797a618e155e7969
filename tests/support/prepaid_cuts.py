"""A parent, its ``helper`` sub-agent and the helper's ``deep`` sub-agent, cut twice by a cancel, with and without a
store in between: what a cut counted is handed down (``prepaid``), and must count once however it is taken back.

The parent asks ``helper`` once (call ``c1``, input ``c1``), then answers
``done``.  The helper works through ``HELPER_SCRIPT`` and the deep run
through ``DEEP_SCRIPT``, one tool call per reply (``support.storeless_grandchildren.Worker``),
then answer.  Two ``wait`` calls hold while a cut is made: the deep run's
step 2 (the first cut) and the helper's step 3 (the second one, after
``Counts.arm``); each holds the first time it runs, while ``Counts.hold`` is
set, signalling ``started`` and waiting for ``go`` (``support.storeless_children.child_tools``).
The cancel comes from another thread (``support.cancelled_with_parent.Canceller``)
once the held call is in flight; the token lets the call finish.  Counted:
every model call by who made it (``parent``, ``c1``, ``deep c1``) and each
tool execution by ``(item, step)``, which names the same call across every
run made for it.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, ToolRegistry
from support.cancelled_with_parent import Canceller
from support.polling import held_within
from support.storeless_children import WAIT, Counts, child_tools
from support.storeless_grandchildren import ParentModel, Worker

HELPER_SCRIPT = (("work", 1), ("deep", 2), ("wait", 3), ("work", 4))
"""The helper's tool calls in order, as (tool, step): step 2 asks ``deep``; the second cut lands in step 3."""
DEEP_SCRIPT = (("work", 1), ("wait", 2), ("work", 3))
"""The deep run's tool calls in order, as (tool, step): the first cut lands in step 2."""
FIRST_CUT = Counter({("c1", 1): 1, ("deep c1", 1): 1, ("deep c1", 2): 1})
"""What ran before the first cut: the helper's step 1, the deep run's steps 1 and 2 (the held wait came back)."""
EVERY_CALL = Counter(
    {
        **{("c1", step): 1 for tool, step in HELPER_SCRIPT if tool != "deep"},
        **{("deep c1", s): 1 for _, s in DEEP_SCRIPT},
    }
)
"""Every plain tool call of the tree, each once."""
WHOLE = 1 + len(HELPER_SCRIPT) + len(DEEP_SCRIPT)
"""The parent's tool calls with each call of the tree made once: the helper call, the helper's, the deep run's."""


ASKS_WAIT_FIRST = (("work", 1), ("wait", 3), ("deep", 2), ("work", 4))
"""The helper's calls as a model may ask them when asked again: ``wait`` before ``deep`` (the same calls)."""


def parent_agent(
    counts: Counts, driver: str, helper_script: tuple[tuple[str, int], ...] = HELPER_SCRIPT, **settings: Any
) -> Agent:
    """The parent (built with ``settings``), its ``helper`` sub-agent (asking ``helper_script``) and its ``deep``."""
    deep = Agent(Worker(counts, DEEP_SCRIPT), child_tools(counts, driver))
    helper_tools = child_tools(counts, driver)
    helper_tools.register(deep.as_tool("deep", "Looks deeper."))
    helper = Agent(Worker(counts, helper_script), helper_tools)
    tools = ToolRegistry()
    tools.register(helper.as_tool("helper", "Looks things up."))
    return Agent(ParentModel(counts, ("c1",), False), tools, **settings)


def _driven(agent: Agent, driver: str, source: Any, store: Any, token: CancelToken, **given: Any) -> RunResult:
    """Run ``p`` (started, or ``source`` resumed with ``given``) driven to its end or stop, under ``token``."""

    async def arun() -> RunResult:
        run = await (
            agent.astart("go", cancel=token, store=store, run_id="p")
            if source is None
            else agent.aresume(source, cancel=token, store=store, **given)
        )
        try:
            return await run.afinish()
        except AgentLoopError as stop:
            return stop.result

    if driver == "async":
        return asyncio.run(arun())
    if source is None:
        run = agent.start("go", cancel=token, store=store, run_id="p")
    else:
        run = agent.resume(source, cancel=token, store=store, **given)
    try:
        return run.finish()
    except AgentLoopError as stop:
        return stop.result


def cut(counts: Counts, driver: str, source: Any = None, store: Any = None, script: Any = HELPER_SCRIPT) -> RunResult:
    """Run ``p`` (or resume ``source``) with ``store`` until a cancel cuts it while the held ``wait`` is in flight.

    ``script``: the helper's calls (``parent_agent``).
    """
    agent, token = parent_agent(counts, driver, script), CancelToken()
    with Canceller(counts, token, 1) as canceller:
        result = _driven(agent, driver, source, store, token)
    assert canceller.done.is_set(), "the cancel came while the held wait was in flight"
    assert result.reason == "cancelled"
    return result


def finish(
    counts: Counts, driver: str, source: Any, store: Any = None, script: Any = HELPER_SCRIPT, **given: Any
) -> RunResult:
    """``source`` resumed with a fresh token, ``store`` and ``given`` (``Agent.resume``'s), driven to its end or stop.

    ``script``: the helper's calls (``parent_agent``).
    """
    return _driven(parent_agent(counts, driver, script), driver, source, store, CancelToken(), **given)


def deadline_cut(counts: Counts, driver: str, source: Any, store: Any, deadline: float) -> RunResult:
    """``source`` resumed with ``store`` under ``deadline`` seconds, which pass while the held ``wait`` is in flight.

    The held call is let go once the parent has stopped (the sync driver's
    child goes on on its thread, to its own equal deadline; the async
    driver's is cancelled with the parent's task); the child's stored run
    is waited for until it has ended.
    """
    agent = parent_agent(counts, driver)

    async def arun() -> RunResult:
        run = await agent.aresume(source, store=store, timeout=deadline)
        try:
            await run.afinish()
        except AgentLoopError as stop:
            return stop.result
        finally:
            counts.go.set()  # before the loop closes: it waits for the held call's thread
        raise AssertionError("the deadline did not cut the run")

    try:
        if driver == "async":
            result = asyncio.run(arun())
        else:
            try:
                agent.resume(source, store=store, timeout=deadline).finish()
            except AgentLoopError as stop:
                result = stop.result
            else:
                raise AssertionError("the deadline did not cut the run")
    finally:
        counts.go.set()
        counts.hold = False
    ended = held_within(lambda: store.load("p/c1")["state"] in ("Done", "Failed"), WAIT)
    assert ended, "the cut child's run ended"
    return result
