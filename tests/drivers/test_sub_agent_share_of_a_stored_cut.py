"""A stored sub-agent run taken back is lent what a cut of its call counted of it, outcomes come back included.

docs/how-to/sub-agents.md "Each reply counted once": a child continued from
its stored run counts against its token, dollar and tool-call shares from
its stored counts on, so what the cut counted of those is added to its
shares (``child_spend.lent_back``).  A cut counts, besides the child's
counters, the outcomes that came back in its batch but were not recorded
yet (its ``ran``, which the store keeps as each comes back); the stored run
records them when it is taken back, counting them again against its share.
Only its counters were read, so a run stored as a process dying at the cut
leaves it was lent too little: its token and dollar shares came short by
the come-back outcome's (and the tool calls lent, by its call, though a run
taken over keeps the tool-call share it was started with).

The scenario (``support.prepaid_batch_cut``, async: a batch): the helper's
first reply asks its ``deep`` sub-agent (110 tokens) and ``wait`` together;
the parent's task is cancelled with the deep outcome come back and ``wait``
held.  Counted: every model call by who made it, each tool execution.
"""

from __future__ import annotations

import json
from collections import Counter

from support.prepaid_batch_cut import parent_agent, resumed, task_cut
from support.storeless_children import Counts

from fsm_agent import Usage
from fsm_agent.drivers.child_spend import lent_back
from fsm_agent.persist import open_store


def test_a_stored_run_that_kept_an_outcome_come_back_before_the_cut_is_lent_what_the_cut_counted_of_it(
    store_target: str,
) -> None:
    """SQLite and PostgreSQL: the helper as stored just before the cut holds 2 tokens in its counters and the deep
    outcome (110 tokens, 1 tool call) in its ``ran``; the cut counted 112 and 1, and all of it is lent back."""
    counts = Counts()
    with open_store(store_target) as store:
        lagging = json.loads(json.dumps(task_cut(counts, store)))
        assert lagging["counters"]["tool_calls"] == 0
        assert lagging["ran"]["d1"]["child"]["input_tokens"] == 100
        parent = parent_agent(counts).resume(store.load("p"), store=store)
        kept = parent.position.calls.cut_children["c1"]
        assert (kept.input_tokens + kept.output_tokens, kept.tool_calls) == (112, 1)
        [call] = parent.position.calls.pending
        assert lent_back(parent, call, "p/c1", lagging) == (112, 1, 0.0)
        # As the store has it after the cut (the helper recorded the outcome as it stopped), the same is lent.
        assert lent_back(parent, call, "p/c1", dict(store.load("p/c1"))) == (112, 1, 0.0)
    assert counts.tools == Counter({("c1", 2): 1})  # the held wait, cut in flight
    assert counts.child == Counter({"parent": 1, "c1": 1, "deep c1": 1})


def test_a_stored_helper_cut_with_its_parents_task_resumes_under_the_budget_the_parent_has_left(
    store_target: str,
) -> None:
    """SQLite and PostgreSQL, a token budget of 200: the cut counted 114 (the parent's reply, the helper's, the deep
    run's); the helper taken back is given the 86 left plus the 112 of its own that the cut counted, and answers.
    The wait cut in flight runs again; no model call is made twice."""
    counts = Counts()
    with open_store(store_target) as store:
        task_cut(counts, store)
        result = resumed(counts, store.load("p"), store, token_budget=200)
        helper = dict(store.load("p/c1"))
    assert result.final == "done"
    assert json.loads(result.messages[2].content) == "found c1"
    assert helper["limits"]["token_budget"] == 200 - 114 + 112
    assert counts.tools == Counter({("c1", 2): 2})
    assert counts.child == Counter({"parent": 2, "c1": 2, "deep c1": 1})
    assert result.usage == Usage(1 + 1 + 100 + 1 + 1, 1 + 1 + 10 + 1 + 1)  # each reply once
    assert result.steps[-1].counters["tool_calls"][0] == 3  # the helper call, the deep call, the wait
