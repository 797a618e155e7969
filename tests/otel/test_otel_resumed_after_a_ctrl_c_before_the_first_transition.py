"""A run cut by a Ctrl-C inside its first model call, before any transition, is marked resumed when resumed.

The run is written by the Ctrl-C (its store's first write already holds it)
and resumed by a new agent, as another process would: the resumed run's
first event is the ``before_model`` of turn 1 again, the same event a fresh
run starts with, so only the call event can say the run did not start there
(``CallEvent.resumed``).  A run cut later is the comparison: its resumed span
was always marked.  Real SDK spans (``support.spans``), both drivers.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from support.counted_calls import finish
from support.sdk import skip_unless_installed
from support.spans import Spans, attributes

from fsm_agent import Agent, CallEvent, SqliteStore
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

DRIVERS = ["sync", "async"]


def _cut_then_resumed(spans: Spans, tmp_path: Path, driver: str, first: list[Any]) -> tuple[int, list[CallEvent]]:
    """``first`` (its model cut by a Ctrl-C) is resumed by a new agent; the transitions taken before the cut, and the
    ``before_model`` events the new agent heard."""
    from fsm_agent.otel import instrument

    cut_agent = Agent(FakeModel(*first), demo_registry())
    instrument(cut_agent, spans.provider)
    with SqliteStore(tmp_path / "runs.db", lease=0.5) as store:
        run = cut_agent.start("q", store=store, run_id="r1")
        with pytest.raises(KeyboardInterrupt):
            finish(run, driver)
        stored = store.load("r1")
        # the cut owner's lease is given up, as it lapses once that process is gone
        store.renew("r1", owner=run._journal.owner, seq=stored["stored_seq"], release=True)  # type: ignore[union-attr]
        new = Agent(FakeModel(reply("ok")), demo_registry())
        instrument(new, spans.provider)
        heard: list[CallEvent] = []
        new.on("before_model", heard.append)
        result = finish(new.resume(store.load("r1"), store=store), driver)
    assert result.final == "ok"
    return len(run.trace), heard


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_cut_in_its_first_model_call_is_marked_resumed_when_resumed(
    spans: Spans, tmp_path: Path, driver: str
) -> None:
    taken, _ = _cut_then_resumed(spans, tmp_path, driver, [KeyboardInterrupt()])
    assert taken == 0  # cut before its first transition
    cut, resumed = spans.named("invoke_agent")
    assert attributes(cut).get("fsm_agent.unfinished") is True
    assert "fsm_agent.resumed" not in attributes(cut)
    assert attributes(resumed).get("fsm_agent.resumed") is True
    assert attributes(resumed)["gen_ai.conversation.id"] == "r1"


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_cut_in_a_later_model_call_is_marked_resumed_as_well(spans: Spans, tmp_path: Path, driver: str) -> None:
    first = [tool_turn(tool_call("echo", id="e1", text="a")), KeyboardInterrupt()]
    taken, _ = _cut_then_resumed(spans, tmp_path, driver, first)
    assert taken > 0
    _, resumed = spans.named("invoke_agent")
    assert attributes(resumed).get("fsm_agent.resumed") is True


@pytest.mark.parametrize("driver", DRIVERS)
def test_the_call_events_of_a_resumed_run_say_it_was_resumed(spans: Spans, tmp_path: Path, driver: str) -> None:
    """What the span is marked from: the resumed run's ``before_model`` of turn 1 says it is no fresh start."""
    _, heard = _cut_then_resumed(spans, tmp_path, driver, [KeyboardInterrupt()])
    (event,) = heard
    assert (event.turn, event.resumed) == (1, True)


def test_the_call_events_of_a_fresh_run_do_not_say_resumed() -> None:
    agent = Agent(FakeModel(tool_turn(tool_call("echo", id="e1", text="a")), reply("ok")), demo_registry())
    heard: list[CallEvent] = []
    for kind in ("before_model", "after_model", "before_tool", "after_tool"):
        agent.on(kind, heard.append)
    assert agent.run("q").final == "ok"
    assert len(heard) == 6
    assert not any(event.resumed for event in heard)
