"""Forking a run at any transition: the history is the source's, and no call the source completed is made again.

The source run has a parallel batch (two ``add`` calls in one reply), a
call that waits for a person's approval (``charge``) and a sub-agent call
(``research``, whose own tool is ``lookup``).  Every tool and both models
count their calls, so "nothing was made again" is counted, not assumed.
The models answer by the conversation they are sent (as a model at
temperature 0 would), so a fork that goes on asks them again.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Sequence
from typing import Any

import pytest

from fsm_agent import (
    Agent,
    AgentLoopError,
    AgentRun,
    ForkEdit,
    ForkError,
    Message,
    ModelResponse,
    RunExistsError,
    RunResult,
    ToolRegistry,
)
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema


class Counts:
    """How often each tool and each model was called."""

    def __init__(self) -> None:
        self.tools: dict[str, int] = {"add": 0, "charge": 0, "lookup": 0}
        self.model = 0
        self.child_model = 0
        self.lock = threading.Lock()

    def tool(self, name: str) -> None:
        with self.lock:
            self.tools[name] += 1

    @property
    def made(self) -> int:
        """Every side effect: tool calls anywhere, the sub-agent's model calls."""
        return sum(self.tools.values()) + self.child_model


class ByTurn:
    """A model that answers the n-th reply of ``script`` when sent n assistant messages: same history, same answer."""

    def __init__(self, script: Sequence[ModelResponse], counts: Counts, attribute: str) -> None:
        self.script, self.counts, self.attribute = script, counts, attribute
        self.sent: list[list[Message]] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.counts.lock:
            setattr(self.counts, self.attribute, getattr(self.counts, self.attribute) + 1)
        self.sent.append(list(messages))
        return self.script[sum(1 for m in messages if m.role == "assistant")]


SCRIPT = [
    tool_turn(tool_call("add", id="a1", a=1, b=2), tool_call("add", id="a2", a=3, b=4)),
    tool_turn(tool_call("charge", id="c1", amount=5)),
    tool_turn(tool_call("research", id="r1", input="who?")),
    reply("done"),
]
CHILD_SCRIPT = [tool_turn(tool_call("lookup", id="l1", q="who?")), reply("found")]


def make_agent(counts: Counts, **options: Any) -> tuple[Agent, ByTurn]:
    """The source's agent: ``add``, ``charge`` (approved by a person) and the ``research`` sub-agent."""
    child_registry = ToolRegistry()

    def lookup(q: str) -> str:
        """Look a question up."""
        counts.tool("lookup")
        return f"{q} -> ada"

    child_registry.register(lookup)
    child = Agent(ByTurn(CHILD_SCRIPT, counts, "child_model"), child_registry)
    registry = ToolRegistry()

    def add(a: float, b: float) -> float:
        """Add two numbers."""
        counts.tool("add")
        return a + b

    def charge(amount: float) -> str:
        """Charge the card."""
        counts.tool("charge")
        return f"charged {amount}"

    registry.register(add)
    registry.register(charge)
    registry.register(child.as_tool("research", "Research a question."))
    model = ByTurn(SCRIPT, counts, "model")
    return Agent(model, registry, approve={"charge"}, max_concurrency=4, **options), model


def finished(agent: Agent, run: AgentRun, store: Any) -> RunResult:
    """Drive a run to the end on the sync driver, approving each call it pauses on."""
    result = run.finish()
    while result.reason == "paused":
        result = agent.resume(result, approvals={c.id: True for c in result.pending}, store=store).finish()
    return result


async def afinished(agent: Agent, run: AgentRun, store: Any) -> RunResult:
    """``finished`` on the async driver."""
    result = await run.afinish()
    while result.reason == "paused":
        again = await agent.aresume(result, approvals={c.id: True for c in result.pending}, store=store)
        result = await again.afinish()
    return result


def source_run(store: Any, driver: str) -> RunResult:
    """The source, stored as ``src``: paused at ``charge``, approved, finished."""
    agent, _ = make_agent(Counts())
    if driver == "sync":
        return finished(agent, agent.start("go", store=store, run_id="src"), store)
    return asyncio.run(afinished(agent, agent.start("go", store=store, run_id="src"), store))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_fork_at_every_transition_makes_no_call_the_source_completed(store_target: str, driver: str) -> None:
    """Forked after each transition and driven to the end, no tool or sub-agent runs again; the model goes on."""
    with open_store(store_target) as store:
        source = source_run(store, driver)
        assert source.reason == "done"
        made_after = 0
        for at, entry in enumerate(source.trace):
            if entry.dest == "Done":
                continue
            counts = Counts()
            agent, _ = make_agent(counts)
            if driver == "sync":
                result = finished(agent, agent.fork("src", at, store=store, run_id=f"f{at}"), store)
            else:

                async def go(agent: Agent = agent, at: int = at) -> RunResult:
                    return await afinished(agent, await agent.afork("src", at, store=store, run_id=f"f{at}"), store)

                result = asyncio.run(go())
            assert result.reason == "done", at
            assert counts.made == 0, (at, counts.tools, counts.child_model)
            assert list(result.trace) == list(source.trace), at
            assert [m.content for m in result.messages] == [m.content for m in source.messages], at
            reused = [s.reused_from for s in result.steps if s.kind == "tool_call"]
            made_after += sum(1 for r in reused if r is not None)
            assert all(r is None or r.startswith("src/") for r in reused), reused
            assert store.load(f"f{at}")["forked_from"] == ["src", at]
        assert made_after > 0  # the recorded results were taken, by the forks that came before the calls


def test_rerun_makes_the_named_calls_again_and_all_of_them_with_all(tmp_path: Any) -> None:
    """``rerun={id}`` makes that one call again (counted once); ``rerun="all"`` every call after the fork point."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source_run(store, "sync")
        counts = Counts()
        agent, _ = make_agent(counts)
        result = finished(agent, agent.fork("src", 0, store=store, rerun={"a2"}), store)
        assert counts.tools == {"add": 1, "charge": 0, "lookup": 0}
        assert [s.reused_from for s in result.steps if s.kind == "tool_call"] == ["src/a1", None, "src/c1", "src/r1"]
        counts = Counts()
        agent, _ = make_agent(counts)
        finished(agent, agent.fork("src", 0, store=store, rerun="all"), store)
        assert counts.tools == {"add": 2, "charge": 1, "lookup": 1}
        assert counts.child_model == 2


def test_a_fork_of_a_fork_makes_no_call_either_branch_completed(tmp_path: Any) -> None:
    """A fork's own fork takes the recorded results through both: nothing is made again, the chain is named."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source_run(store, "sync")
        counts = Counts()
        agent, _ = make_agent(counts)
        first = finished(agent, agent.fork("src", 2, store=store, run_id="f1"), store)
        second = finished(agent, agent.fork("f1", 4, store=store, run_id="f2"), store)
        assert counts.made == 0
        assert first.trace == second.trace
        reused = [s.reused_from for s in second.steps if s.kind == "tool_call"]
        assert reused == ["src/a1", "f1/a2", "f1/c1", "f1/r1"]  # a1 was src's result in f1 already
        assert store.load("f2")["forked_from"] == ["f1", 4]
        listed = {run.run_id for run in store.list_runs()}
        assert {"src", "f1", "f2"} <= listed


def test_an_edited_result_is_what_the_fork_goes_on_from(tmp_path: Any) -> None:
    """``ForkEdit(results=...)`` changes a result in the history: the model is sent the new text."""
    counts = Counts()
    agent, model = make_agent(counts)
    source = finished(agent, agent.start("go"), None)
    counts.__init__()  # type: ignore[misc]
    model.sent.clear()
    result = finished(agent, agent.fork(source, 4, edit=ForkEdit(results={"a1": "13"})), None)
    assert counts.made == 0
    assert [m.content for m in model.sent[0] if m.role == "tool"] == ["13", "7"]
    assert [m.content for m in result.messages if m.tool_call_id == "a1"] == ["13"]


def test_an_edited_message_and_limits_are_the_forks(tmp_path: Any) -> None:
    """``ForkEdit(messages=..., limits=...)``: the question is changed, and the fork stops under its new limit."""
    counts = Counts()
    agent, model = make_agent(counts)
    source = finished(agent, agent.start("go"), None)
    counts.__init__()  # type: ignore[misc]
    model.sent.clear()
    edit = ForkEdit(messages={0: "go, but cheaply"}, limits={"max_steps": 2})
    with pytest.raises(AgentLoopError) as stopped:
        finished(agent, agent.fork(source, 2, edit=edit), None)
    assert stopped.value.reason == "max_steps"
    assert model.sent[0][0].content == "go, but cheaply"
    assert counts.made == 0


def test_a_fork_at_a_stop_goes_on_when_its_edit_lifts_the_stop(tmp_path: Any) -> None:
    """A source stopped on max_steps forks at its stop: with a higher limit the fork takes the resume edge and ends."""
    counts = Counts()
    agent, _ = make_agent(counts, max_steps=2, on_stop={"max_steps": "return"})
    source = finished(agent, agent.start("go"), None)
    assert source.reason == "max_steps"
    last = len(source.trace) - 1
    with pytest.raises(ForkError, match="do not lift"):
        agent.fork(source, last)
    before = counts.made
    result = finished(agent, agent.fork(source, last, edit=ForkEdit(limits={"max_steps": 8})), None)
    assert result.reason == "done"
    assert result.trace[last + 1].trigger == "resume"
    assert counts.made == before + 3  # the research call (the sub-agent's 2 model calls, its lookup): never made


def test_a_fork_paused_for_approval_takes_the_decision_its_edit_gives(tmp_path: Any) -> None:
    """Forked at the pause, a rejection in the edit rejects the call; an approval takes the recorded result."""
    counts = Counts()
    agent, _ = make_agent(counts)
    source = finished(agent, agent.start("go"), None)
    paused_at = [i for i, t in enumerate(source.trace) if (t.source, t.dest) == ("Dispatch", "ExecuteTool")][2]
    counts.__init__()  # type: ignore[misc]
    assert agent.fork(source, paused_at).paused  # at charge, which waits for a person
    rejected = agent.fork(source, paused_at, edit=ForkEdit(approvals={"c1": "too much"})).finish()
    assert "too much" in next(m.content for m in rejected.messages if m.tool_call_id == "c1")
    approved = agent.fork(source, paused_at, edit=ForkEdit(approvals={"c1": True})).finish()
    assert next(s for s in approved.steps if "charge" in s.detail).reused_from == "c1"
    assert counts.tools["charge"] == 0


def test_a_finished_result_without_a_snapshot_forks_from_its_messages(tmp_path: Any) -> None:
    """A ``RunResult`` of a run that ended in Done keeps no snapshot: its messages are enough to fork it."""
    counts = Counts()
    agent, _ = make_agent(counts)
    source = finished(agent, agent.start("go"), None)
    assert source.snapshot is None
    counts.__init__()  # type: ignore[misc]
    run = agent.fork(source, 3)
    result = finished(agent, run, None)
    assert run.forked_from == (None, 3)
    assert counts.made == 0
    assert result.trace == source.trace


@pytest.mark.parametrize(
    ("at", "keywords", "error", "match"),
    [
        (99, {}, ForkError, "is not a transition of the source"),
        (-1, {}, ForkError, "is not a transition of the source"),
        ("3", {}, TypeError, "at must be the index"),
        (None, {}, TypeError, "at must be the index"),
        (0, {"rerun": {"nope"}}, ForkError, "never completed: nope"),
        (5, {"rerun": {"a1"}}, ForkError, "completed before the fork point"),
        (0, {"rerun": "a1"}, TypeError, "collection of call ids"),
        (0, {"edit": ForkEdit(messages={40: "x"})}, ForkError, "not the index of a message"),
        (0, {"edit": ForkEdit(results={"zz": "x"})}, ForkError, "no result of call 'zz'"),
        (0, {"edit": ForkEdit(limits={"max_stpes": 3})}, ForkError, "names no limit: max_stpes"),
        (0, {"edit": {"limits": {}}}, TypeError, "edit must be a ForkEdit"),
    ],
)
def test_a_fork_that_cannot_be_taken_says_why_and_stores_nothing(
    tmp_path: Any, at: Any, keywords: dict[str, Any], error: type[Exception], match: str
) -> None:
    """Bad input is a clear error before anything is stored or called."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source_run(store, "sync")
        stored = sorted(run.run_id for run in store.list_runs())
        counts = Counts()
        agent, _ = make_agent(counts)
        with pytest.raises(error, match=match):
            agent.fork("src", at, store=store, **keywords)
        assert sorted(run.run_id for run in store.list_runs()) == stored == ["src", "src/r1"]
        assert counts.made == 0
        assert counts.model == 0


def test_a_fork_of_the_last_transition_into_done_is_refused(tmp_path: Any) -> None:
    """Nothing comes after Done: the error says to fork at an earlier transition."""
    agent, _ = make_agent(Counts())
    source = finished(agent, agent.start("go"), None)
    with pytest.raises(ForkError, match="ends the source in Done"):
        agent.fork(source, len(source.trace) - 1)


def test_a_stored_run_id_needs_its_store() -> None:
    """A run id without ``store=`` says which store is missing."""
    agent, _ = make_agent(Counts())
    with pytest.raises(ForkError, match="needs store="):
        agent.fork("src", 0)


def test_two_owners_forking_under_one_id_store_one_fork(tmp_path: Any) -> None:
    """Two threads fork the same run under the same id at once: one fork is stored, the other is refused."""
    with open_store(str(tmp_path / "runs.db")) as store:
        source_run(store, "sync")
        counts = Counts()
        agent, _ = make_agent(counts)
        barrier = threading.Barrier(2)
        outcomes: list[object] = []

        def fork() -> None:
            barrier.wait()
            try:
                outcomes.append(agent.fork("src", 3, store=store, run_id="same"))
            except RunExistsError as exc:
                outcomes.append(exc)

        threads = [threading.Thread(target=fork) for _ in range(2)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        forks = [o for o in outcomes if isinstance(o, AgentRun)]
        assert len(forks) == 1
        assert sum(isinstance(o, RunExistsError) for o in outcomes) == 1
        finished(agent, forks[0], store)
        assert counts.made == 0


def test_a_fork_at_and_after_a_compaction_keeps_the_compacted_history() -> None:
    """Forked at each transition around a context overflow, the fork ends like the source and repeats no call."""
    from fsm_agent import ContextOverflowError
    from fsm_agent.testing import FakeModel

    counts = Counts()
    compactions: list[int] = []

    def keep_last(messages: list[Message]) -> list[Message]:
        compactions.append(len(messages))
        return [messages[0], Message("user", "so far: add(1, 2) gave 3")]

    def agent(model: Any) -> Agent:
        agent, _ = make_agent(counts, system="s", compact=keep_last, on_stop={"context_overflow": "compact"})
        agent.model = model
        return agent

    script: list[Any] = [tool_turn(tool_call("add", id="a1", a=1, b=2)), ContextOverflowError("too long"), reply("3")]
    run = agent(FakeModel(script)).start("q")
    source = run.finish()
    with pytest.raises(ForkError, match=r"keeps its messages only: fork run.snapshot\(\)"):
        agent(FakeModel([])).fork(source, 5)  # the overflow is in no message: a snapshot has it
    overflow = edges_of(source).index("AwaitModel->AwaitModel[compacts_history]")
    for at in range(overflow - 1, len(source.trace) - 1):
        counts.__init__()  # type: ignore[misc]
        answers = FakeModel([reply("3")] if at >= overflow else [ContextOverflowError("too long"), reply("3")])
        result = agent(answers).fork(run.snapshot(), at).finish()
        assert (result.final, counts.made) == ("3", 0), at
        assert edges_of(result) == edges_of(source), at
        assert result.messages == source.messages


def edges_of(result: RunResult) -> list[str]:
    """The edges a run took, named as the table names them."""
    from fsm_agent.testing import edges

    return edges(result)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agent_call_made_again_forks_the_sub_agents_run_with_it(store_target: str, driver: str) -> None:
    """``rerun`` of a sub-agent call runs the sub-agent again, but its own completed call takes the recorded result."""
    with open_store(store_target) as store:
        source_run(store, driver)
        counts = Counts()
        agent, _ = make_agent(counts)
        if driver == "sync":
            result = finished(agent, agent.fork("src", 0, store=store, run_id="f", rerun={"r1"}), store)
        else:

            async def go() -> RunResult:
                return await afinished(agent, await agent.afork("src", 0, store=store, run_id="f", rerun={"r1"}), store)

            result = asyncio.run(go())
        assert counts.tools == {"add": 0, "charge": 0, "lookup": 0}
        assert counts.child_model == 2  # the sub-agent thought again
        research = next(s for s in result.steps if s.detail.startswith("research"))
        assert research.reused_from is None
        assert research.child == "f/r1"
        (lookup,) = [s for s in store.load("f/r1")["steps"] if s["kind"] == "tool_call"]
        assert lookup["reused_from"] == "src/r1/l1"
