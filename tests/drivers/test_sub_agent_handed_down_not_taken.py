"""What a store-less sub-agent cut with its parent handed down, when the call made again never starts a new child.

docs/how-to/sub-agents.md "Cancelled with its parent": the stopped parent's
snapshot carries the cut child's completed outcomes for the pending call
(``carried_down``), for the new child of that call.  When that call gets
its outcome another way (refused: the parent's budget leaves it nothing;
rejected by a person; answered "not executed" by a stop's finalize), no
child will ever take them: they are dropped then, so no later call of the
same tool and arguments (a new request) is handed another call's work, and
no later snapshot or fork copies them.  What the cut child did stays in the
record of the cut: the cut result's snapshot, resumed from, keeps them.

Counted, on both drivers: every model call by who made it, each tool
execution by (item, step).
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from support.storeless_children import Counts
from support.storeless_grandchildren import CHILD_SCRIPT, DEEP_SCRIPT, cut_together, parent_agent, resumed

from fsm_agent import RunResult

DRIVERS = ["sync", "async"]
CUT_REPLIES = 2
"""The model calls the helper and its deep run each made before the cut (steps 1 and 2 asked for)."""
DONE_AT_CUT = Counter({("c1", 1): 1, ("deep c1", 1): 1, ("deep c1", 2): 1})
"""The tool calls the cut helper and its deep run completed: the cut lands in the deep run's step 2."""


def _everything_once() -> Counter[tuple[str, int]]:
    steps = [("c1", step) for tool, step in CHILD_SCRIPT if tool != "deep"]
    return Counter(dict.fromkeys([*steps, *(("deep c1", step) for _, step in DEEP_SCRIPT)], 1))


def _told(result: RunResult, call_id: str) -> str:
    """The tool message that answered ``call_id``."""
    return next(m.content for m in result.messages if m.role == "tool" and m.tool_call_id == call_id)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_handed_down_call_refused_by_the_budget_drops_its_entry_and_a_later_same_call_runs_its_tools(
    driver: str,
) -> None:
    """Resumed with a token budget the cut used up: the helper call is refused, and what it carried is dropped.

    Resumed again with room, the model asks ``helper`` for ``c1`` once more,
    a new call: its child runs every tool, the three the cut child completed
    included (a second time, for the second request), none taken from the cut.
    """
    counts = Counts()
    cut = cut_together(counts, driver, again=True)
    assert cut.snapshot is not None
    kept = json.loads(json.dumps(cut.snapshot))
    spent = cut.usage.input_tokens + cut.usage.output_tokens

    refused, stopped = resumed(parent_agent(counts, driver, again=True), driver, kept, token_budget=spent)
    assert stopped.reason == "token_budget"
    assert "token budget is used up" in _told(stopped, "c1")
    assert refused["carried_down"] == []  # the refused call's entry is dropped, not kept for another call
    assert cut.snapshot["carried_down"] != []  # the record of the cut still says what its child did
    assert counts.tools == DONE_AT_CUT

    final, result = resumed(parent_agent(counts, driver, again=True), driver, refused, token_budget=10**6)
    assert result.final == "done"
    assert final["carried_down"] == []
    assert counts.tools == _everything_once() + DONE_AT_CUT + Counter({("note", 0): 1})
    assert counts.child == Counter({"parent": 3, "c1": CUT_REPLIES + 4, "deep c1": CUT_REPLIES + 4})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_handed_down_call_a_person_rejects_drops_its_entry_and_a_later_same_call_runs_its_tools(
    driver: str,
) -> None:
    """Resumed with the helper call rejected: its entry is dropped; the model's new ``helper`` call runs every tool."""
    counts = Counts()
    cut = cut_together(counts, driver, again=True)
    assert cut.snapshot is not None
    agent = parent_agent(counts, driver, again=True, approve=lambda call: call.id == "c1")
    final, result = resumed(agent, driver, json.loads(json.dumps(cut.snapshot)), approvals={"c1": "not now"})
    assert result.final == "done"
    assert "a person rejected this call" in _told(result, "c1")
    assert final["carried_down"] == []
    assert counts.tools == _everything_once() + DONE_AT_CUT + Counter({("note", 0): 1})
    assert counts.child == Counter({"parent": 3, "c1": CUT_REPLIES + 4, "deep c1": CUT_REPLIES + 4})


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_handed_down_call_a_finalize_answers_as_not_executed_drops_its_entry(driver: str) -> None:
    """Resumed past its deadline with ``timeout`` finalized: the helper call is not executed and nothing lingers.

    The finished run's snapshot (what a fork or a recording of it starts
    from) carries nothing down; the cut's own snapshot still does.
    """
    counts = Counts()
    cut = cut_together(counts, driver)
    assert cut.snapshot is not None
    agent = parent_agent(counts, driver, on_stop={"timeout": "finalize"})
    # A deadline of a nanosecond has passed before the resumed run's first check: no timing margin is involved.
    final, result = resumed(agent, driver, json.loads(json.dumps(cut.snapshot)), timeout=1e-9)
    assert (result.reason, result.final) == ("timeout", "done")  # the finalize call answered
    assert "not executed" in _told(result, "c1")
    assert final["carried_down"] == []
    assert cut.snapshot["carried_down"] != []
    assert counts.tools == DONE_AT_CUT
    assert counts.child == Counter({"parent": 2, "c1": CUT_REPLIES, "deep c1": CUT_REPLIES})
