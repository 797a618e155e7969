"""A run that continues an earlier conversation: ``history=`` on ``run``, ``arun``, ``start`` and the streams."""

from __future__ import annotations

import asyncio
import base64
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.provider_rules import anthropic_thinking, gemini_thought_signatures, openai_reasoning
from support.provider_server import QUESTION, ProviderServer, body

from fsm_agent import Agent, AgentLoopError, Message, RunResult, ToolCall, TransitionEvent
from fsm_agent.errors import SnapshotError
from fsm_agent.persist import SqliteStore, open_store
from fsm_agent.testing import FakeModel, ManualClock, demo_registry, reply, tool_call, tool_turn

EARLIER = (
    Message("system", "An older system prompt."),
    Message("user", "Echo hi."),
    Message("assistant", "", (ToolCall("h1", "echo", {"text": "hi"}),)),
    Message("tool", '"hi"', tool_call_id="h1"),
    Message("assistant", "It said hi."),
)
"""An earlier conversation with a tool turn, as a caller keeps it, its own system prompt included."""
WITHOUT_SYSTEM = EARLIER[1:]
AGAIN = "And now?"


def _agent(model: FakeModel, system: str = "Be terse.", **options: Any) -> Agent:
    return Agent(model, demo_registry(), system, clock=ManualClock(), **options)


def _outcome(go: Any) -> RunResult:
    """The run's result, also when it stopped (then the stop's result)."""
    try:
        return go()  # type: ignore[no-any-return]
    except AgentLoopError as exc:
        return exc.result


# --- the messages a run starts from ----------------------------------------------------------------------


def test_the_model_sees_the_system_prompt_once_then_the_history_without_its_system_message_then_the_question() -> None:
    """The agent's system prompt leads; the history's own system message is dropped; the new question comes last."""
    model = FakeModel(reply("Still hi."))
    result = _agent(model).run(AGAIN, history=list(EARLIER))
    opening = (Message("system", "Be terse."), *WITHOUT_SYSTEM, Message("user", AGAIN))
    assert model.seen == [opening]
    assert result.messages == (*opening, Message("assistant", "Still hi."))
    assert result.prior == len(opening) - 1
    assert result.messages[result.prior :][0] == Message("user", AGAIN)


def test_without_a_system_prompt_the_run_starts_with_the_history() -> None:
    """No system prompt: the history's messages come first, and the count before the run is the history's."""
    model = FakeModel(reply("Still hi."))
    result = _agent(model, system="").run(AGAIN, history=WITHOUT_SYSTEM)
    assert model.seen == [(*WITHOUT_SYSTEM, Message("user", AGAIN))]
    assert result.prior == len(WITHOUT_SYSTEM)


def test_an_earlier_result_is_a_history_and_runs_chain() -> None:
    """history=result continues with its messages: a third run sees the first two, the system prompt once."""
    model = FakeModel(tool_turn(tool_call("add", id="a", a=2, b=3)), reply("5"), reply("10"), reply("20"))
    agent = _agent(model)
    first = agent.run("2+3?")
    second = agent.run("Double it.", history=first)
    third = agent.run("Double again.", history=second)
    assert model.seen[2] == (*first.messages, Message("user", "Double it."))
    assert third.messages == (*second.messages, Message("user", "Double again."), Message("assistant", "20"))
    assert [m.content for m in third.messages if m.role == "system"] == ["Be terse."]
    assert (first.prior, second.prior, third.prior) == (1, len(first.messages), len(second.messages))


def test_a_run_without_history_counts_only_its_system_prompt_before_it() -> None:
    """prior is 1 with a system prompt and 0 without: the run's own messages start at its question."""
    assert _agent(FakeModel(reply("a"))).run("q").prior == 1
    assert _agent(FakeModel(reply("a")), system="").run("q").prior == 0


# --- the limits bound this run, not the conversation ---------------------------------------------------------


def _long_history(turns: int) -> list[Message]:
    history = [Message("user", "Count.")]
    for n in range(turns):
        history += [Message("assistant", "", (ToolCall(f"h{n}", "echo", {"text": "same"}),))]
        history += [Message("tool", '"same"', tool_call_id=f"h{n}")]
    return [*history, Message("assistant", "Counted.")]


def test_counters_start_at_zero_however_long_the_history() -> None:
    """max_steps=1 after five earlier turns still allows a model turn; the counters and usage are this run's."""
    model = FakeModel(reply("Done."))
    result = _agent(model, max_steps=1, max_tool_calls=1).run(AGAIN, history=_long_history(5))
    assert result.ok
    (final,) = result.steps
    assert final.counters["steps"] == [1, 1]
    assert final.counters["tool_calls"] == [0, 1]
    assert result.trace[0].source == "AwaitModel"


def test_a_call_the_history_made_last_is_not_a_repeat_in_the_new_run() -> None:
    """The repeated-action signature and the cycle window start empty: the same echo again is a fresh call."""
    model = FakeModel(tool_turn(tool_call("echo", id="n1", text="same")), reply("Done."))
    result = _agent(model, cycle_window=4).run(AGAIN, history=_long_history(3))
    assert result.ok
    assert [s.kind for s in result.steps] == ["tool_call", "final"]


# --- a history the providers would refuse is refused first ----------------------------------------------------


ASKED = Message("assistant", "", (ToolCall("c1", "echo", {"text": "x"}), ToolCall("c2", "add", {"a": 1, "b": 2})))


@pytest.mark.parametrize(
    ("history", "error", "message"),
    [
        (
            [Message("user", "q"), ASKED, Message("tool", "x", tool_call_id="c1")],
            ValueError,
            "history has tool calls no tool message answers: 'c2' (add, asked in history[1]); "
            "answer them or leave them out",
        ),
        (
            [Message("user", "q"), ASKED, Message("user", "never mind"), Message("assistant", "ok")],
            ValueError,
            "history has tool calls no tool message answers: 'c1' (echo, asked in history[1]), "
            "'c2' (add, asked in history[1]); answer them or leave them out",
        ),
        (
            [Message("user", "q"), Message("tool", "5", tool_call_id="zz"), Message("assistant", "5")],
            ValueError,
            "history has tool messages answering no open call: history[1] (answers 'zz'); leave them out",
        ),
        (
            [Message("user", "q"), {"role": "assistant", "content": "hi"}],
            TypeError,
            "history[1] must be a Message, got dict",
        ),
        ([Message("user", "q"), Message("bot", "hi")], ValueError, "history[1] has role 'bot'"),
        ("earlier chat", TypeError, "history must be a RunResult or a sequence of Message, got str"),
    ],
    ids=["unanswered-at-the-end", "unanswered-in-the-middle", "answer-to-nothing", "not-a-message", "role", "str"],
)
def test_a_history_the_providers_would_refuse_is_an_error_before_anything_is_called_or_stored(
    tmp_path: Path, history: Any, error: type[Exception], message: str
) -> None:
    """Unanswered calls, stray answers and non-messages are refused by name; no model call, nothing stored."""
    model = FakeModel(reply("never"))
    with SqliteStore(tmp_path / "runs.db") as store:
        with pytest.raises(error) as info:
            _agent(model).run(AGAIN, history=history, store=store)
        assert store.list_runs() == []
    assert str(info.value).startswith(message)
    assert model.seen == []


def test_a_stopped_run_with_unanswered_calls_is_refused_as_history_and_named() -> None:
    """A run stopped before its calls ran left them unanswered: chaining it says which call to answer."""
    model = FakeModel(tool_turn(tool_call("echo", id="e1", text="x")), reply("never"))
    stopped = _outcome(lambda: _agent(model, max_tool_calls=0).run("q"))
    assert stopped.reason == "max_tool_calls"
    with pytest.raises(ValueError, match=r"'e1' \(echo, asked in history\[2\]\); answer them or leave them out"):
        _agent(model).run(AGAIN, history=stopped)
    assert len(model.seen) == 1


# --- every driver -------------------------------------------------------------------------------------------


def _script() -> FakeModel:
    return FakeModel(tool_turn(tool_call("add", id="d1", a=2, b=3)), reply("5 again"))


def test_the_sync_and_async_drivers_give_the_same_result() -> None:
    """run and arun over the same history and script give equal results (messages, steps, trace, prior)."""
    synced = _agent(_script()).run(AGAIN, history=EARLIER)
    awaited = asyncio.run(_agent(_script()).arun(AGAIN, history=EARLIER))
    assert synced == awaited
    assert awaited.prior == 5


def test_start_and_both_streams_take_a_history_too() -> None:
    """start() drives to the same result, and stream/astream yield this run's transitions over the history."""
    expected = _agent(_script()).run(AGAIN, history=EARLIER)
    assert _agent(_script()).start(AGAIN, history=EARLIER).finish() == expected
    streamed = [e for e in _agent(_script()).stream(AGAIN, history=EARLIER) if isinstance(e, TransitionEvent)]

    async def collect() -> list[Any]:
        return [e async for e in _agent(_script()).astream(AGAIN, history=EARLIER)]

    awaited = [e for e in asyncio.run(collect()) if isinstance(e, TransitionEvent)]
    assert [e.transition for e in streamed] == [e.transition for e in awaited] == list(expected.trace)
    assert streamed[-1].result == expected


# --- stored, resumed, replayed, traced -----------------------------------------------------------------------


def test_a_stored_history_run_stops_and_resumes_to_the_end(store_target: str) -> None:
    """Stopped by max_steps after five earlier turns, loaded from the store and resumed: the snapshot checks pass."""
    script = [tool_turn(tool_call("add", id="s1", a=2, b=3)), reply("Five.")]
    with open_store(store_target) as store:
        stopped = _outcome(
            lambda: _agent(FakeModel(script), max_steps=1).run(AGAIN, history=_long_history(5), store=store, run_id="h")
        )
        assert stopped.reason == "max_steps"
        saved = store.load("h")
        assert saved["prior"] == stopped.prior == 1 + len(_long_history(5))
        resumed = _agent(FakeModel(script[1:])).resume(saved, store=store, max_steps=2).finish()
        assert store.list_runs()[0].state == "Done"
    assert resumed.ok
    assert resumed.prior == stopped.prior
    assert resumed.messages[: stopped.prior] == stopped.messages[: stopped.prior]
    assert resumed.steps[-1].counters["steps"] == [2, 2]


def test_a_snapshot_from_before_prior_existed_loads_as_zero_and_a_wrong_prior_is_refused() -> None:
    """Older snapshots have no prior (0: the run's messages from the start); one past the messages is an error."""
    stopped = _outcome(lambda: _agent(_script(), max_steps=1).run("q"))
    assert stopped.snapshot is not None
    old = {k: v for k, v in stopped.snapshot.items() if k != "prior"}
    assert _agent(FakeModel(reply("5"))).resume(old, max_steps=2).finish().prior == 0
    for wrong in (-1, 99, "1", True):
        with pytest.raises(SnapshotError, match="snapshot field prior must be"):
            _agent(FakeModel(reply("5"))).resume({**stopped.snapshot, "prior": wrong}, max_steps=2)


def test_a_history_run_whose_counters_disagree_with_its_own_messages_is_still_refused() -> None:
    """The consistency check counts this run's messages: an extra assistant message of its own is caught."""
    stopped = _outcome(lambda: _agent(_script(), max_steps=1).run(AGAIN, history=EARLIER))
    assert stopped.snapshot is not None
    extra = {"role": "assistant", "content": "x", "tool_calls": [], "tool_call_id": None}
    forged = {**stopped.snapshot, "messages": [*stopped.snapshot["messages"], extra]}
    with pytest.raises(SnapshotError, match="turns is 1 but 2 assistant messages are recorded"):
        _agent(FakeModel(reply("5"))).resume(forged, max_steps=2)


def test_the_result_round_trip_keeps_prior_and_reads_older_dicts_as_zero() -> None:
    """to_dict/from_dict keep prior; a dict written before it existed reads back with prior 0."""
    result = _agent(FakeModel(reply("a"))).run(AGAIN, history=EARLIER)
    assert RunResult.from_dict(result.to_dict()) == result
    older = {k: v for k, v in result.to_dict().items() if k != "prior"}
    assert RunResult.from_dict(older).prior == 0
    with pytest.raises(ValueError, match="malformed RunResult dict"):
        RunResult.from_dict({**result.to_dict(), "prior": "5"})


def test_the_viewer_starts_this_runs_transitions_after_the_history(tmp_path: Path) -> None:
    """The first moment brings this run's first reply, not the history's; the digest counts this run's turns."""
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    from fsm_agent.ui import digest, moments

    with SqliteStore(tmp_path / "runs.db") as store:
        result = _agent(_script()).run(AGAIN, history=EARLIER, store=store, run_id="h")
        data = store.load("h")
    first = moments(data)[0]
    own = result.prior + 1  # the question, then this run's first reply
    assert (first["trigger"], first["messages"]) == ("replied", [own, own + 1])
    assert data["messages"][own]["tool_calls"][0]["id"] == "d1"
    shown = digest("h", data)
    assert shown["moments"][-1]["messages"][1] == len(data["messages"])
    assert (shown["steps"], shown["tool_calls"]) == (2, 1)


def test_the_run_span_holds_this_runs_question_not_the_historys() -> None:
    """gen_ai.input.messages of the run span is the new question, though the history starts with another."""
    pytest.importorskip("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import SimpleSpanProcessor
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from fsm_agent.otel import instrument

    exporter, provider = InMemorySpanExporter(), TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = _agent(_script())
    instrument(agent, provider, capture_content=True)
    agent.run(AGAIN, history=EARLIER)
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "invoke_agent"]
    sent = json.loads(str((span.attributes or {})["gen_ai.input.messages"]))
    assert sent[0]["parts"][0]["content"] == AGAIN


# --- over the real provider adapters -------------------------------------------------------------------------

KEY = "sk-test-4f3e2d1c0b9a8f7e6d5c"
FOLLOW_UP = "And (2+3)*8?"


def _two_runs(agent: Agent) -> tuple[RunResult, RunResult]:
    first = agent.run(QUESTION)
    return first, agent.run(FOLLOW_UP, history=first)


@pytest.fixture
def server(provider_server: ProviderServer) -> Iterator[ProviderServer]:
    """The loopback server enforcing every provider's rule on reasoning content (each rule ignores the others)."""
    provider_server.rules += [anthropic_thinking, openai_reasoning, gemini_thought_signatures]
    return provider_server


def test_anthropic_gets_the_earlier_turns_thinking_blocks_back_verbatim(server: ProviderServer) -> None:
    """Thinking, redacted thinking and tool uses of the earlier run go back as served, then the new question."""
    from fsm_agent.models import AnthropicModel

    names = ("thinking_tool_use", "thinking_second_tool", "thinking_final", "thinking_final")
    server.queue(*(body("anthropic", name) for name in names))
    thinking = {"type": "enabled", "budget_tokens": 2048}
    with AnthropicModel("claude-sonnet-4-5", api_key=KEY, base_url=server.url, max_retries=0, thinking=thinking) as m:
        first, second = _two_runs(Agent(m, demo_registry(), "Be terse."))
    assert second.ok
    assert second.prior == len(first.messages)
    earlier, sent = server.requests[2].json, server.requests[3].json
    assert sent["system"] == earlier["system"]
    assert sent["messages"] == [
        *earlier["messages"],
        {"role": "assistant", "content": body("anthropic", "thinking_final")["content"]},
        {"role": "user", "content": [{"type": "text", "text": FOLLOW_UP}]},
    ]
    assert sent["messages"][1]["content"] == body("anthropic", "thinking_tool_use")["content"]
    assert sent["messages"][3]["content"] == body("anthropic", "thinking_second_tool")["content"]


def test_openai_responses_gets_the_earlier_reasoning_items_back_before_their_calls(server: ProviderServer) -> None:
    """Every output item of the earlier run (reasoning with encrypted content first) is in the new input, in place."""
    from fsm_agent.models import OpenAIResponsesModel

    names = ("reasoning_call", "reasoning_second_call", "final_answer", "final_answer")
    server.queue(*(body("openai_responses", name) for name in names))
    with OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=server.url + "/v1", max_retries=0) as m:
        first, second = _two_runs(Agent(m, demo_registry(), "Be terse."))
    assert second.ok
    assert second.prior == len(first.messages)
    earlier, sent = server.requests[2].json, server.requests[3].json
    assert sent["instructions"] == "Be terse."
    assert sent["input"] == [
        *earlier["input"],
        *body("openai_responses", "final_answer")["output"],
        {"role": "user", "content": FOLLOW_UP},
    ]


def test_a_history_stripped_of_its_reasoning_items_is_refused_by_the_server(server: ProviderServer) -> None:
    """The same earlier run without its provider data is the Responses API's 400: the round trip checks a real rule."""
    from fsm_agent.models import OpenAIResponsesModel

    names = ("reasoning_call", "reasoning_second_call", "final_answer", "final_answer")
    server.queue(*(body("openai_responses", name) for name in names))
    with OpenAIResponsesModel("o4-mini", api_key=KEY, base_url=server.url + "/v1", max_retries=0) as m:
        agent = Agent(m, demo_registry())
        first = agent.run(QUESTION)
        stripped = [Message(x.role, x.content, x.tool_calls, x.tool_call_id) for x in first.messages]
        stop = _outcome(lambda: agent.run(FOLLOW_UP, history=stripped))
    assert stop.reason == "model_error"
    assert "without its required 'reasoning' item" in stop.evidence["error"]


def test_gemini_gets_the_earlier_turns_signed_parts_back(server: ProviderServer) -> None:
    """The model turns of the earlier run, thought signatures included, go back as sent before, then the question."""
    from fsm_agent.models import GeminiModel

    names = ("thought_call", "thought_second_call", "final_answer", "final_answer")
    server.queue(*(body("gemini", name) for name in names))
    with GeminiModel("gemini-2.5-flash", api_key=KEY, base_url=server.url, max_retries=0) as m:
        first, second = _two_runs(Agent(m, demo_registry(), "Be terse."))
    assert second.ok
    assert second.prior == len(first.messages)
    earlier, sent = server.requests[2].json, server.requests[3].json
    assert sent["contents"][: len(earlier["contents"])] == earlier["contents"]
    assert [c["role"] for c in sent["contents"][len(earlier["contents"]) :]] == ["model", "user"]
    assert sent["contents"][-1]["parts"] == [{"text": FOLLOW_UP}]
    final_parts = sent["contents"][-2]["parts"]
    served = body("gemini", "final_answer")["candidates"][0]["content"]["parts"]
    assert [p["text"] for p in final_parts] == [p["text"] for p in served]
    signatures = [base64.urlsafe_b64decode(p["thoughtSignature"]) for p in final_parts]
    assert signatures == [base64.b64decode(p["thoughtSignature"]) for p in served]


def test_openai_chat_gets_the_earlier_tool_turn_and_answer_back(server: ProviderServer) -> None:
    """Chat Completions has no opaque content: the calls, their results and the answer go back as messages."""
    from fsm_agent.models import OpenAIChatModel

    names = ("tool_call", "final_answer", "final_answer")
    server.queue(*(body("openai", name) for name in names))
    with OpenAIChatModel("gpt-4o-mini", api_key=KEY, base_url=f"{server.url}/v1", max_retries=0) as m:
        first, second = _two_runs(Agent(m, demo_registry(), "Be terse."))
    assert second.ok
    assert second.prior == len(first.messages)
    earlier, sent = server.requests[1].json, server.requests[2].json
    assert sent["messages"] == [
        *earlier["messages"],
        {"role": "assistant", "content": "(2+3)*4 = 20"},
        {"role": "user", "content": FOLLOW_UP},
    ]
    assert [m["role"] for m in sent["messages"]] == ["system", "user", "assistant", "tool", "assistant", "user"]


# --- what a history processor may send ------------------------------------------------------------------


@pytest.mark.parametrize("driver", ["sync", "async"])
@pytest.mark.parametrize(
    "processor",
    [
        lambda messages: [m for m in messages if m.role != "user"],
        lambda messages: [Message("assistant", "I remember nothing.")],
    ],
    ids=["drops_the_question", "only_the_models_turn"],
)
def test_a_processor_that_leaves_no_user_message_stops_the_run_with_model_error(processor: Any, driver: str) -> None:
    """A processed history without a user message is a model_error naming the processor; the model is not called."""
    model = FakeModel(reply("never"))
    agent = _agent(model, history_processors=[processor])
    with pytest.raises(AgentLoopError) as caught:
        agent.run(AGAIN, history=EARLIER) if driver == "sync" else asyncio.run(agent.arun(AGAIN, history=EARLIER))
    assert caught.value.reason == "model_error"
    assert "history processor <lambda> returned a history without a user message" in str(caught.value.__cause__)
    assert model.seen == []
