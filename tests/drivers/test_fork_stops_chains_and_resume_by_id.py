"""Forks at stops, down chains and into a cut sub-agent; and a resume given a stored run's id instead of its snapshot.

Every tool counts its executions by call id (``support.counted_calls``, and
the sub-agent's ``lookup`` here), so "nothing was made again" is counted.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.by_turn import ByTurn
from support.counted_calls import Counted, finish

from fsm_agent import (
    Agent,
    AgentLoopError,
    CancelToken,
    ForkEdit,
    ForkError,
    Message,
    ModelResponse,
    RunResult,
    SnapshotError,
    ToolRegistry,
)
from fsm_agent.errors import ContextOverflowError
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, edges, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

ONE_SEND = [tool_turn(tool_call("send", id="s1", to="bob")), reply("done")]


def stopped_by(agent: Agent) -> RunResult:
    with pytest.raises(AgentLoopError) as stopped:
        agent.run("go")
    return stopped.value.result


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_at_a_context_overflow_asks_its_own_model_again(driver: str) -> None:
    """The source's second model call overflowed; the fork at that stop asks its model, and makes no call again."""
    counted = Counted()
    overflowing = FakeModel(tool_turn(tool_call("send", id="s1", to="bob")), ContextOverflowError("too long"))
    source = stopped_by(Agent(overflowing, counted.registry))
    assert (source.reason, dict(counted.ran)) == ("context_overflow", {"s1": 1})
    last = len(source.trace) - 1
    again = Counted()
    better = Agent(FakeModel(reply("sent")), again.registry)
    run = better.fork(source, last) if driver == "sync" else asyncio.run(better.afork(source, last))
    result = finish(run, driver)
    assert (result.reason, result.final, dict(again.ran)) == ("done", "sent", {})
    assert result.trace[last + 1].trigger == "resume"


def test_a_fork_at_a_cancelled_stop_goes_on_with_a_token_nobody_cancelled_making_nothing_again() -> None:
    """A cancel comes from no recorded reply: the rebuild meets it at the same transition, and the fork, its own
    token uncancelled, goes on from the stop; the call made before the cancel is not made again."""
    token = CancelToken()
    counted = Counted()
    registry = ToolRegistry()

    @registry.register
    def send(to: str, call_id: str) -> str:
        """Send a message, and cancel the run meanwhile."""
        counted.ran[call_id] += 1
        token.cancel()
        return f"sent to {to}"

    source = Agent(ByTurn(ONE_SEND), registry, on_stop={"cancelled": "return"}).run("go", cancel=token)
    assert (source.reason, dict(counted.ran)) == ("cancelled", {"s1": 1})
    stop = len(source.trace) - 1
    assert edges(source)[stop] == "ExecuteTool->Failed[cancelled]"
    counted.ran.clear()
    model = ByTurn(ONE_SEND)
    result = Agent(model, registry).fork(source, stop).finish()
    assert (result.final, dict(counted.ran), model.calls) == ("done", {}, 1)
    assert result.trace[: stop + 1] == source.trace
    assert edges(result)[stop + 1] == "Failed->AwaitModel[resumes_before_model]"


def test_a_fork_at_a_stop_no_limit_lifts_names_the_stops_a_fork_goes_on_from() -> None:
    """At a max_tokens stop the fork cannot go on: the error speaks of ForkEdit's limits, not of resume's retry."""
    cut = ModelResponse(Message("assistant", "half an ans"), stop_reason="max_tokens")
    source = Agent(FakeModel(cut), ToolRegistry(), on_stop={"max_tokens": "return"}).run("go")
    assert source.reason == "max_tokens"
    with pytest.raises(ForkError, match="do not lift") as refused:
        Agent(FakeModel(reply("whole")), ToolRegistry()).fork(source, len(source.trace) - 1)
    said = str(refused.value)
    assert "a fork taken at a stop goes on from" in said
    assert "ForkEdit(limits=...)" in said
    assert "retry=True" not in said


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_of_a_paused_fork_with_rerun_all_makes_the_inherited_call_once(store_target: str, driver: str) -> None:
    """rerun="all" makes every call again, the outcomes the source still carried too: the send is made, once."""
    with open_store(store_target) as store:
        Agent(ByTurn(ONE_SEND), Counted().registry).run("go", store=store, run_id="src")
        careful = Agent(ByTurn(ONE_SEND), Counted().registry, approve={"send"})
        held = finish(careful.fork("src", 0, store=store, run_id="f1"), "sync")
        assert [c.id for c in held.pending] == ["s1"]
        counted = Counted()
        again = Agent(ByTurn(ONE_SEND), counted.registry, approve={"send"})
        keywords: dict[str, Any] = {
            "store": store,
            "run_id": "f2",
            "rerun": "all",
            "edit": ForkEdit(approvals={"s1": True}),
        }
        at = len(held.trace) - 1
        run = again.fork("f1", at, **keywords) if driver == "sync" else asyncio.run(again.afork("f1", at, **keywords))
        result = finish(run, driver)
        assert (result.final, dict(counted.ran)) == ("done", {"s1": 1})
        assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == [None]


def test_a_fork_s_recording_keeps_what_it_still_carries(store_target: str) -> None:
    """A paused fork's export holds the outcome it carries; a recording whose carried list is malformed is refused."""
    from fsm_agent.persist.recording import RecordingError, read_recording

    with open_store(store_target) as store:
        Agent(ByTurn(ONE_SEND), Counted().registry).run("go", store=store, run_id="src")
        careful = Agent(ByTurn(ONE_SEND), Counted().registry, approve={"send"})
        finish(careful.fork("src", 0, store=store, run_id="f1"), "sync")
        recording = store.export("f1")
    [(name, arguments, outcome)] = recording["carried"]
    assert (name, arguments, outcome["content"], outcome["reused_from"]) == (
        "send",
        '{"to":"bob"}',
        '"sent to bob"',
        "src/s1",
    )
    assert recording["carried_down"] == []
    read_recording(recording)
    with pytest.raises(RecordingError, match=r"carried\[0\]"):
        read_recording({**recording, "carried": [["send", 5, outcome]]})


class Died(BaseException):
    """The process running the source died here."""


def researcher(made: Counter[str], *, dying: bool) -> Agent:
    """A parent asking the ``research`` sub-agent once; the sub-agent makes ``lookup``, then dies while ``dying``."""

    class Child:
        def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: Any = None) -> ModelResponse:
            if not any(m.role == "assistant" for m in messages):
                return tool_turn(tool_call("lookup", id="l1", q="who"))
            if dying:
                raise Died
            return reply("ada")

    child_tools = ToolRegistry()

    @child_tools.register
    def lookup(q: str, call_id: str) -> str:
        """Look a question up."""
        made[call_id] += 1
        return "ada"

    tools = ToolRegistry()
    tools.register(Agent(Child(), child_tools).as_tool("research", "Research a question."))
    parent = ByTurn([tool_turn(tool_call("research", id="r1", input="who?")), reply("done")])
    return Agent(parent, tools)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_of_a_source_cut_in_its_sub_agent_takes_the_sub_agent_s_completed_call_at_every_index(
    store_target: str, driver: str
) -> None:
    """Cut while its sub-agent ran: a fork at each transition, the call in flight included, looks nothing up again."""
    with open_store(store_target) as store:
        made: Counter[str] = Counter()
        with pytest.raises(Died):
            researcher(made, dying=True).run("go", store=store, run_id="src")
        assert dict(made) == {"l1": 1}
        assert "r1" in store.export("src")["children"]  # the sub-agent's run, found by its link
        for at in range(len(store.load("src")["trace"])):
            agent = researcher(made, dying=False)
            keywords: dict[str, Any] = {"store": store, "run_id": f"f{at}"}
            run = (
                agent.fork("src", at, **keywords)
                if driver == "sync"
                else asyncio.run(agent.afork("src", at, **keywords))
            )
            result = finish(run, driver)
            assert result.final == "done", at
            assert dict(made) == {"l1": 1}, at
            child = store.load(f"f{at}/r1")
            assert [s["reused_from"] for s in child["steps"] if s["kind"] == "tool_call"] == ["src/r1/l1"], at


def resumed(agent: Agent, driver: str, source: Any, **keywords: Any) -> Any:
    return agent.resume(source, **keywords) if driver == "sync" else asyncio.run(agent.aresume(source, **keywords))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_resume_given_a_stored_run_s_id_says_to_pass_its_snapshot(store_target: str, driver: str) -> None:
    """A run id is no snapshot: the error shows store.load(run_id); nothing is written, nothing called."""
    with open_store(store_target) as store:
        counted = Counted()
        careful = Agent(ByTurn(ONE_SEND), counted.registry, approve={"send"})
        held = careful.run("go", store=store, run_id="trip-1")
        assert held.reason == "paused"
        before = store.load("trip-1")
        with pytest.raises(SnapshotError, match=r"agent\.resume\(store\.load\('trip-1'\), store=store\)"):
            resumed(careful, driver, "trip-1", store=store, approvals={"s1": True})
        assert store.load("trip-1") == before
        assert dict(counted.ran) == {}
        result = finish(resumed(careful, driver, store.load("trip-1"), store=store, approvals={"s1": True}), driver)
        assert (result.final, dict(counted.ran)) == ("done", {"s1": 1})


def test_resume_given_a_snapshot_cut_short_still_says_where_its_json_breaks() -> None:
    """A text that starts like a snapshot keeps the JSON error; an empty text is named as such."""
    agent = Agent(ByTurn(ONE_SEND), Counted().registry)
    with pytest.raises(SnapshotError, match="snapshot is not valid JSON"):
        agent.resume('{"format": "fsm_agent.Snaps')
    with pytest.raises(SnapshotError, match="not a blank text"):
        agent.resume("  ")
