"""The official AG-UI client (``@ag-ui/client`` from npm, under node) runs turns on a live server and accepts them.

The client checks each stream itself (its verifier rejects an event out of
order, a step or message left open, a sub-agent's event attributed wrongly),
so a stream the adapter gets wrong fails here as ``failed``.  The package is
installed from ``tests/agui/js/package-lock.json`` by ``npm ci`` (``.ci/run``
does it).
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
from support.agui_apps import STREAMED, Scenarios, Served, scenario_app
from support.programs import require_program

pytestmark = pytest.mark.subprocess

JS = Path(__file__).resolve().parent / "js"


@pytest.fixture(scope="module")
def report() -> tuple[dict[str, Any], Scenarios]:
    """What the client saw of each scenario (``run_client.mjs``), and the scenarios' tool counts."""
    node = require_program("node", "install Node.js 20 or later")
    if not (JS / "node_modules" / "@ag-ui" / "client").is_dir():
        pytest.fail(f"@ag-ui/client is not installed: run `npm ci` in {JS} (.ci/run does)")
    asgi, scenarios = scenario_app()
    served = Served(asgi)
    try:
        # Measured: 1.5 s on an idle machine, 3 s beside two CPU hogs (.ci/under-load); the timeout is 40 times that.
        done = subprocess.run(
            [node, "run_client.mjs", served.url], cwd=JS, capture_output=True, text=True, timeout=120, check=False
        )
    finally:
        served.close()
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout), scenarios


def test_the_client_takes_a_tool_run_into_its_messages(report: tuple[dict[str, Any], Scenarios]) -> None:
    """Call, result and answer become the client's messages; the outcome is success with the answer and usage."""
    seen = report[0]["tool"]
    assert seen["failed"] is None
    assert [(m["role"], m["toolCalls"]) for m in seen["messages"]] == [
        ("user", []),
        ("assistant", ["add"]),
        ("tool", []),
        ("assistant", []),
    ]
    assert seen["messages"][-1]["content"] == "2 + 3 = 5"
    assert seen["finished"]["outcome"] == "success"
    assert seen["finished"]["result"] == "2 + 3 = 5"
    assert seen["finished"]["usage"] == [{"inputTokens": 30, "outputTokens": 5, "totalTokens": 35}]
    assert seen["events"][:2] == ["RUN_STARTED", "STEP_STARTED AwaitModel"]
    assert seen["events"][-3:] == ["STEP_STARTED Done", "STEP_FINISHED Done", "RUN_FINISHED"]


def test_the_client_builds_a_streamed_answer_from_its_pieces(report: tuple[dict[str, Any], Scenarios]) -> None:
    """Several content events make one assistant message holding the whole answer."""
    seen = report[0]["stream"]
    assert seen["failed"] is None
    assert seen["deltas"] > 3
    assert seen["messages"][-1] == {"role": "assistant", "content": STREAMED, "toolCalls": []}


def test_the_client_sees_a_stop_as_a_run_error_with_reason_and_evidence(
    report: tuple[dict[str, Any], Scenarios],
) -> None:
    """max_steps reaches the client as RUN_ERROR: code, message, and the policy and evidence in metadata."""
    seen = report[0]["stop"]
    assert seen["finished"] is None
    assert seen["error"]["code"] == "max_steps"
    facts = seen["error"]["metadata"]["fsm_agent"]
    assert (facts["policy"], facts["evidence"]["limit"]) == ("raise", 2)
    assert seen["events"][-1] == "RUN_ERROR"


def test_the_client_answers_an_interrupt_and_the_call_runs_once(report: tuple[dict[str, Any], Scenarios]) -> None:
    """The pause is the client's pending interrupt; its resume runs the held-back call exactly once."""
    found, scenarios = report
    paused, resumed = found["paused"], found["resumed"]
    assert paused["failed"] is None
    assert paused["finished"]["outcome"] == "interrupt"
    assert found["pendingInterrupts"] == ["s1"]
    assert resumed["failed"] is None
    assert resumed["finished"]["outcome"] == "success"
    assert resumed["finished"]["result"] == "Sent."
    assert [m["role"] for m in resumed["messages"]] == ["user", "assistant", "tool", "assistant"]
    assert scenarios.executed["send"] == 1


def test_the_client_accepts_a_sub_agents_attributed_events(report: tuple[dict[str, Any], Scenarios]) -> None:
    """A sub-agent's start, steps and finish pass the client's attribution checks; the parent's answer comes last."""
    seen = report[0]["subagent"]
    assert seen["failed"] is None
    assert seen["events"].count("SUBAGENT_STARTED") == seen["events"].count("SUBAGENT_FINISHED") == 1
    assert seen["finished"]["result"] == "the helper said so"
