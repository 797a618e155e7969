"""A store-less sub-agent's own sub-agent cut with them by a cancel: the parent's resume repeats none of its tool calls.

docs/how-to/sub-agents.md "Cancelled with its parent": without a store, the
stopped parent's snapshot carries the cut child's completed outcomes
(``carried_down``) and the fresh child of the call made again takes them.
Here the child has a store-less sub-agent of its own (``deep``), cut in its
``wait`` (step 2): what the grandchild completed is carried down too, from
the parent's snapshot to the new child and from it to the new grandchild.
The model calls of every level are made again (the fresh runs ask their
models from the start): counted below, each level's cut replies once more.

Counted, on both drivers: every model call by who made it, each tool
execution by (item, step), the parent's usage, across the cut and the resume.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import pytest
from support.storeless_children import Counts, task_cut
from support.storeless_grandchildren import CHILD_SCRIPT, DEEP_SCRIPT, cut_together, parent_agent, resumed

from fsm_agent import CancelToken, RunResult
from fsm_agent.errors import SnapshotError
from fsm_agent.persist import open_store

DRIVERS = ["sync", "async"]
CHILD_REPLIES = len(CHILD_SCRIPT) + 1
DEEP_REPLIES = len(DEEP_SCRIPT) + 1
CUT_REPLIES = 2
"""The model calls the helper and its deep run each made before the cut: steps 1 and 2 were asked for."""


def _once(*items: str) -> Counter[tuple[str, int]]:
    """Each step of both scripts run once for each helper input (its deep run's input is ``deep <input>``)."""
    steps = [(item, step) for item in items for _, step in CHILD_SCRIPT if _ != "deep"]
    steps += [(f"deep {item}", step) for item in items for _, step in DEEP_SCRIPT]
    return Counter(dict.fromkeys(steps, 1))


def _resumed(counts: Counts, driver: str, asks: tuple[str, ...], source: Any, store: Any = None) -> RunResult:
    """``source`` resumed with a fresh token and driven to its end; nothing is left carried down."""
    snapshot, result = resumed(parent_agent(counts, driver, asks), driver, source, store=store)
    assert snapshot["carried_down"] == []
    return result


def _answers(result: RunResult) -> dict[str, str]:
    return {m.tool_call_id or "": m.content for m in result.messages if m.role == "tool"}


def _steps(outcomes: list[Any]) -> list[tuple[str, str]]:
    """Each kept outcome of a carried-down entry as (tool, arguments text): what the tests compare."""
    return [(tool, arguments) for tool, arguments, _ in outcomes]


def _compact(value: object) -> str:
    return json.dumps(value, separators=(",", ":"))


def _deep_done(item: str, *steps: int) -> list[tuple[str, str]]:
    """The deep run's completed ``steps``, as the helper's entry carries them: ``[deep's arguments, tool, its]``."""
    deep = _compact({"input": f"deep {item}"})
    tools = {step: tool for tool, step in DEEP_SCRIPT}
    return [("deep", _compact([deep, tools[s], _compact({"item": f"deep {item}", "step": s})])) for s in steps]


def _spent(result: RunResult) -> tuple[int, int]:
    return result.usage.input_tokens, result.usage.output_tokens


@pytest.mark.parametrize("as_json", [False, True], ids=["snapshot", "json"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_grandchild_cut_by_the_shared_token_resumed_without_a_store_runs_each_tool_once(
    driver: str, as_json: bool
) -> None:
    """The helper did step 1 and asked ``deep``, which did steps 1 and 2 (the cut's): none runs again.

    What is repeated: the helper's two model calls and the deep run's two
    (the fresh runs ask their models again and take the kept outcomes).
    """
    counts = Counts()
    cut = cut_together(counts, driver, ("c1",))
    assert (cut.reason, [call.id for call in cut.pending]) == ("cancelled", ["c1"])
    assert cut.snapshot is not None
    [(name, arguments, outcomes)] = cut.snapshot["carried_down"]
    assert (name, json.loads(arguments)) == ("helper", ["c1", '{"input":"c1"}'])  # kept for call c1
    assert _steps(outcomes) == [("work", '{"item":"c1","step":1}'), *_deep_done("c1", 1, 2)]
    assert (counts.child["parent"], counts.child["c1"], counts.child["deep c1"]) == (1, CUT_REPLIES, CUT_REPLIES)
    source = json.loads(json.dumps(cut.snapshot)) if as_json else cut.snapshot

    result = _resumed(counts, driver, ("c1",), source)
    assert result.final == "done"
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1")
    made = Counter({"parent": 2, "c1": CUT_REPLIES + CHILD_REPLIES, "deep c1": CUT_REPLIES + DEEP_REPLIES})
    assert counts.child == made
    assert _spent(result) == (made.total(), made.total())  # each reply made counted once, none twice
    # The helper, the child's three calls and the deep run's three, each once.
    assert result.steps[-1].counters["tool_calls"][0] == 1 + len(CHILD_SCRIPT) + len(DEEP_SCRIPT)


@pytest.mark.parametrize("driver", DRIVERS)
def test_two_grandchildren_cut_in_one_batch_resumed_from_json_run_each_tool_once(driver: str) -> None:
    """One reply asks ``c1`` and ``c2``: async cuts both deep runs in step 2; sync cuts ``c1``'s, starts no ``c2``."""
    counts = Counts()
    asks = ("c1", "c2")
    started = asks if driver == "async" else ("c1",)
    cut = cut_together(counts, driver, asks)
    assert cut.snapshot is not None
    kept = {json.loads(arguments)[0]: _steps(outcomes) for _, arguments, outcomes in cut.snapshot["carried_down"]}
    assert kept == {item: [("work", f'{{"item":"{item}","step":1}}'), *_deep_done(item, 1, 2)] for item in started}

    result = _resumed(counts, driver, asks, json.loads(json.dumps(cut.snapshot)))
    assert _answers(result) == {"c1": '"found c1"', "c2": '"found c2"'}
    assert counts.tools == _once(*asks)
    again = {item: CUT_REPLIES if item in started else 0 for item in asks}
    assert counts.child == Counter(
        {"parent": 2}
        | {item: again[item] + CHILD_REPLIES for item in asks}
        | {f"deep {item}": again[item] + DEEP_REPLIES for item in asks}
    )


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_new_child_cut_again_before_its_sub_agent_call_hands_the_grandchilds_outcomes_on(driver: str) -> None:
    """Resumed, the new helper is cut again right after its first model call: nothing handed to it is lost.

    Its token is cancelled from inside that call (a fixed point, no race):
    it took none of its outcomes yet, nor started its ``deep`` run, so the
    parent's second snapshot carries the same outcomes, the deep run's too,
    and the third run runs each tool once.
    """
    counts = Counts()
    first = cut_together(counts, driver, ("c1",))
    assert first.snapshot is not None
    token = CancelToken()

    def cancel_in_the_new_helper(asked: str, made: int) -> None:
        if (asked, made) == ("c1", CUT_REPLIES + 1):
            token.cancel("stopped again")

    agent = parent_agent(counts, driver, told=cancel_in_the_new_helper)
    second, stopped = resumed(agent, driver, json.loads(json.dumps(first.snapshot)), cancel=token)
    assert stopped.reason == "cancelled"
    assert second["carried_down"] == json.loads(json.dumps(first.snapshot["carried_down"]))

    result = _resumed(counts, driver, ("c1",), json.loads(json.dumps(second)))
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1")
    made = Counter({"parent": 2, "c1": CUT_REPLIES + 1 + CHILD_REPLIES, "deep c1": CUT_REPLIES + DEEP_REPLIES})
    assert counts.child == made
    assert _spent(result) == (made.total(), made.total())


def test_a_grandchild_cut_by_the_parents_task_cancel_resumed_runs_each_completed_tool_once() -> None:
    """Async: the task's cancel cuts the deep run's step 2 in flight (it never came back): only it runs again."""
    counts = Counts()
    snapshot = task_cut(parent_agent(counts, "async"), counts)
    [(_, _, outcomes)] = snapshot["carried_down"]
    assert _steps(outcomes) == [("work", '{"item":"c1","step":1}'), *_deep_done("c1", 1)]

    result = _resumed(counts, "async", ("c1",), json.loads(json.dumps(snapshot)))
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1") + Counter({("deep c1", 2): 1})  # step 2, cut in flight, made again
    made = Counter({"parent": 2, "c1": CUT_REPLIES + CHILD_REPLIES, "deep c1": CUT_REPLIES + DEEP_REPLIES})
    assert counts.child == made
    assert _spent(result) == (made.total(), made.total())


@pytest.mark.parametrize("driver", DRIVERS)
def test_with_a_store_the_cut_grandchild_goes_on_from_its_stored_run_and_nothing_is_carried(
    store_target: str, driver: str
) -> None:
    """SQLite and PostgreSQL: the stored helper and deep runs go on after the cut: no tool or model call repeated."""
    counts = Counts()
    with open_store(store_target) as store:
        cut = cut_together(counts, driver, ("c1",), store=store)
        stored = store.load("p")
        assert stored["carried_down"] == []  # the children's stored runs hold what they did
        result = _resumed(counts, driver, ("c1",), stored, store)
    assert cut.reason == "cancelled"
    assert _answers(result) == {"c1": '"found c1"'}
    assert counts.tools == _once("c1")
    assert counts.child == Counter({"parent": 2, "c1": CHILD_REPLIES, "deep c1": DEEP_REPLIES})


def test_a_snapshot_whose_outcome_a_level_down_is_malformed_is_refused_naming_it() -> None:
    """An outcome kept for the grandchild whose arguments are not ``[arguments, tool, arguments]``: refused at once.

    Refused when the snapshot is read, before any call is made, rather than
    when the new child would hand it on, mid-run.
    """
    counts = Counts()
    cut = cut_together(counts, "sync", ("c1",))
    assert cut.snapshot is not None
    edited = json.loads(json.dumps(cut.snapshot))
    edited["carried_down"][0][2][1][1] = '["only two", "parts"]'
    with pytest.raises(SnapshotError, match=r"carried_down\[0\]\[2\]\[1\].*tool name"):
        parent_agent(counts, "sync").resume(edited, cancel=CancelToken())
    assert counts.child == Counter({"parent": 1, "c1": CUT_REPLIES, "deep c1": CUT_REPLIES})  # nothing called
