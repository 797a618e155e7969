"""A ``max_tool_calls`` stop whose finalize call was cut or failed stands until new caps let its call run.

The finalize answers the calls the cap stopped "not executed", so none is
pending when the run is resumed or forked: the resume asks about the call the
stop names in its evidence (``stopped_call_capped``).  Before, the stop read
as lifted under the very caps it stopped on: the resumed run was offered tools
again and ended ``done``.  Under those caps the stop stands, and the resume
makes the cut finalize call again, without tools (``resumes_finalize``); a
failed one only with ``retry=True``.  Each test counts the tools' executions
and the model's calls, on both drivers and, where the run is stored, both
stores.
"""

from __future__ import annotations

import asyncio
import threading
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, ForkEdit, Message, ModelResponse, RunResult, ToolRegistry
from fsm_agent.errors import RunLeasedError, StaleRunError
from fsm_agent.persist import open_store
from fsm_agent.testing import edges, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]
NOT_RUN = '{"error": "not executed: the run stopped (max_tool_calls) before this call"}'


class Counted:
    """A model and a ``work`` tool that count every call; the finalize call (no tools offered) is cut or fails once.

    The first reply asks for work on a, b, c and d; offered tools again, the
    model asks for c and d once more, then answers.
    """

    def __init__(self, finalize: str) -> None:
        self.finalize = finalize  # "cancel" (the task is cancelled in it), "fail" (it raises), or "" (it answers)
        self.model: list[str] = []
        self.tools: Counter[str] = Counter()
        self.in_flight = asyncio.Event()

    def registry(self) -> ToolRegistry:
        tools = ToolRegistry()

        def work(label: str) -> str:
            """Work on one label."""
            self.tools[label] += 1
            return f"{label} ok"

        tools.register(work)
        return tools

    def _answer(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not any(message.role == "assistant" for message in messages):
            return tool_turn(*(tool_call("work", id=label, label=label) for label in "abcd"))
        if not tools:
            return reply("what I have")
        if not any(message.tool_call_id == "c2" for message in messages):
            return tool_turn(tool_call("work", id="c2", label="c"), tool_call("work", id="d2", label="d"))
        return reply("all done")

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        self.model.append("tools" if tools else "finalize")
        if not tools and self.finalize == "fail":
            self.finalize = ""
            raise ConnectionError("provider away")
        return self._answer(messages, tools)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if not tools and self.finalize == "cancel":
            self.finalize = ""
            self.model.append("finalize")
            self.in_flight.set()
            await asyncio.sleep(3600)  # cancelled here
        return self.complete(messages, tools)


def _agent(model: Counted, caps: int | Mapping[str, int]) -> Agent:
    return Agent(model, model.registry(), max_tool_calls=caps, on_stop={"max_tool_calls": "finalize"})


def _cut_in_the_finalize_call(model: Counted, store_target: str) -> None:
    """Run to the finalize call and cancel the task driving the run there: stored ``Failed``, ``max_tool_calls``."""

    async def go() -> None:
        with open_store(store_target) as store:
            task = asyncio.create_task(_agent(model, 2).arun("go", store=store, run_id="r"))
            await model.in_flight.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

    asyncio.run(go())
    assert (model.model, dict(model.tools)) == (["tools", "finalize"], {"a": 1, "b": 1})


def _finish(run: Any, driver: str) -> RunResult:
    try:
        return run.finish() if driver == "sync" else asyncio.run(run.afinish())
    except AgentLoopError as stop:
        return stop.result


def _resumed(agent: Agent, store_target: str, driver: str, **limits: Any) -> RunResult:
    with open_store(store_target) as store:
        if driver == "sync":
            return _finish(agent.resume(store.load("r"), store=store, **limits), driver)

        async def go() -> RunResult:
            run = await agent.aresume(await store.aload("r"), store=store, **limits)
            try:
                return await run.afinish()
            except AgentLoopError as stop:
                return stop.result

        return asyncio.run(go())


def _finalized_again(result: RunResult, model: Counted) -> None:
    """The stop stands, answered by the finalize call made once more, without tools; no call past the cap made."""
    assert (result.reason, result.evidence["finalize"], result.final) == (
        "max_tool_calls",
        {"outcome": "answered"},
        "what I have",
    )
    assert "Failed->AwaitModel[resumes_finalize]" in edges(result)
    assert (model.model, dict(model.tools)) == (["tools", "finalize", "finalize"], {"a": 1, "b": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_Failed_resumes_finalize_under_the_caps_its_finalize_call_was_cut_on(store_target: str, driver: str) -> None:
    """The stop stands: no tool is offered, the cut finalize call is made once more, and its answer ends the run."""
    model = Counted("cancel")
    _cut_in_the_finalize_call(model, store_target)
    with open_store(store_target) as store:
        before = store.load("r")
    assert (before["state"], before["reason"], before["evidence"]["finalize"]["outcome"]) == (
        "Failed",
        "max_tool_calls",
        "cancelled",
    )
    result = _resumed(_agent(model, 2), store_target, driver)
    _finalized_again(result, model)
    with open_store(store_target) as store:
        after = store.load("r")
    assert (after["state"], after["reason"]) == ("Done", "max_tool_calls")


@pytest.mark.parametrize("driver", DRIVERS)
def test_Failed_resumes_before_model_with_tools_once_a_higher_cap_lets_the_stopped_call_run(
    store_target: str, driver: str
) -> None:
    model = Counted("cancel")
    _cut_in_the_finalize_call(model, store_target)
    result = _resumed(_agent(model, 2), store_target, driver, max_tool_calls=4)
    assert (result.reason, result.final) == ("done", "all done")
    assert "Failed->AwaitModel[resumes_before_model]" in edges(result)
    assert model.model == ["tools", "finalize", "tools", "tools"]  # tools offered again once the stop is lifted
    assert dict(model.tools) == {"a": 1, "b": 1, "c": 1, "d": 1}
    answers = [(m.tool_call_id, m.content) for m in result.messages if m.role == "tool"]
    assert answers == [
        ("a", '"a ok"'),
        ("b", '"b ok"'),
        ("c", NOT_RUN),
        ("d", NOT_RUN),
        ("c2", '"c ok"'),
        ("d2", '"d ok"'),
    ]


def _failed_finalize(driver: str, caps: Mapping[str, int]) -> tuple[Counted, RunResult]:
    """No store: the finalize call raises (its outcome ``model_error``); the run stops ``max_tool_calls``."""
    model = Counted("fail")
    agent = _agent(model, caps)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("go") if driver == "sync" else asyncio.run(agent.arun("go"))
    assert (stop.value.reason, stop.value.evidence["finalize"]["outcome"]) == ("max_tool_calls", "model_error")
    assert stop.value.evidence["tool"] == "work"
    return model, stop.value.result


@pytest.mark.parametrize("driver", DRIVERS)
def test_Failed_resume_refused_while_the_stopped_tool_is_still_at_its_own_cap(driver: str) -> None:
    """The run's cap on all calls raised does not lift a stop on ``work``'s own cap, nor retry its failed finalize."""
    model, stopped = _failed_finalize(driver, {"work": 2})
    agent = _agent(model, {"work": 2})
    for caps in ({"work": 2}, {"work": 2, "*": 9}):
        with pytest.raises(ValueError, match="'max_tool_calls', which these limits do not lift"):
            agent.resume(stopped, max_tool_calls=caps)
    assert (model.model, dict(model.tools)) == (["tools", "finalize"], {"a": 1, "b": 1})


@pytest.mark.parametrize("driver", DRIVERS)
def test_Failed_resumes_finalize_with_retry_while_the_stopped_tool_is_still_at_its_own_cap(driver: str) -> None:
    """``retry=True`` makes the failed finalize call again, without tools: the stop on ``work``'s cap stands."""
    model, stopped = _failed_finalize(driver, {"work": 2})
    agent = _agent(model, {"work": 2})
    caps = {"work": 2, "*": 9}
    run = (
        agent.resume(stopped, retry=True, max_tool_calls=caps)
        if driver == "sync"
        else asyncio.run(agent.aresume(stopped, retry=True, max_tool_calls=caps))
    )
    result = _finish(run, driver)
    _finalized_again(result, model)


@pytest.mark.parametrize("driver", DRIVERS)
def test_Failed_resumes_before_model_once_the_stopped_tools_own_cap_is_raised(driver: str) -> None:
    model, stopped = _failed_finalize(driver, {"work": 2})
    agent = _agent(model, {"work": 2})
    caps = {"work": 4}
    run = (
        agent.resume(stopped, max_tool_calls=caps)
        if driver == "sync"
        else asyncio.run(agent.aresume(stopped, max_tool_calls=caps))
    )
    result = _finish(run, driver)
    assert (result.reason, result.final) == ("done", "all done")
    assert "Failed->AwaitModel[resumes_before_model]" in edges(result)
    assert model.model == ["tools", "finalize", "tools", "tools"]
    assert dict(model.tools) == {"a": 1, "b": 1, "c": 1, "d": 1}


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_fork_at_the_stop_goes_on_only_when_its_edit_raises_the_cap(store_target: str, driver: str) -> None:
    """As a resume: the same caps make the cut finalize call again; ``ForkEdit(limits=...)`` lifts the stop.

    Nothing runs twice: a fork's calls are the source's up to the fork.
    """
    source = Counted("cancel")
    _cut_in_the_finalize_call(source, store_target)
    with open_store(store_target) as store:
        at = len(store.load("r")["trace"]) - 1
        same = Counted("")
        finalized = _finish(_agent(same, 2).fork("r", at, store=store, run_id="same"), driver)
        raised = Counted("")
        run = _agent(raised, 2).fork("r", at, store=store, run_id="raised", edit=ForkEdit(limits={"max_tool_calls": 4}))
        result = _finish(run, driver)
    assert (same.model, dict(same.tools)) == (["finalize"], {})
    assert (finalized.reason, finalized.evidence["finalize"]) == ("max_tool_calls", {"outcome": "answered"})
    assert (result.reason, result.final) == ("done", "all done")
    assert (raised.model, dict(raised.tools)) == (["tools", "tools"], {"c": 1, "d": 1})  # a and b: the source's
    assert (source.model, dict(source.tools)) == (["tools", "finalize"], {"a": 1, "b": 1})


@pytest.mark.parametrize("drivers", [("sync", "sync"), ("sync", "async"), ("async", "async")])
def test_two_owners_resuming_the_cut_finalize_at_once_make_it_once(store_target: str, drivers: tuple[str, str]) -> None:
    """Both read the stored run, then claim it at the same moment: one makes the finalize call, the other is refused."""
    model = Counted("cancel")
    _cut_in_the_finalize_call(model, store_target)
    start = threading.Barrier(2)
    outcomes: list[object] = [None, None]

    def owner(i: int, driver: str) -> None:
        with open_store(store_target) as store:
            try:
                if driver == "sync":
                    data = store.load("r")
                    start.wait()
                    outcomes[i] = _finish(_agent(model, 2).resume(data, store=store), driver)
                    return

                async def go() -> RunResult:
                    data = await store.aload("r")
                    start.wait()
                    return await (await _agent(model, 2).aresume(data, store=store)).afinish()

                outcomes[i] = asyncio.run(go())
            except (RunLeasedError, StaleRunError) as refused:
                outcomes[i] = refused

    threads = [threading.Thread(target=owner, args=(i, driver)) for i, driver in enumerate(drivers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    finished = [o for o in outcomes if isinstance(o, RunResult)]
    assert len(finished) == 1, outcomes
    assert isinstance(next(o for o in outcomes if o is not finished[0]), RunLeasedError)  # StaleRunError is one
    _finalized_again(finished[0], model)
