"""The async driver never calls a store's blocking methods: every read and write it makes is awaited.

Each test drives the async paths (``arun``, ``aresume``, ``afinish``,
sub-agents, ``Session.arun``/``aresume``) over ``AsyncOnly``, a store whose
sync methods raise and whose async twins do the work, so a sync call from the
event loop (or from a worker thread the async path started) fails the test.
"""

from __future__ import annotations

import ast
import asyncio
import inspect
import re
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from support.async_only import BLOCKING, AsyncOnly
from support.children_of_a_start import child_start_of

from fsm_agent import Agent, AgentLoopError, CancelToken, ModelResponse, RunResult, Session, SqliteStore, ToolRegistry
from fsm_agent.batch import run_batch
from fsm_agent.drivers import child_runs, child_stored, stored
from fsm_agent.jsontext import input_digest
from fsm_agent.persist.store import JournaledStore, traits
from fsm_agent.testing import FakeModel, demo_registry, edges, reply, tool_call, tool_turn


@pytest.fixture
def inner(tmp_path: Path) -> Any:
    """A SQLite store the tests set runs up in (sync) before handing ``AsyncOnly`` over it to the async driver."""
    with SqliteStore(tmp_path / "runs.db", lease=0.3) as store:
        yield store


def _asks(question: str = "capital of France?", call_id: str = "c1") -> ModelResponse:
    return tool_turn(tool_call("research", id=call_id, input=question))


def _parent(child: Agent, script: list[Any], **options: Any) -> Agent:
    registry = demo_registry()
    registry.register(child.as_tool("research", "Answers one research question."))  # type: ignore[arg-type]
    return Agent(FakeModel(script), registry, **options)


def test_the_wrapper_is_a_journaled_store_that_refuses_every_sync_call(inner: SqliteStore) -> None:
    """The guard itself: the journal takes it for a journaled store with async twins; a sync resume raises."""
    store = AsyncOnly(inner)
    assert isinstance(store, JournaledStore)
    assert {"load", "claim", "append", "renew", "keep"} <= traits(store).awaits  # type: ignore[arg-type]
    paused = Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="x")), reply("sent")), _send(), approve={"send"})
    result = asyncio.run(paused.arun("mail x", store=store, run_id="m"))
    assert result.reason == "paused"
    with pytest.raises(AssertionError, match=BLOCKING):
        paused.resume(result, approvals={"s1": True}, store=store)


def test_a_parent_and_its_new_child_run_with_awaited_store_calls_only(inner: SqliteStore) -> None:
    """A sub-agent on the async driver is looked up, created and driven through the store's async twins."""
    store = AsyncOnly(inner)
    child = Agent(FakeModel(reply("Paris")), ToolRegistry())
    result = asyncio.run(_parent(child, [_asks(), reply("It is Paris.")]).arun("trip", store=store, run_id="trip"))
    assert result.final == "It is Paris."
    assert inner.load("trip/c1")["final"] == "Paris"
    assert {"aload", "acreate", "aappend"} <= set(store.awaited)


def test_a_finished_stored_child_is_read_back_with_aload(inner: SqliteStore) -> None:
    """A child already finished in the store is read back through ``aload``, never run again."""
    child_model = FakeModel(reply("Paris"))
    child = Agent(child_model, ToolRegistry())
    store = AsyncOnly(inner)

    async def parent_after_its_child() -> RunResult:
        parent = await _parent(child, [_asks(), reply("It is Paris.")]).astart("trip", store=store, run_id="trip")
        link = {"parent_run_id": "trip", "parent_call_id": "c1", "input_digest": input_digest("capital of France?")}
        done = child._begin(  # the child this parent began, as its driver begins it; then the parent died
            "capital of France?", None, (), inner, "trip/c1", parent=link, start_id=child_start_of(parent, "c1")
        )
        done._open_store(new=True)
        done.finish()
        return await parent.afinish()

    result = asyncio.run(parent_after_its_child())
    assert result.final == "It is Paris."
    assert len(child_model.seen) == 1


def test_an_unfinished_child_leased_to_a_dead_owner_is_waited_for_and_taken_over_awaited(inner: SqliteStore) -> None:
    """The parent waits out the dead owner's lease with ``asyncio.sleep`` and claims the child with ``aclaim``."""
    registry = ToolRegistry()
    calls: list[str] = []

    def look_up(city: str) -> str:
        """Look one city up."""
        calls.append(city)
        return "capital"

    registry.register(look_up)
    script = [tool_turn(tool_call("look_up", id="l1", city="Paris")), reply("Paris")]
    link = {"parent_run_id": "trip", "parent_call_id": "c1", "input_digest": input_digest("capital of France?")}
    store = AsyncOnly(inner)
    child = Agent(FakeModel(script[1:]), registry)

    async def parent_after_its_child_died() -> RunResult:
        parent = await _parent(child, [_asks(), reply("It is Paris.")]).astart("trip", store=store, run_id="trip")
        begun = child_start_of(parent, "c1")
        cut = Agent(FakeModel(script), registry)._begin(
            "capital of France?", None, (), inner, "trip/c1", parent=link, start_id=begun
        )
        cut._open_store(new=True)  # stored as a parent's driver stores its child
        while not cut.steps:
            cut.advance()  # the call ran and is checkpointed; then its process died, holding the lease
        return await parent.afinish()

    started = time.monotonic()
    result = asyncio.run(parent_after_its_child_died())
    assert time.monotonic() - started >= 0.2  # it waited for the lease (0.3 s) to lapse
    assert result.final == "It is Paris."
    assert calls == ["Paris"]
    assert "aclaim" in store.awaited


def _send() -> ToolRegistry:
    registry = ToolRegistry()

    def send(to: str) -> str:
        """Send a mail."""
        return f"sent to {to}"

    registry.register(send)
    return registry


def test_a_paused_run_is_decided_and_continued_on_the_same_object_with_awaited_writes(inner: SqliteStore) -> None:
    """``decide`` then ``afinish``: the released run is taken back by an awaited write before the approved call."""
    store = AsyncOnly(inner)
    agent = Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="x")), reply("sent")), _send(), approve={"send"})

    async def go() -> RunResult:
        run = agent._begin("mail x", None, (), store, "m")  # start() without its claim, which is sync
        await run._aopen_store(new=True)
        assert (await run.afinish()).reason == "paused"
        run.decide({"s1": True})
        return await run.afinish()

    result = asyncio.run(go())
    assert result.final == "sent"
    assert inner.load("m")["state"] == "Done"
    assert store.awaited[0] == "acreate"
    assert set(store.awaited[1:]) == {"aappend"}


def test_aresume_continues_a_paused_run_with_its_decisions_awaited(inner: SqliteStore) -> None:
    """``Agent.aresume`` claims a paused run with ``aclaim``; ``afinish`` runs the approved call to the end."""
    store = AsyncOnly(inner)
    agent = Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="x")), reply("sent")), _send(), approve={"send"})

    async def go() -> RunResult:
        paused = await agent.arun("mail x", store=store, run_id="m")
        assert paused.reason == "paused"
        run = await agent.aresume(paused, approvals={"s1": True}, store=store)
        return await run.afinish()

    result = asyncio.run(go())
    assert result.final == "sent"
    assert inner.load("m")["state"] == "Done"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_resume_and_aresume_lift_a_stop_alike(inner: SqliteStore, driver: str) -> None:
    """A run stopped on max_steps resumes with a higher limit: the same resume edge and result on both."""
    script = FakeModel(tool_turn(tool_call("add", id="a1", a=1, b=2)), reply("3"))
    agent = Agent(script, demo_registry(), max_steps=1, on_stop={"max_steps": "return"})
    stopped = agent.run("add", store=inner, run_id="r")
    assert stopped.reason == "max_steps"
    if driver == "sync":
        result = agent.resume(stopped, store=inner, max_steps=3).finish()
    else:
        store = AsyncOnly(inner)

        async def go() -> RunResult:
            run = await agent.aresume(stopped, store=store, max_steps=3)
            assert run.trace[-1].trigger == "resume"
            return await run.afinish()

        result = asyncio.run(go())
    assert result.final == "3"
    resumed = [edge for edge in edges(result) if edge.startswith("Failed->")]
    assert resumed == ["Failed->AwaitModel[resumes_before_model]"]
    assert inner.load("r")["state"] == "Done"


def test_session_turns_and_their_resume_await_every_store_call(inner: SqliteStore) -> None:
    """``Session.arun`` reads the conversation with ``alist_runs``/``aload``; ``Session.aresume`` decides a pause."""
    script = [reply("hello"), tool_turn(tool_call("send", id="s1", to="x")), reply("sent")]
    agent = Agent(FakeModel(script), _send(), approve={"send"})
    session = Session(agent, inner, session_id="chat")  # built (and read) before the loop runs
    session.store = store = AsyncOnly(inner)  # type: ignore[assignment]

    async def go() -> RunResult:
        assert (await session.arun("hi")).final == "hello"
        assert (await session.arun("mail x")).reason == "paused"
        return await session.aresume({"s1": True})

    result = asyncio.run(go())
    assert result.final == "sent"
    assert session.turns == 2
    assert inner.load("chat/2")["state"] == "Done"
    assert {"alist_runs", "aload", "aclaim"} <= set(store.awaited)


def test_a_local_batch_starts_resumes_and_reads_back_its_runs_with_awaited_store_calls_only(
    inner: SqliteStore,
) -> None:
    """The batch's event loop never waits on the store: new runs, a cut-off run taken up, and ended runs read back."""
    executed: list[str] = []
    models: list[FakeModel] = []

    def make_agent() -> Agent:
        registry = ToolRegistry()

        @registry.register
        def note(text: str) -> str:
            """Note a text."""
            executed.append(text)
            return f"noted {text}"

        # Each run's model: one note, then an answer (a run taken up again has its note answered already).
        models.append(FakeModel([tool_turn(tool_call("note", text="x")), reply("done")]))
        return Agent(models[-1], registry)

    interrupted = CancelToken()
    interrupted.cancel("the batch was interrupted")
    with pytest.raises(AgentLoopError, match="cancelled"):
        make_agent().run("cut", store=inner, run_id="cut", cancel=interrupted)  # stored Failed/cancelled at once
    store = AsyncOnly(inner)
    items = [{"input": "one", "run_id": "one"}, {"input": "cut", "run_id": "cut"}]
    first = run_batch(make_agent, items, store=store, executor="local", progress=False)  # type: ignore[arg-type]
    assert [r.final for r in first] == ["done", "done"]
    assert executed == ["x", "x"]
    assert {"aload", "acreate", "aclaim", "aappend"} <= set(store.awaited)
    again = run_batch(make_agent, items, store=store, executor="local", progress=False)  # type: ignore[arg-type]
    assert again == first
    assert executed == ["x", "x"]  # read back: no tool runs again


def test_a_store_given_as_a_path_is_opened_off_the_loop(tmp_path: Path) -> None:
    """``arun`` and ``aresume`` open a store named by its path in a worker thread, then use it like any store."""
    path = str(tmp_path / "opened.db")
    agent = Agent(FakeModel(tool_turn(tool_call("send", id="s1", to="x")), reply("sent")), _send(), approve={"send"})
    opened_on: list[bool] = []

    async def go() -> RunResult:
        loop_thread = threading.get_ident()
        original = stored.store_for

        def spy(target: Any) -> Any:
            opened_on.append(threading.get_ident() == loop_thread)
            return original(target)

        stored.store_for = spy  # type: ignore[assignment]
        try:
            paused = await agent.arun("mail x", store=path, run_id="m")
            run = await agent.aresume(paused, approvals={"s1": True}, store=path)
        finally:
            stored.store_for = original  # type: ignore[assignment]
        return await run.afinish()

    assert asyncio.run(go()).final == "sent"
    assert opened_on == [False, False]
    with SqliteStore(path) as store:
        assert store.load("m")["state"] == "Done"


# --- one shape, two drivers ------------------------------------------------------------------------------------

TWINS = [
    (child_runs._begin, child_runs._abegin),
    (child_stored.taken_over, child_stored.ataken_over),
    (Agent.resume, Agent.aresume),
    (Session._catch_up, Session._acatch_up),
    (Session._take_over, Session._atake_over),
    (Session._check_ours, Session._acheck_ours),
    (Session._resumed_last, Session._aresumed_last),
    (Session._still_last, Session._astill_last),
    (Session._still_based, Session._astill_based),
]
SYNC_NAMES = {
    "astored": "stored",
    "ataken_over": "taken_over",
    "aresume": "resume",
    "asyncio.sleep": "time.sleep",
    "_aopen_store": "_open_store",
    "_aafter": "_after",
    "_aclaimed": "_claimed",
    "astore_for": "store_for",
    "_astill_last": "_still_last",
    "_aput_back": "_put_back",
}


class _NoAwait(ast.NodeTransformer):
    def visit_Await(self, node: ast.Await) -> ast.AST:
        return self.visit(node.value)


def _statements(function: Any, awaited: bool) -> list[str]:
    """The body of ``function`` after its docstring, one statement a line; an async one as its sync twin would read."""
    node = ast.parse(textwrap.dedent(inspect.getsource(function))).body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    body = node.body[1:] if ast.get_docstring(node) else node.body
    lines = [ast.unparse(_NoAwait().visit(statement) if awaited else statement) for statement in body]
    if not awaited:
        return lines
    lines = [line for line in lines if line != "import asyncio"]  # imported where awaited: see drivers.aio
    # awaited(store, "load", run_id) is the async twin of store.load(run_id)
    lines = [re.sub(r"\bawaited\((\w+), '(\w+)'(, )?", r"\1.\2(", line) for line in lines]
    for name, sync in SYNC_NAMES.items():
        lines = [re.sub(rf"\b{re.escape(name)}\b", sync, line) for line in lines]
    return lines


@pytest.mark.parametrize(("sync", "awaited"), TWINS, ids=[pair[0].__qualname__ for pair in TWINS])
def test_the_async_twin_is_the_sync_method_awaited(sync: Any, awaited: Any) -> None:
    """Each async path reads as its sync twin once ``await`` and the store's async twins are taken away."""
    assert inspect.iscoroutinefunction(awaited)
    lines = _statements(sync, awaited=False)
    assert len(lines) >= 3
    assert _statements(awaited, awaited=True) == lines
