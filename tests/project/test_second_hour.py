"""A newcomer's second hour: the how-to pages after the tutorial followed literally, then the mistakes a user makes.

The pages walked (mcp, ray, postgresql, ag-ui, sub-agents, typed-answers,
cost-budget, guardrails, deps, test-from-recordings, fork-a-run,
conversations, watching-runs, opentelemetry, model-adapter, store) run as
written (``test_docs_examples`` runs them too); what is here is each defect
the mistakes found, now fixed (each test was ``xfail(strict=True)`` until
then): an error that does not say what is wrong, an effect made before a
refusal, something the user or the model gave that is silently dropped.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path

import pytest
from support.second_hour import (
    App,
    DictStore,
    OneArgumentWantsStore,
    asks_for_orders,
    my_orders,
    returns_no_agent,
)

from fsm_agent import Agent, AgentLoopError, RunView, Session, SqliteStore, StopCondition
from fsm_agent.persist.recording import RecordingError
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

# --- MCP (docs/how-to/mcp.md) ------------------------------------------------------------------------------------


@pytest.mark.subprocess
def test_stdio_tools_given_its_args_as_one_string_is_refused_before_a_process_starts(tmp_path: Path) -> None:
    """``stdio_tools(sys.executable, "calc_server.py")``: the page passes ``["calc_server.py"]``, a user drops the list.

    Today ``list(args)`` makes it ``python c a l c _ s e r v e r . p y``: the
    process is started, exits 2 on ``can't open file '.../c'``, and the
    ConnectionError names ``'python c a l c _ s e r v e r . p y'``
    (fsm_agent/mcp/__init__.py, stdio_tools: a str is a Sequence[str]).
    """
    from fsm_agent.mcp import stdio_tools

    server = tmp_path / "calc_server.py"
    server.write_text("raise SystemExit('never started')\n", encoding="utf-8")
    with pytest.raises(TypeError, match="args"), stdio_tools(sys.executable, str(server)):
        pass


# --- guardrails (docs/how-to/guardrails.md) -----------------------------------------------------------------------


def test_a_guardrail_check_that_returns_no_bool_stops_the_run_instead_of_never_tripping() -> None:
    """A check that forgets its ``return``: the page says it "returns true when the run must stop".

    Today the guard is ``bool(check(view))`` (fsm_agent/definition/stops.py,
    StopCondition.guard): None is false, so the leaked key reaches
    ``Done`` and the guardrail is off without a word; a check returning a
    str trips on any text. An ``async def`` check, whose coroutine is
    truthy, is already refused for the same reason.
    """

    def leaks_a_key(view: RunView) -> bool:
        """The answer contains an API key."""
        if view.last_response is not None and "sk-" in view.last_response.message.content:
            print("leak!")  # the `return True` forgotten
        return None  # type: ignore[return-value]  # what a body without a return gives back

    guardrail = StopCondition("leaked_key", "answer", leaks_a_key, "the answer contains an API key")
    agent = Agent(FakeModel(reply("Your key is sk-123.")), demo_registry(), stop_conditions=[guardrail])
    with pytest.raises(AgentLoopError) as stop:
        agent.run("Which key do I use?")
    assert stop.value.reason == "stop_condition_error"
    assert "NoneType" in stop.value.evidence["error"]
    assert stop.value.result.final == "Your key is sk-123."


# --- deps (docs/how-to/deps.md) -----------------------------------------------------------------------------------


def test_deps_of_another_type_than_the_tools_declare_are_refused_before_the_model_is_called() -> None:
    """``agent.run(q, deps="alice")`` where ``my_orders`` takes ``RunContext[App]``.

    Today the run is not refused: the model is called, the tool fails with
    ``AttributeError: 'str' object has no attribute 'orders'`` (which only
    the model reads) and the run ends ``done`` with an answer built on
    nothing. The registry reads the annotation already
    (fsm_agent/tools/registry.py); a plain class ``T`` can be checked
    against the deps when the run starts.
    """
    model = asks_for_orders()
    with pytest.raises(TypeError, match="App") as refused:
        Agent(model, [my_orders]).run("What did I order?", deps="alice")
    assert "str" in str(refused.value)
    assert model.seen == []
    assert Agent(asks_for_orders(), [my_orders]).run("What did I order?", deps=App("alice")).ok  # the right type runs


# --- a custom store (docs/how-to/store.md) ------------------------------------------------------------------------


def test_a_custom_store_whose_wants_takes_the_wrong_arguments_is_refused_before_the_model_is_called() -> None:
    """The page's minimal store with ``wants(self, state)``: ``paused`` forgotten.

    Today the run starts (``save`` of the first snapshot does not ask
    ``wants``), the model is called, and only then ``wants`` raises a bare
    ``TypeError`` out of ``run`` (no AgentLoopError, no result): the reply
    was paid for and is lost, the store still holds the run at
    ``AwaitModel``, and a resume asks the model again
    (fsm_agent/persist/checkpoints.py calls ``store.wants`` first at the
    second checkpoint). The store's kind is checked when a run starts; its
    ``wants`` could be called (or its signature read) then.
    """
    model = FakeModel(tool_turn(tool_call("add", a=2, b=3)), reply("5"))
    store = OneArgumentWantsStore()
    with pytest.raises(TypeError, match="wants"):
        Agent(model, demo_registry()).run("What is 2 + 3?", store=store, run_id="job-1")
    assert model.seen == []
    ran = Agent(FakeModel(reply("5")), demo_registry()).run("What is 2 + 3?", store=DictStore(), run_id="job-1")
    assert ran.ok  # the page's store, right, works


# --- test from recordings (docs/how-to/test-from-recordings.md) --------------------------------------------------


def test_replay_given_a_recording_files_path_as_text_says_to_pass_a_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``replay(agent, "recordings/test_adds.json")``, the file the page's ``runs export --out`` wrote.

    A text is read as the recording's JSON (fsm_agent/persist/recording.py,
    read_recording): the user is told ``recording is not valid JSON:
    Expecting value: line 1 column 1 (char 0)`` about a file that is valid
    JSON. A text that is the name of an existing file could be read, or
    the error could say to pass ``Path(...)``.
    """
    from fsm_agent.testing.replay import replay

    monkeypatch.chdir(tmp_path)
    model = FakeModel(tool_turn(tool_call("add", id="call_1", a=2, b=3)), reply("5"))
    with SqliteStore("runs.db") as store:
        Agent(model, demo_registry(), system="You add numbers.").run("What is 2 + 3?", store=store, run_id="adds-1")
        Path("recordings").mkdir()
        Path("recordings/test_adds.json").write_text(json.dumps(store.export("adds-1")), encoding="utf-8")
    agent = Agent(FakeModel(), demo_registry(), system="You add numbers.")
    assert replay(agent, Path("recordings/test_adds.json")).final == "5"  # the Path works
    with pytest.raises(RecordingError) as refused:
        replay(agent, "recordings/test_adds.json")
    assert "Path" in str(refused.value) or "file" in str(refused.value), refused.value


# --- conversations (docs/how-to/conversations.md) -----------------------------------------------------------------


def test_a_request_id_sent_again_with_another_question_is_refused_not_answered_with_the_old_turn() -> None:
    """``chat.run("Delete my account.", request_id="req-1")`` after ``req-1`` asked "My name is Ada.".

    The page: "The same request again ... takes no turn and calls nothing:
    it gets that turn's result". Today a request with the same id and a
    different question is taken for the same request: the old answer comes
    back as this one's, the new question is in no message and the model is
    never asked (a client that reuses AG-UI ``runId`` loses its users'
    messages the same way). A question that differs from the turn's
    recorded one is another request: a ValueError naming the id, as
    run_batch does for an input edited under its run id.
    """
    model = FakeModel(reply("Hello, Ada."), reply("Your account is deleted."))
    chat = Session(Agent(model, demo_registry()), session_id="greet")
    chat.run("My name is Ada.", request_id="req-1")
    with pytest.raises(ValueError, match="req-1"):
        chat.run("Delete my account.", request_id="req-1")
    assert chat.turns == 1
    assert len(model.seen) == 1


def test_an_empty_session_id_is_refused_by_its_own_name() -> None:
    """``Session(agent, store=..., session_id="")`` (an unset environment variable, say).

    Today: ``run_id must not be empty (leave it out, or None, for a fresh
    id)``; the user passed no run_id, and leaving session_id out gives a
    fresh conversation, not this user's. ``session_id=5`` is ``run_id must
    be a str``. The check is the run id's (fsm_agent/persist/checks.py,
    check_run_id) reached from Session without its own name.
    """
    with pytest.raises(ValueError, match="session_id"):
        Session(Agent(FakeModel(reply("Hi.")), demo_registry()), session_id="")
    with pytest.raises(TypeError, match="session_id"):
        Session(Agent(FakeModel(reply("Hi.")), demo_registry()), session_id=5)  # type: ignore[arg-type]


def test_an_ag_ui_request_with_an_empty_thread_id_is_told_so_by_its_name() -> None:
    """A client posting ``{"threadId": "", ...}``: the body is malformed for this endpoint.

    Today the stream answers ``RUN_ERROR`` with code ``ValueError`` and
    message ``run_id must not be empty (leave it out, or None, for a fresh
    id)``: an AG-UI client has no run_id to leave out, and its ``runId``
    was given. A missing threadId is a 422 naming it; an empty one should
    name it too (fsm_agent/agui/server.py, or Session as above).
    """
    testclient = pytest.importorskip("starlette.testclient", reason="pip install 'fsm-agent[agui]'")
    from fsm_agent.agui import app

    model = FakeModel(reply("Hello."))
    body = {"threadId": "", "runId": "r1", "messages": [{"id": "m1", "role": "user", "content": "Hi."}]}
    with testclient.TestClient(app(lambda run_input: Agent(model, demo_registry()))) as client:
        response = client.post("/", json=body)
    assert model.seen == []
    if response.status_code == 422:
        told = response.json()["error"]
    else:
        events = [json.loads(line[6:]) for line in response.text.splitlines() if line.startswith("data: ")]
        told = events[-1]["message"]
    assert "threadId" in told, told


# --- a batch (docs/how-to/ray.md) ---------------------------------------------------------------------------------


def test_a_batch_factory_that_returns_no_agent_says_so(tmp_path: Path) -> None:
    """``run_batch(make_agent, ...)`` where ``make_agent`` returns something else than an Agent.

    Each result is an ``error`` whose message is ``'str' object has no
    attribute 'astart'``, on Ray as on ``executor="local"``: the user is
    not told that their factory returned a str where an Agent was wanted
    (the message ``make_agent must be a callable with no arguments
    returning an Agent`` exists for an Agent passed as the factory;
    fsm_agent/batch/worker.py could check what the factory returned).
    """
    from fsm_agent.batch import run_batch

    results = run_batch(returns_no_agent, ["q1"], store=str(tmp_path / "runs.db"), progress=False, executor="local")
    (result,) = results
    assert result.reason == "error"
    error = result.evidence["error"]
    assert "Agent" in error, error
    assert "returns_no_agent" in error or "make_agent" in error, error


# --- OpenTelemetry (docs/how-to/opentelemetry.md) -----------------------------------------------------------------


def test_instrumenting_an_agent_twice_does_not_trace_each_run_twice() -> None:
    """``instrument(agent, provider)`` run twice (in a factory, at import and in main).

    Today every span is there twice: two ``invoke_agent`` roots for the
    one run, four ``chat`` spans for two model calls, each ``execute_tool``
    twice, so a trace backend counts tokens and calls double. For a
    sub-agent a later ``instrument`` takes the instrumentation over
    (fsm_agent/otel/__init__.py, module docstring); for the agent itself it
    adds a second set of hooks. Expected: the second call takes over, or
    is refused.
    """
    pytest.importorskip("opentelemetry.sdk", reason="pip install 'fsm-agent[otel]'")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fsm_agent.otel import instrument

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = Agent(FakeModel(tool_turn(tool_call("add", a=1, b=2)), reply("3")), demo_registry())
    instrument(agent, provider)
    with contextlib.suppress(ValueError, RuntimeError):  # refusing the second call is a fix too
        instrument(agent, provider)
    agent.run("What is 1 + 2?", run_id="once")
    names = sorted(span.name for span in exporter.get_finished_spans())
    assert names == ["chat", "chat", "execute_tool add", "invoke_agent"], names
