"""What a store-less sub-agent cut with its parent handed down goes to the call it was made for, by call id.

docs/how-to/sub-agents.md "Cancelled with its parent": the stopped
parent's snapshot keeps each cut child's completed outcomes for its call
(``carried_down``).  Entries used to be matched by tool and arguments only,
first match wins: two identical calls cut in one reply took each other's
when the parent kept them in another order than the resume made the calls,
so one child's completed calls ran again and the other's new child took
outcomes that were not its own.  The decision: an entry names the call it
was kept for (``[call id, arguments]``), a resume from the same snapshot
keeps the ids, and each call takes its own first; tool and arguments match
only an entry made for no call still pending (a fork's, whose calls were
made again under new ids, or one kept before entries named their call).

Counted: each tool execution by (child run id, step), each model call.
"""

from __future__ import annotations

import json
from collections import Counter

import pytest
from support.cutcount_twins import SCRIPT, Counts, cut_twins, parent_agent, resume_twins

from fsm_agent import CancelToken
from fsm_agent.errors import SnapshotError

EVERY_STEP = Counter({("p", 0): 1, **{(run_id, step): 1 for run_id in ("p/a", "p/b") for _, step in SCRIPT}})
"""The parent's ``note`` and each child's calls, each run once across the cut and the resume."""


def _kept(snapshot: dict[str, object]) -> list[tuple[str, list[int]]]:
    """Each entry the cut parent keeps: the call it names, and the steps of the outcomes it holds."""
    entries = []
    for _, arguments, outcomes in snapshot["carried_down"]:  # type: ignore[attr-defined]
        call_id, kept_arguments = json.loads(arguments)
        assert json.loads(kept_arguments) == {"input": "x"}
        entries.append((call_id, [json.loads(kept)["step"] for _, kept, _ in outcomes]))
    return entries


def test_two_identical_calls_cut_in_one_batch_each_take_their_own_childs_outcomes() -> None:
    """``a``'s child completed steps 1 and 2, ``b``'s 1 to 4 (kept first): resumed, none of them runs again.

    Each new child takes its own call's entry: ``a``'s runs steps 3 to 5,
    ``b``'s step 5, and each answers naming only its own run's outcomes.
    """
    counts = Counts()
    cut = cut_twins(counts)
    assert (cut["reason"], [call["id"] for call in cut["pending"]]) == ("cancelled", ["a", "n", "b"])
    assert _kept(cut) == [("b", [1, 2, 3, 4]), ("a", [1, 2])]
    done = {("p", 0): 1, ("p/a", 1): 1, ("p/a", 2): 1, **{("p/b", step): 1 for step in range(1, 5)}}
    assert counts.tools == Counter(done)
    assert cut["counters"]["tool_calls"] == 6  # both cut children's completed calls, counted at the cut

    final, result = resume_twins(counts, json.loads(json.dumps(cut)))
    assert result.final == "done"
    assert counts.tools == EVERY_STEP  # no child's completed call ran twice
    answers = {m.tool_call_id: json.loads(m.content) for m in result.messages if m.role == "tool"}
    assert answers == {"a": "by p/a", "n": "noted", "b": "by p/b"}  # each took its own child's outcomes only
    assert final["carried_down"] == []
    assert final["counters"]["tool_calls"] == 3 + 2 * len(SCRIPT)  # a, n, b and each child's five, once
    # The parent asked twice; each new child asked its model again for every step and its answer.
    assert counts.models == Counter({"parent": 2, "p/a": 2 + len(SCRIPT) + 1, "p/b": 4 + len(SCRIPT) + 1})


def test_an_entry_kept_before_entries_named_their_call_is_taken_by_tool_and_arguments() -> None:
    """An older snapshot's entries (``arguments`` text alone) still load, and a call of that tool and input takes one.

    Written so by rewriting this snapshot's entries as an older release kept
    them: the calls then go by order (``b``'s entry, first, to ``a``).
    """
    counts = Counts()
    cut = json.loads(json.dumps(cut_twins(counts)))
    for entry in cut["carried_down"]:
        entry[1] = json.loads(entry[1])[1]
    final, result = resume_twins(counts, cut)
    assert result.final == "done"
    assert final["carried_down"] == []  # each entry taken
    # a's new child, first to start, took the first entry (b's four outcomes) and ran step 5; b's took a's two and
    # ran steps 3 to 5: no completed call is lost or left, but without the ids nothing tells the two calls apart.
    swapped = Counter({("p/b", 3): 1, ("p/b", 4): 1})
    assert counts.tools == EVERY_STEP + swapped - Counter({("p/a", 3): 1, ("p/a", 4): 1})
    answers = {m.tool_call_id: json.loads(m.content) for m in result.messages if m.role == "tool"}
    assert answers == {"a": "by p/a,p/b", "n": "noted", "b": "by p/a,p/b"}


def test_an_entry_naming_its_call_in_a_malformed_text_is_refused_naming_the_field() -> None:
    """``[call id, arguments]`` that is not two texts: the snapshot is refused before any call is made."""
    counts = Counts()
    cut = json.loads(json.dumps(cut_twins(counts)))
    made = counts.models.copy()
    cut["carried_down"][0][1] = '["b"]'
    with pytest.raises(SnapshotError, match=r"carried_down\[0\]\[1\].*call id, arguments"):
        parent_agent(counts).resume(cut, cancel=CancelToken())
    assert counts.models == made  # nothing called
