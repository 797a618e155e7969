"""``fsm_agent.otel`` is the package's face: ``instrument`` and ``Instrumentation`` import from it, spans join up.

The package is split by concept (the face; ``instrumentation``, when spans
open and close; ``run_spans``, what a run span says at its end;
``conventions``): these tests hold the documented import path, the one
clear error without the extra (whichever of its modules is imported first)
and a whole traced run, on both drivers, through the pieces.
"""

from __future__ import annotations

import subprocess
import sys
from typing import TYPE_CHECKING

import pytest
from support.counted_calls import Counted, drive
from support.sdk import skip_unless_installed
from support.spans import Spans, attributes

from fsm_agent import Agent
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

skip_unless_installed("opentelemetry.sdk", reason="the otel extra is not installed: pip install -e '.[otel]'")

if TYPE_CHECKING:
    from opentelemetry.sdk.trace import ReadableSpan

WITHOUT_OPENTELEMETRY = """
import sys
class NoOpenTelemetry:
    def find_spec(self, name, path=None, target=None):
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            raise ImportError(f"No module named {name!r} (hidden by the test)")
        return None
sys.meta_path.insert(0, NoOpenTelemetry())
"""
"""A preamble that makes ``opentelemetry`` missing in a fresh interpreter, as it is without the extra."""


def test_instrument_and_instrumentation_import_from_the_package_as_documented() -> None:
    """``fsm_agent.otel`` names the two, and its ``Instrumentation`` is the class ``instrument`` returns."""
    import fsm_agent.otel
    from fsm_agent.otel import Instrumentation, instrument
    from fsm_agent.otel.instrumentation import Instrumentation as InItsModule

    assert fsm_agent.otel.__all__ == ["Instrumentation", "instrument"]
    assert Instrumentation is InItsModule
    made = instrument(Agent(FakeModel(reply("hi")), Counted().registry))
    assert type(made) is Instrumentation


@pytest.mark.subprocess
@pytest.mark.parametrize("module", ["fsm_agent.otel", "fsm_agent.otel.instrumentation", "fsm_agent.otel.run_spans"])
def test_without_the_extra_each_module_of_the_package_says_how_to_install_it(module: str) -> None:
    """Any of its modules imported first fails with the package's one message, naming the extra to install."""
    code = f"{WITHOUT_OPENTELEMETRY}\ntry:\n    import {module}\nexcept ImportError as exc:\n    print(exc)\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == (
        "fsm_agent.otel needs opentelemetry-api (and an SDK to export): pip install 'fsm-agent[otel]'"
    ), out.stderr


@pytest.mark.subprocess
def test_without_the_extra_an_agent_runs_and_loads_no_tracing() -> None:
    """``import fsm_agent`` and a run need neither ``opentelemetry`` nor ``fsm_agent.otel``."""
    code = (
        f"{WITHOUT_OPENTELEMETRY}\n"
        "from fsm_agent import Agent, ToolRegistry\n"
        "from fsm_agent.testing import FakeModel, reply\n"
        "model = FakeModel(reply('hi'))\n"
        "assert Agent(model, ToolRegistry()).run('q').final == 'hi'\n"
        "assert len(model.seen) == 1\n"
        "print(sorted(m for m in sys.modules if m.startswith(('opentelemetry', 'fsm_agent.otel'))))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]", out.stderr


def parent_id(span: ReadableSpan) -> int | None:
    """The id of the span ``span`` is a child of, if any."""
    return None if span.parent is None else span.parent.span_id


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_traced_run_opens_and_ends_each_span_once_through_the_split_modules(spans: Spans, driver: str) -> None:
    """A run span with its transitions and its end (``run_spans``), a chat span per call, a tool span per call."""
    from fsm_agent.otel import instrument

    counted = Counted()
    model = FakeModel(tool_turn(tool_call("quick", id="c1", n=2)), reply("two"))
    agent = Agent(model, counted.registry)
    instrument(agent, spans.provider, agent_name="face")

    result = drive(agent, driver)

    assert result.final == "two"
    assert len(model.seen) == 2  # each scripted model call made exactly once
    assert counted.ran == {"c1": 1}  # the tool ran exactly once
    spans.all_ended_once()
    [run] = spans.named("invoke_agent face")
    chats = spans.named("chat")
    assert [span.name for span in chats] == ["chat", "chat"]
    assert list(spans.tools()) == ["c1"]
    [tool] = spans.tools()["c1"]
    assert [parent_id(span) for span in (*chats, tool)] == [run.context.span_id] * 3
    ended = attributes(run)
    assert ended["fsm_agent.stop_reason"] == result.reason
    assert ended["fsm_agent.final_state"] == "Done"
    assert [event.name for event in run.events] == ["transition"] * len(result.trace)
