"""The mistakes a newcomer makes in their first hour with ``Agent``, ``ToolRegistry`` and ``fsm_agent.run``.

Each is refused with an error that names what is wrong and how to put it
right, when the agent or the tool is built (or, for what only a run can
see, before the model is called), and leaves nothing half-done: no store
row, no tool call.
"""

from __future__ import annotations

import asyncio
import datetime
import functools
import gc
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.newcomer import Weather, asks_for_weather

import fsm_agent
from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, SqliteStore, StopCondition, ToolRegistry
from fsm_agent.persist import StoreError
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

# --- the model ------------------------------------------------------------------------------------------------


def test_a_model_class_instead_of_an_instance_is_refused_at_construction() -> None:
    """``Agent(FakeModel, tools)`` (the class, parentheses forgotten) is a TypeError saying to pass an instance."""
    with pytest.raises(TypeError, match=r"FakeModel\(\)"):
        Agent(FakeModel, Weather().registry)  # type: ignore[arg-type]


class AsyncComplete:
    """A model whose ``complete`` is ``async def``: the async method is called ``acomplete``."""

    async def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        return reply("hi")


def test_an_async_def_complete_is_refused_at_construction_naming_acomplete() -> None:
    """``async def complete`` is a TypeError at construction saying to name it ``acomplete``, not a model_error."""
    with pytest.raises(TypeError, match="acomplete"):
        Agent(AsyncComplete(), [])  # type: ignore[arg-type]


class AsyncOnly:
    """A model with ``acomplete`` alone: it serves ``arun``, not ``run``."""

    async def acomplete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        return reply("hi")


def test_an_async_only_model_on_the_sync_run_is_refused_before_the_run_is_stored(tmp_path: Path) -> None:
    """``run`` with a model that has only ``acomplete``: a TypeError saying to use ``arun``; no run stored.

    Unchecked, the run would start, be written to the store, and stop with
    ``model_error``: "'AsyncOnly' object has no attribute 'complete'".
    """
    with SqliteStore(tmp_path / "runs.db") as store:
        with pytest.raises(TypeError, match=r"arun"):
            Agent(AsyncOnly(), []).run("hi", store=store, run_id="r1")  # type: ignore[arg-type]
        assert store.list_runs() == []


class NoToolsParameter:
    """A model whose ``complete`` forgot the ``tools`` parameter."""

    def complete(self, messages: Sequence[Message]) -> ModelResponse:
        return reply("hi")


def test_a_complete_without_the_tools_parameter_stops_the_run_with_python_s_own_message() -> None:
    """``def complete(self, messages)`` is not read when the agent is built (that costs more than the agent).

    The first model call tells it: a ``model_error`` stop whose evidence is Python's message.
    """
    with pytest.raises(AgentLoopError) as stopped:
        Agent(NoToolsParameter(), []).run("hi")  # type: ignore[arg-type]
    assert stopped.value.reason == "model_error"
    assert "complete() takes 2 positional arguments but 3 were given" in str(stopped.value.result.evidence["error"])


def _answer(text: str, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
    return reply(text)


class DynamicModel:
    """A model whose ``complete`` is found by ``__getattr__``, as a proxy's is."""

    def __getattr__(self, name: str) -> Any:
        if name == "complete":
            return functools.partial(_answer, "hi")
        raise AttributeError(name)


class PartialModel:
    """A model whose ``complete`` is a ``functools.partial`` set on the instance."""

    def __init__(self) -> None:
        self.complete = functools.partial(_answer, "hi")


class BothModel(AsyncOnly):
    """A model with a plain ``complete`` beside its ``acomplete``: ``run`` calls one, ``arun`` the other."""

    def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        return reply("hi")


class StaticModel:
    """A class that is a model as it is: its ``complete`` is a staticmethod."""

    @staticmethod
    def complete(messages: Sequence[Message], tools: list[dict[str, Any]]) -> ModelResponse:
        return reply("hi")


@pytest.mark.parametrize(
    "model", [DynamicModel(), PartialModel(), BothModel(), StaticModel], ids=["getattr", "partial", "both", "static"]
)
def test_a_model_the_drivers_can_call_is_taken_as_it_is(model: Any) -> None:
    """The model checks refuse only what the drivers cannot call: each of these runs, sync and async."""
    assert Agent(model, []).run("hi").final == "hi"
    assert asyncio.run(Agent(model, []).arun("hi")).final == "hi"


def test_an_async_only_model_is_run_by_arun_and_by_start_driven_async() -> None:
    """Only the sync ``run`` and ``stream`` are refused: ``start`` may be driven by ``aadvance``, as ``arun`` is."""
    assert asyncio.run(Agent(AsyncOnly(), []).arun("hi")).final == "hi"  # type: ignore[arg-type]
    run = Agent(AsyncOnly(), []).start("hi")  # type: ignore[arg-type]
    assert asyncio.run(run.afinish()).final == "hi"
    with pytest.raises(TypeError, match=r"astream"):
        next(Agent(AsyncOnly(), []).stream("hi"))  # type: ignore[arg-type]


class TextModel:
    """A model that returns the text itself instead of a ModelResponse."""

    def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> Any:
        return "21 degrees."


class DictModel:
    """A model that returns the provider's JSON instead of a ModelResponse."""

    def complete(self, messages: Sequence[Message], tools: list[dict[str, Any]]) -> Any:
        return {"role": "assistant", "content": "21 degrees."}


@pytest.mark.parametrize(("model", "kind"), [(TextModel(), "str"), (DictModel(), "dict")])
def test_a_model_returning_no_model_response_stops_naming_what_it_returned(model: Any, kind: str) -> None:
    """A str or a dict from ``complete`` stops the run with ``model_error`` saying what came back and what is wanted."""
    weather = Weather()
    with pytest.raises(AgentLoopError) as stop:
        Agent(model, weather.registry).run("Weather in Paris?")
    assert stop.value.reason == "model_error"
    assert stop.value.evidence["error"] == f"model returned {kind}, expected ModelResponse"
    assert weather.calls == 0


# --- the tools ------------------------------------------------------------------------------------------------


class Forecasts:
    """A newcomer's class of tools."""

    def forecast(self, city: str) -> str:
        """Tomorrow's weather for a city."""
        return f"sunny in {city}"


def test_a_method_taken_from_the_class_is_refused_instead_of_asking_the_model_for_self() -> None:
    """``register(Forecasts.forecast)``: a TypeError naming ``self`` and the bound method to register instead.

    Unchecked, ``self`` becomes a required parameter of the schema the model is
    shown, and every call the model makes without it fails.
    """
    with pytest.raises(TypeError, match=r"self.*bound|bound.*self"):
        ToolRegistry().register(Forecasts.forecast)


def test_a_bound_method_registers_without_self() -> None:
    """``register(Forecasts().forecast)`` is the right way: ``self`` is not shown to the model."""
    tools = ToolRegistry()
    tools.register(Forecasts().forecast)
    parameters = tools.schemas()[0]["parameters"]
    assert parameters["properties"] == {"city": {"type": "string"}}
    assert parameters["required"] == ["city"]


def test_register_called_on_the_class_is_refused() -> None:
    """``@ToolRegistry.register`` (no registry made): a TypeError saying to make one; not a silent no-op.

    Unchecked, it returns a lambda in place of the function, and no tool is registered anywhere.
    """

    def weather(city: str) -> str:
        """Current weather for a city."""
        return city

    with pytest.raises(TypeError, match=r"ToolRegistry\(\)"):
        ToolRegistry.register(weather)  # type: ignore[call-overload]


def test_register_given_the_name_positionally_points_to_the_name_keyword() -> None:
    """``@tools.register("weather")``: the TypeError says the name goes in ``name=``."""
    with pytest.raises(TypeError, match=r"name="):
        ToolRegistry().register("weather")  # type: ignore[call-overload]


def test_a_list_given_to_tool_registry_says_how_to_register_them() -> None:
    """``ToolRegistry([weather])``: a TypeError saying ``tools.register(f)`` or ``Agent(model, [f])``."""

    def weather(city: str) -> str:
        """Current weather for a city."""
        return city

    with pytest.raises(TypeError, match=r"register\("):
        ToolRegistry([weather])  # type: ignore[call-arg, arg-type]


def test_two_tools_of_one_name_say_how_to_rename_one() -> None:
    """Two functions both called ``search``: the ValueError says to give one another name with ``name=``."""

    def search(query: str) -> str:
        """Search the web."""
        return query

    def search_docs(query: str) -> str:
        """Search the docs."""
        return query

    search_docs.__name__ = "search"  # as two modules' `search` functions would be
    with pytest.raises(ValueError, match=r"'search'.*name="):
        Agent(FakeModel(), [search, search_docs])


def test_star_args_are_refused_naming_the_parameter() -> None:
    """``def tool(*args)``: a TypeError naming the tool and the parameter when it is registered."""

    def anything(*args: str) -> str:
        """Anything."""
        return ",".join(args)

    with pytest.raises(TypeError, match=r"tool 'anything', parameter 'args': tools are called with keyword"):
        ToolRegistry().register(anything)


def test_a_lambda_is_refused_with_the_name_keyword_to_use() -> None:
    """A lambda has no usable name: the ValueError names ``<lambda>`` and says to pass ``name=``."""
    with pytest.raises(ValueError, match=r"'<lambda>'.*pass name="):
        ToolRegistry().register(lambda city: city)


def test_one_function_instead_of_a_list_is_a_type_error_naming_what_is_wanted() -> None:
    """``Agent(model, weather)``: a TypeError saying a registry or a list of functions is wanted."""

    def weather(city: str) -> str:
        """Current weather for a city."""
        return city

    with pytest.raises(TypeError, match="registry must be a ToolRegistry or a list of functions, got function"):
        Agent(FakeModel(), weather)  # type: ignore[arg-type]


def test_a_tool_returning_no_json_is_a_failed_call_naming_the_type() -> None:
    """A tool returning a ``date``: the model is told the value cannot be encoded, and of what type; the run goes on."""
    tools = ToolRegistry()

    @tools.register
    def today() -> datetime.date:
        """Today's date."""
        return datetime.date(2024, 1, 1)

    model = FakeModel(tool_turn(tool_call("today", id="t1")), reply("It is 1 January."))
    result = Agent(model, tools).run("What day is it?")
    assert result.final == "It is 1 January."
    told = result.messages[2].content
    assert "tool 'today' returned a value that cannot be encoded as JSON" in told
    assert "date" in told


# --- the agent's arguments ------------------------------------------------------------------------------------


def test_on_stop_that_is_no_mapping_is_a_type_error_naming_on_stop() -> None:
    """``on_stop="return"``: a TypeError naming ``on_stop`` and the mapping it takes, not an AttributeError."""
    with pytest.raises(TypeError, match="on_stop"):
        Agent(FakeModel(), [], on_stop="return")  # type: ignore[arg-type]


def test_one_stop_condition_outside_a_list_is_a_type_error_naming_stop_conditions() -> None:
    """``stop_conditions=cond`` (no list): a TypeError naming ``stop_conditions`` and the list it takes."""

    def never(view: fsm_agent.RunView) -> bool:
        """Never stops."""
        return False

    with pytest.raises(TypeError, match="stop_conditions"):
        Agent(FakeModel(), [], stop_conditions=StopCondition("never", "Dispatch", never))  # type: ignore[arg-type]


INTEGER_LIMITS = [
    (name, value)
    for name in ("max_steps", "max_consecutive_failures", "token_budget", "cycle_window")
    for value in ("5", True, 2.5, 5.0, None)
    if not (name == "token_budget" and value is None)  # no budget
]


@pytest.mark.parametrize(("name", "value"), INTEGER_LIMITS)
def test_an_integer_limit_of_another_type_is_refused_naming_it(name: str, value: Any) -> None:
    """A limit given as "5", True, 2.5, 5.0 or None is a ValueError naming the limit and the value, when built."""
    with pytest.raises(ValueError, match=rf"^{name} must be .*got {value!r}$"):
        Agent(FakeModel(), [], **{name: value})


@pytest.mark.parametrize("value", ["5", True, 0, -1, float("nan")])
def test_a_timeout_that_is_no_positive_number_is_refused_naming_it(value: object) -> None:
    """``timeout="5"``, True, 0, -1 or NaN: a ValueError naming timeout, when built."""
    with pytest.raises(ValueError, match=r"^timeout must be a finite number of seconds > 0"):
        Agent(FakeModel(), [], timeout=value)  # type: ignore[arg-type]


# --- the question, the store, a finished run -----------------------------------------------------------------


@pytest.mark.parametrize("question", [42, None, ["Weather in Paris?"], b"Weather in Paris?"])
def test_a_question_that_is_no_str_is_refused_before_the_model_is_asked(question: object) -> None:
    """``fsm_agent.run(model, tools, 42)``: a TypeError naming the input and its type; no model call, no tool call."""
    weather, model = Weather(), asks_for_weather()
    with pytest.raises(TypeError, match=rf"user_input must be a str, got {type(question).__name__}"):
        fsm_agent.run(model, weather.registry, question)  # type: ignore[arg-type]
    assert model.seen == []
    assert weather.calls == 0


def test_a_store_in_a_missing_directory_names_the_directory(tmp_path: Path) -> None:
    """``store="nope/runs.db"`` where ``nope`` does not exist: the StoreError says the directory does not exist.

    Not SQLite's "unable to open database file", which does not say why.
    """
    model = asks_for_weather()
    with pytest.raises(StoreError, match=r"nope.*does not exist|does not exist.*nope"):
        Agent(model, Weather().registry).run("hi", store=str(tmp_path / "nope" / "runs.db"))
    assert model.seen == []


def test_a_store_in_a_missing_directory_is_refused_before_the_model_is_asked(tmp_path: Path) -> None:
    """Whatever its words, the refusal comes before the model or a tool is called, and creates no directory."""
    weather, model = Weather(), asks_for_weather()
    with pytest.raises(StoreError, match="cannot be used as a run store"):
        Agent(model, weather.registry).run("hi", store=str(tmp_path / "nope" / "runs.db"))
    assert (model.seen, weather.calls) == ([], 0)
    assert not (tmp_path / "nope").exists()


def test_an_empty_store_path_is_refused_as_empty(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """``store=""`` (an unset setting): an error saying the path is empty, not blaming the working directory."""
    monkeypatch.chdir(tmp_path)
    model = FakeModel(reply("hi"))
    with pytest.raises((ValueError, StoreError)) as refused:
        Agent(model, []).run("hi", store="")
    assert "empty" in str(refused.value).replace(str(tmp_path), "<cwd>")
    assert model.seen == []
    assert list(tmp_path.iterdir()) == []


def test_a_store_url_of_an_unknown_scheme_is_refused_before_the_model_is_asked(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``store="sqlite:///runs.db"`` (SQLAlchemy's form): a StoreError naming the kinds; no file, no model call."""
    monkeypatch.chdir(tmp_path)
    model = FakeModel(reply("hi"))
    with pytest.raises(StoreError, match=r"sqlite:// is not a kind of store.*a SQLite file's path"):
        Agent(model, []).run("hi", store="sqlite:///runs.db")
    assert model.seen == []
    assert list(tmp_path.iterdir()) == []


def test_resuming_a_run_that_finished_says_only_stopped_runs_resume() -> None:
    """``agent.resume(result)`` of a ``done`` result: a ValueError saying only stopped or paused runs resume."""
    agent = Agent(FakeModel(reply("hi")), [])
    done = agent.run("hi")
    attempts: list[Callable[[], object]] = [lambda: agent.resume(done), lambda: asyncio.run(agent.aresume(done))]
    for resume in attempts:
        with pytest.raises(ValueError, match="reason 'done' has no snapshot: only stopped or paused runs resume"):
            resume()


def test_resuming_a_stored_run_that_finished_leaves_it_as_it_was(tmp_path: Path) -> None:
    """The stored snapshot of a finished run: a ValueError saying there is nothing to resume; the store unchanged."""
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(FakeModel(reply("hi")), []).run("hi", store=store, run_id="r1")
        before = store.load("r1")
        model = FakeModel(reply("again"))
        with pytest.raises(ValueError, match="the run finished in Done; there is nothing to resume"):
            Agent(model, []).resume(before, store=store)
        assert store.load("r1")["stored_seq"] == before["stored_seq"]
    assert model.seen == []


# --- forgetting await -----------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:coroutine 'Agent.arun' was never awaited:RuntimeWarning")
def test_arun_without_await_calls_nothing() -> None:
    """``agent.arun(q)`` not awaited is a coroutine: Python's error, and the model and the tools untouched."""
    weather, model = Weather(), asks_for_weather()
    pending = Agent(model, weather.registry).arun("Weather in Paris?")
    assert asyncio.iscoroutine(pending)
    pending.close()
    gc.collect()
    assert (model.seen, weather.calls) == ([], 0)
