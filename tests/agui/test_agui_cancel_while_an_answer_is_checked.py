"""AG-UI: a cancel that lands while a typed answer is checked, with a retry left, ends the turn as cancelled.

ag-ui.md: ``cancel()`` ends the stream "with RUN_FINISHED whose outcome is
cancelled".  The turn stops ``output_invalid`` with ``blocked_by``
``cancelled`` (the cancel forbade the retry its answer was owed), and the
cancel is what ended it: a session takes the same request as one that
answered nobody (a new turn), so the ending must say cancelled too, not
the ``RUN_ERROR`` of a stop of the turn's own, which a client would show
as final.  The rejected answer's errors stay in the ending's evidence.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

from starlette.testclient import TestClient

from fsm_agent import Agent, Message, ModelResponse, Retry, ToolRegistry
from fsm_agent.agui import app
from fsm_agent.testing import reply


def test_a_cancel_during_an_answers_check_ends_the_turn_cancelled_with_the_errors_kept(tmp_path: Any) -> None:
    counts: Counter[str] = Counter()
    served: dict[str, Any] = {}

    class Answers:
        def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
            counts["model"] += 1
            return reply("21" if counts["model"] == 1 else "7")

    def make_agent(run_input: Any) -> Agent:
        def small(answer: str) -> str:
            counts[f"validator:{answer}"] += 1
            if int(answer) > 10:
                served["app"].cancel(run_input.thread_id, "stop button")
                raise Retry("at most 10")
            return answer

        return Agent(Answers(), ToolRegistry(), output_type=str, output_validators=[small])

    served["app"] = app(make_agent, store=str(tmp_path / "threads.db"))
    body = {"threadId": "t", "runId": "r1", "messages": [{"id": "m", "role": "user", "content": "q"}]}
    with TestClient(served["app"]).stream("POST", "/", json=body) as response:
        events = [json.loads(line[6:]) for line in response.iter_lines() if line.startswith("data: ")]
    ending = events[-1]
    assert (ending["type"], ending["outcome"]["type"]) == ("RUN_FINISHED", "cancelled")
    evidence = ending["metadata"]["fsm_agent"]["evidence"]
    assert (evidence["blocked_by"], evidence["errors"]) == ("cancelled", ["at most 10"])
    assert counts == {"model": 1, "validator:21": 1}
