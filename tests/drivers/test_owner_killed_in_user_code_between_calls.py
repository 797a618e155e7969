"""An owner process SIGKILLed in a history processor, an output validator or `compact` is taken over, each call once.

Why it must hold: docs/concepts/exactly-once.md promises that "No completed
model or tool call is made again" (only "the call in flight when a process
dies may be made again"), and that the lease's heartbeat "also runs while
the run waits on user code between its calls: history processors, output
validators and `compact`".  docs/how-to/long-runs.md: "Processors should be
pure: a resumed run runs them again for the call it makes", and a store
writes a compaction "as soon as `compact` returns, before the call it
shortens: a process that dies in that call does not compact again on
resume".  docs/how-to/typed-answers.md: validators run with the lease
renewed, "as during a model call".

The owner is a real child process (``support.killed_owners``).  The user
code under test (a processor, a validator or ``compact``; once, the model
call a compaction shortened) writes a marker file when it runs for the
answer and holds there; the test SIGKILLs the process then, and takes the
run over on the other driver.  Every model call, tool call and piece of
user code, in either process, is a line in one file (``Tally``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from support.exactly_once import LEASE, resumed_by_new_owner
from support.exactly_once_audit import Tally, drive
from support.killed_owners import (
    DRIVERS,
    EACH_TOOL_ONCE,
    FINAL,
    RUN,
    ahold,
    hold,
    kill_when,
    other_driver,
    phase,
    tool_counts,
)
from support.store_cases import child_process

from fsm_agent import Agent, ContextOverflowError, Message, ModelResponse, Retry, RunResult, ToolRegistry
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

pytestmark = pytest.mark.subprocess

WINDOW = 3
"""The compaction agent's model overflows when sent more messages than this: the answer's call (4 messages)."""
DOUBTFUL = "maybe: a ok, b ok?"
"""The doubting model's first answer, which the validator sends back (``Retry``); it answers ``FINAL`` then."""


class Scripted:
    """Asks for ``work`` a and b in one reply, then answers with both results; overflows past ``window`` messages.
    ``doubting``: answers ``DOUBTFUL`` first, and ``FINAL`` once that answer was sent back (a ``retry`` call).
    ``held``: the answer's call is held there (in flight until the test kills its process)."""

    def __init__(
        self, tally: Tally, window: int | None = None, *, doubting: bool = False, held: Held | None = None
    ) -> None:
        self.tally, self.window, self.doubting, self.held = tally, window, doubting, held

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        if self.window is not None and len(messages) > self.window:
            self.tally.add("model overflow")
            raise ContextOverflowError("prompt is too long", tokens=len(messages), limit=self.window)
        call = phase(messages)
        if self.doubting and call == "answer":
            call = "retry" if any("not accepted" in m.content for m in messages if m.role == "user") else "doubt"
        self.tally.add(f"model {call}")
        if self.held is not None and call == "answer" and self.held.arrived("held answer", answer=True):
            hold()
        if call == "ask":
            return tool_turn(tool_call("work", id="a", label="a"), tool_call("work", id="b", label="b"))
        return reply(DOUBTFUL if call == "doubt" else FINAL)


class Held:
    """The user code under test: counted in ``tally`` each time it runs; with ``marker``, it writes that file when it
    runs for the answer (a validator: for the answer ``held``, any if None) and then holds (until the test kills its
    process).  The validator sends ``DOUBTFUL`` back."""

    def __init__(self, tally: Tally, marker: Path | None, held: str | None = None) -> None:
        self.tally, self.marker, self.held = tally, marker, held

    def arrived(self, line: str, answer: bool) -> bool:
        self.tally.add(line)
        if self.marker is None or not answer:
            return False
        self.marker.write_text(line, encoding="utf-8")
        return True

    def process(self, messages: list[Message]) -> list[Message]:
        if self.arrived(f"processor {phase(messages)}", phase(messages) == "answer"):
            hold()
        return messages

    async def aprocess(self, messages: list[Message]) -> list[Message]:
        if self.arrived(f"processor {phase(messages)}", phase(messages) == "answer"):
            await ahold()
        return messages

    def validate(self, answer: str) -> str:
        if self.arrived(f"validator {answer}", self.held in (None, answer)):
            hold()
        return _checked(answer)

    async def avalidate(self, answer: str) -> str:
        if self.arrived(f"validator {answer}", self.held in (None, answer)):
            await ahold()
        return _checked(answer)

    def compact(self, messages: list[Message]) -> list[Message]:
        if self.arrived(f"compact {len(messages)}", answer=True):
            hold()
        return _summary(messages)

    async def acompact(self, messages: list[Message]) -> list[Message]:
        if self.arrived(f"compact {len(messages)}", answer=True):
            await ahold()
        return _summary(messages)


def _checked(answer: str) -> str:
    if answer == DOUBTFUL:
        raise Retry("be sure")
    return answer


def _summary(messages: list[Message]) -> list[Message]:
    return [Message("user", "summary: " + " ".join(m.content for m in messages if m.role == "tool"))]


def make_agent(
    part: str, driver: str, tally: Tally, marker: Path | None = None, *, doubted: str | None = None, call: bool = False
) -> Agent:
    """The agent whose ``part`` (``processor``, ``validator``, ``compact``) is held with ``marker``; async user code on
    the ``async`` driver.  ``doubted``: the model doubts (``DOUBTFUL`` first) and the validator is held on that
    answer only; ``call``: the answer's model call is held instead of ``part``."""
    tools = ToolRegistry()

    @tools.register
    def work(label: str) -> str:
        """One side effect, counted."""
        tally.add(f"try {label}")
        tally.add(f"done {label}")
        return f"{label} ok"

    held = Held(tally, None if call else marker, doubted)
    awaited = driver == "async"
    options: dict[str, Any] = {}
    if part == "processor":
        options["history_processors"] = [held.aprocess if awaited else held.process]
    elif part == "validator":
        options.update(output_type=str, output_validators=[held.avalidate if awaited else held.validate])
    else:
        options.update(on_stop={"context_overflow": "compact"}, compact=held.acompact if awaited else held.compact)
    window = WINDOW if part == "compact" else None
    model = Scripted(tally, window, doubting=doubted is not None, held=Held(tally, marker) if call else None)
    return Agent(model, tools, max_concurrency=2, output_retries=1, **options)


def _owner(target: str, part: str, driver: str, tally: str, marker: str, held: dict[str, Any]) -> None:
    """The child process: run ``RUN`` on ``driver`` until the held part holds, where the test kills it."""
    drive(make_agent(part, driver, Tally(tally), Path(marker), **held), driver, open_store(target, lease=LEASE), RUN)
    raise AssertionError(f"the run ended although its {part} was held")


def kill_inside(target: str, part: str, driver: str, folder: Path, **held: Any) -> None:
    """Run the owner in a child process and SIGKILL it once its ``part`` (``held`` as ``make_agent`` takes it) runs
    for the answer."""
    marker = folder / "inside"
    owner = child_process(_owner, target, part, driver, str(folder / "tally"), str(marker), held)
    kill_when(owner, marker.exists, f"into its {part}")


def take_over(target: str, part: str, driver: str, tally: Tally, *, doubted: str | None = None) -> RunResult:
    """A new owner here (a new agent and store object) takes the run over on ``driver`` once the lease lapsed."""
    return resumed_by_new_owner(target, RUN, driver, make_agent(part, driver, tally, doubted=doubted))


def _assert_whole(result: RunResult) -> None:
    """Every message of the run kept: the question, the batch, both results in order, the answer."""
    assert result.final == FINAL
    assert [m.role for m in result.messages] == ["user", "assistant", "tool", "tool", "assistant"]
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["a", "b"]
    assert [m.content for m in result.messages if m.role == "tool"] == ['"a ok"', '"b ok"']


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_owner_killed_in_a_history_processor_is_resumed_running_it_again_and_each_call_once(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """Nothing was in flight: each model and tool call is made once; the processor, pure, runs again for its call."""
    tally = Tally(tmp_path / "tally")
    kill_inside(store_target, "processor", driver, tmp_path)
    result = take_over(store_target, "processor", other_driver(driver), tally)
    _assert_whole(result)
    assert tally.counts("model") == {"ask": 1, "answer": 1}
    assert tally.counts("processor") == {"ask": 1, "answer": 2}
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_owner_killed_in_an_output_validator_is_resumed_checking_the_kept_answer_without_asking_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The answer's call had returned and was written: the new owner checks that answer, the model is not asked."""
    tally = Tally(tmp_path / "tally")
    kill_inside(store_target, "validator", driver, tmp_path)
    result = take_over(store_target, "validator", other_driver(driver), tally)
    _assert_whole(result)
    assert result.output == FINAL
    assert tally.counts("model") == {"ask": 1, "answer": 1}
    assert tally.counts("validator") == {FINAL: 2}
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("held", [DOUBTFUL, FINAL], ids=["the answer sent back", "the answer after the retry"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_an_owner_killed_in_a_validator_around_a_retry_spends_the_one_retry_once_and_asks_each_answer_once(
    store_target: str, tmp_path: Path, driver: str, held: str
) -> None:
    """Killed while the answer to be sent back is checked, or the answer after the retry: the new owner checks the
    kept answer again, and the run's one retry (``output_retries=1``) is spent once, so the run ends ``Done``."""
    tally = Tally(tmp_path / "tally")
    kill_inside(store_target, "validator", driver, tmp_path, doubted=held)
    result = take_over(store_target, "validator", other_driver(driver), tally, doubted=held)
    assert (result.reason, result.output) == ("done", FINAL)
    assert [m.content for m in result.messages if m.role == "assistant"][1:] == [DOUBTFUL, FINAL]
    assert [m.tool_call_id for m in result.messages if m.role == "tool"] == ["a", "b"]
    assert tally.counts("model") == {"ask": 1, "doubt": 1, "retry": 1}
    assert tally.counts("validator") == {DOUBTFUL: 2 if held == DOUBTFUL else 1, FINAL: 2 if held == FINAL else 1}
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_owner_killed_in_compact_is_resumed_compacting_again_without_repeating_the_overflowed_call(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The overflowing call had returned (its overflow is the run's): the new owner compacts and asks once."""
    tally = Tally(tmp_path / "tally")
    kill_inside(store_target, "compact", driver, tmp_path)
    result = take_over(store_target, "compact", other_driver(driver), tally)
    _assert_whole(result)
    assert tally.counts("model") == {"ask": 1, "overflow": 1, "answer": 1}
    assert tally.counts("compact") == {"4": 2}
    assert [step.kind for step in result.steps].count("compaction") == 1
    assert tool_counts(tally) == EACH_TOOL_ONCE


@pytest.mark.parametrize("driver", DRIVERS)
def test_an_owner_killed_in_the_call_its_compaction_shortened_is_resumed_without_compacting_again(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """long-runs.md: the compaction is written before the call it shortens, so a process that dies in that call does
    not compact again; that call, in flight, is made again, once."""
    tally = Tally(tmp_path / "tally")
    kill_inside(store_target, "compact", driver, tmp_path, call=True)
    result = take_over(store_target, "compact", other_driver(driver), tally)
    _assert_whole(result)
    assert tally.counts("model") == {"ask": 1, "overflow": 1, "answer": 2}
    assert tally.counts("compact") == {"4": 1}
    assert tool_counts(tally) == EACH_TOOL_ONCE
