"""A session's turn that stopped on its typed answer (``output_invalid``) tells the next turn the answer was refused.

The turn keeps the rejected answer, as every turn keeps what the model
said; without a word after it, the next turn's model read it as an answer
that was accepted.  The conversation now closes such a turn with the
message a retry begins with (the check's errors), in the session object, in
one reopened over its store, on both drivers; a retry a cancel forbade the
same way.  Nothing is called again: the tool and model calls are counted.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from pydantic import BaseModel

from fsm_agent import Agent, AgentLoopError, CancelToken, Message, Retry, Session, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

REFUSED = "Your final answer was not accepted:\n- celsius: Field required"
IMPLAUSIBLE = "Your final answer was not accepted:\n- 99 C is not plausible"


class Weather(BaseModel):
    city: str
    celsius: int


def _registry(made: list[str]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def look(city: str) -> str:
        """Look the weather up (counted)."""
        made.append(city)
        return f"{city}: 21 C"

    return registry


def _script() -> FakeModel:
    return FakeModel(
        tool_turn(tool_call("look", id="c1", city="Oslo")),
        reply('{"city": "Oslo"}'),  # refused: no celsius
        reply('{"city": "Oslo", "celsius": 21}'),
    )


def _said(messages: Any) -> list[tuple[str, str]]:
    return [(message.role, message.content) for message in messages if message.role != "system"]


def _turn(chat: Session, text: str, driver: str, **options: Any) -> Any:
    if driver == "async":
        return asyncio.run(chat.arun(text, **options))
    return chat.run(text, **options)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_next_turn_sends_the_refusal_after_the_refused_answer(driver: str) -> None:
    made: list[str] = []
    model = _script()
    chat = Session(Agent(model, _registry(made), output_type=Weather, output_retries=0))
    with pytest.raises(AgentLoopError) as stop:
        _turn(chat, "Weather in Oslo?", driver)
    assert stop.value.reason == "output_invalid"
    assert _said(chat.messages)[-2:] == [("assistant", '{"city": "Oslo"}'), ("user", REFUSED)]
    answer = _turn(chat, "And in degrees?", driver)
    assert answer.output == Weather(city="Oslo", celsius=21)
    sent = _said(model.seen[-1])
    assert sent[-3:] == [("assistant", '{"city": "Oslo"}'), ("user", REFUSED), ("user", "And in degrees?")]
    assert (made, len(model.seen)) == (["Oslo"], 3)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_session_reopened_over_its_store_reads_the_refusal_too(store_target: str, driver: str) -> None:
    made: list[str] = []
    model = _script()
    agent = Agent(model, _registry(made), output_type=Weather, output_retries=0)
    with open_store(store_target) as store:
        with pytest.raises(AgentLoopError):
            _turn(Session(agent, store, "weather"), "Weather in Oslo?", driver)
        reopened = Session(agent, store, "weather")
        assert _said(reopened.messages) == [
            ("user", "Weather in Oslo?"),
            ("assistant", ""),
            ("tool", '"Oslo: 21 C"'),
            ("assistant", '{"city": "Oslo"}'),
            ("user", REFUSED),
        ]
        _turn(reopened, "And in degrees?", driver)
        stored = store.load("weather/1")
    assert _said(model.seen[-1])[-2:] == [("user", REFUSED), ("user", "And in degrees?")]
    assert [m["content"] for m in stored["messages"]][-1] == '{"city": "Oslo"}'  # the run itself is as it ended
    assert (made, len(model.seen)) == (["Oslo"], 3)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_retry_a_cancel_forbade_is_told_as_refused_to_the_next_turn(store_target: str, driver: str) -> None:
    made: list[str] = []
    token = CancelToken()

    def press_stop(weather: Weather) -> Weather:
        if weather.celsius > 60:
            token.cancel("the user pressed Stop")  # while the answer is checked: the retry is forbidden
            raise Retry("99 C is not plausible")
        return weather

    model = FakeModel(
        tool_turn(tool_call("look", id="c1", city="Oslo")),
        reply('{"city": "Oslo", "celsius": 99}'),
        reply('{"city": "Oslo", "celsius": 21}'),
    )
    agent = Agent(model, _registry(made), output_type=Weather, output_validators=[press_stop])
    with open_store(store_target) as store:
        with pytest.raises(AgentLoopError) as stop:
            _turn(Session(agent, store, "weather"), "Weather in Oslo?", driver, cancel=token, request_id="r1")
        assert (stop.value.reason, stop.value.evidence["blocked_by"]) == ("output_invalid", "cancelled")
        reopened = Session(agent, store, "weather")
        assert _said(reopened.messages)[-1] == ("user", IMPLAUSIBLE)
        again = _turn(reopened, "Weather in Oslo?", driver, request_id="r1")  # the cancelled request takes a turn
    assert again.output == Weather(city="Oslo", celsius=21)
    assert _said(model.seen[-1])[-2:] == [("user", IMPLAUSIBLE), ("user", "Weather in Oslo?")]
    assert (made, len(model.seen), reopened.turns) == (["Oslo"], 3, 2)


def test_an_accepted_answer_is_followed_by_no_refusal() -> None:
    model = FakeModel(reply('{"city": "Oslo", "celsius": 21}'), reply('{"city": "Bergen", "celsius": 12}'))
    chat = Session(Agent(model, ToolRegistry(), output_type=Weather))
    chat.run("Weather in Oslo?")
    chat.run("And Bergen?")
    assert [role for role, _ in _said(model.seen[-1])] == ["user", "assistant", "user"]
    assert not any(isinstance(m, Message) and m.content.startswith("Your final") for m in chat.messages)
