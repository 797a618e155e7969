"""A batch's run read back from the store is the result it gave live: its cost, its typed output, its pause.

A batch run again over the same store takes each ended run's result from
the store, as does a batch on Ray reporting a run it cancelled.  Prices here
are explicit and large (``Price``): 10 tokens cost a cent, so a run of two
model calls costs two cents.
"""

from __future__ import annotations

import gc
import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import pytest

from fsm_agent import Agent, Message, ModelResponse, Price, RunResult, SqliteStore, ToolRegistry, Usage
from fsm_agent.batch import BatchItem, batch_items, run_batch
from fsm_agent.batch.on_ray import _checkpoint
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.testing.store_kit import SHORT
from fsm_agent.tools import JSONSchema

DEAR = Price(input_per_mtok=1000, output_per_mtok=1000)
"""$1000 per million tokens: 10 tokens cost a cent."""
CENT = Usage(6, 4)
"""A call's usage that costs one cent at ``DEAR``."""
QUESTIONS = ["how tall is the tower", "how old is the bridge", "how long is the river"]


@dataclass
class Answer:
    """The typed agent's answer: what it looked up, and in how many words it was asked."""

    topic: str
    words: int


class Bench:
    """A ``make_agent`` whose agents share their counts: every model call and every ``look`` call made.

    Its model asks for one ``look``, then answers in JSON; stateless, so a
    run taken up again goes on where it was.  ``priced`` gives the agents
    ``DEAR``, ``typed`` the output type ``Answer``, ``approve`` a person's
    approval of each ``look``.
    """

    def __init__(self, *, priced: bool = True, typed: bool = False, approve: bool = False, max_steps: int = 5) -> None:
        self.priced, self.typed, self.approve, self.max_steps = priced, typed, approve, max_steps
        self.model_calls: list[str] = []  # appended to, never counted with +=: a run may call from a thread
        self.tool_calls: list[str] = []

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        self.model_calls.append(question)
        if not any(m.role == "tool" for m in messages):
            return tool_turn(tool_call("look", id="look-1", topic=question), usage=CENT)
        return reply(json.dumps({"topic": question, "words": len(question.split())}), usage=CENT)

    def __call__(self) -> Agent:
        tools = ToolRegistry()

        @tools.register
        def look(topic: str) -> str:
            """Look a topic up."""
            self.tool_calls.append(topic)
            return f"found {topic}"

        return Agent(
            self,
            tools,
            max_steps=self.max_steps,
            clock=ManualClock(),  # a clock that never moves: a run's counters read the same live and stored
            prices=DEAR if self.priced else None,
            output_type=Answer if self.typed else None,
            approve=["look"] if self.approve else None,
        )


def _twice(bench: Bench, store: str | Path) -> tuple[list[RunResult], list[RunResult]]:
    """The batch run live, then run again over the same store, which must make no model or tool call."""
    live = run_batch(bench, QUESTIONS, store=store, executor="local", progress=False)
    made = (len(bench.model_calls), len(bench.tool_calls))
    stored = run_batch(bench, QUESTIONS, store=store, executor="local", progress=False)
    assert (len(bench.model_calls), len(bench.tool_calls)) == made
    return live, stored


def test_a_priced_batch_read_back_from_the_store_keeps_each_runs_cost(tmp_path: Path) -> None:
    """Run again over its store, a priced batch reports the cost each run had live: two cents, not None."""
    bench = Bench()
    live, stored = _twice(bench, tmp_path / "runs.db")
    assert [r.reason for r in live] == ["done"] * 3
    assert len(bench.model_calls) == len(bench.tool_calls) * 2 == 6
    assert [r.usage.cost for r in live] == pytest.approx([0.02] * 3)
    assert [r.usage.cost for r in stored] == [r.usage.cost for r in live]
    assert stored == live
    assert all(r.snapshot is None for r in stored)


def test_runs_a_batch_finds_over_in_the_store_are_read_back_with_their_cost_and_output(store_target: str) -> None:
    """Runs made one by one (``Agent.run``) under the batch's run ids: the batch returns them as they were, cost too."""
    bench = Bench(typed=True)
    items = batch_items(QUESTIONS)
    with open_store(store_target) as store:
        live = [bench().run(item.input, store=store, run_id=item.run_id) for item in items]
    made = (len(bench.model_calls), len(bench.tool_calls))
    stored = run_batch(bench, QUESTIONS, store=store_target, executor="local", progress=False)
    assert (len(bench.model_calls), len(bench.tool_calls)) == made == (6, 3)
    assert [r.usage.cost for r in stored] == [r.usage.cost for r in live] == pytest.approx([0.02] * 3)
    assert [r.output for r in stored] == [r.output for r in live] == [Answer(q, len(q.split())) for q in QUESTIONS]
    assert stored == live


def test_an_unpriced_batch_read_back_keeps_its_cost_unknown(tmp_path: Path) -> None:
    """Without a price, a run's cost is None live and None read back, never a guessed zero; its tokens are kept."""
    bench = Bench(priced=False)
    live, stored = _twice(bench, tmp_path / "runs.db")
    assert [r.usage.cost for r in live] == [None] * 3
    assert [r.usage.cost for r in stored] == [None] * 3
    assert [(r.usage.input_tokens, r.usage.output_tokens) for r in stored] == [(12, 8)] * 3
    assert stored == live


def test_a_typed_batch_read_back_from_the_store_keeps_each_runs_output(tmp_path: Path) -> None:
    """A typed agent's runs read back carry the same ``Answer`` they returned live, not None."""
    bench = Bench(typed=True)
    live, stored = _twice(bench, tmp_path / "runs.db")
    assert [r.output for r in live] == [Answer(q, len(q.split())) for q in QUESTIONS]
    assert [r.output for r in stored] == [r.output for r in live]
    assert all(isinstance(r.output, Answer) for r in stored)


def test_a_paused_batch_run_read_back_is_the_pause_it_returned_live(tmp_path: Path) -> None:
    """A run paused for approval reads back paused: the same calls awaiting a decision, evidence, cost, snapshot."""
    bench = Bench(approve=True)
    live, stored = _twice(bench, tmp_path / "runs.db")
    assert [r.reason for r in live] == ["paused"] * 3
    assert bench.tool_calls == []
    assert [[call.name for call in r.pending] for r in stored] == [["look"]] * 3
    assert [r.evidence["awaiting"] for r in stored] == [["look-1"]] * 3
    assert [r.usage.cost for r in stored] == pytest.approx([0.01] * 3)
    assert stored == live
    assert all(r.snapshot is not None and r.snapshot["paused"] for r in stored)


def test_a_stopped_batch_run_read_back_keeps_its_snapshot_and_cost(tmp_path: Path) -> None:
    """A run that stopped (``max_steps``) reads back stopped, with the cost it ran up and a snapshot to resume."""
    bench = Bench(max_steps=1)
    live, stored = _twice(bench, tmp_path / "runs.db")
    assert [r.reason for r in live] == ["max_steps"] * 3
    assert [r.usage.cost for r in stored] == pytest.approx([0.01] * 3)
    assert stored == live
    assert all(r.snapshot is not None and r.snapshot["state"] == "Failed" for r in stored)


def _cut_after_one_call(bench: Bench, store: Path) -> BatchItem:
    """A batch's first run, stored after its first model call: then its task is cancelled.

    Its owner never gives the run back, as a killed worker would not: it is
    leased for ``SHORT``, so the batch that resumes it waits that long, not
    a default lease.
    """
    item = batch_items(QUESTIONS[:1])[0]
    with SqliteStore(store, lease=SHORT) as opened:
        bench().start(item.input, store=opened, run_id=item.run_id).advance()
    return item


def test_a_run_cancelled_on_ray_is_reported_from_its_checkpoint_with_its_cost(tmp_path: Path) -> None:
    """The Ray executor's report of a run cut off mid-way: reason ``cancelled``, its cost and snapshot, no call made."""
    store = tmp_path / "runs.db"
    bench = Bench()
    item = _cut_after_one_call(bench, store)
    made = (len(bench.model_calls), len(bench.tool_calls))
    got, result = _checkpoint(item, str(store), "enough", bench)
    assert got == item
    assert (result.reason, result.evidence["why"]) == ("cancelled", "enough")
    assert result.evidence["state"] == "CheckTruncation"
    assert result.usage.cost == pytest.approx(0.01)
    assert result.snapshot is not None
    assert (len(bench.model_calls), len(bench.tool_calls)) == made == (1, 0)


def test_a_run_that_ended_before_the_cancel_reached_it_on_ray_is_reported_as_it_ended(tmp_path: Path) -> None:
    """Done stays done (its answer and typed output kept) and a limit's stop stays that stop, not ``cancelled``."""
    store = tmp_path / "runs.db"
    finished, stopped = batch_items(QUESTIONS[:2])
    typed, short = Bench(typed=True), Bench(max_steps=1)
    (done,) = run_batch(typed, [finished.input], store=store, executor="local", progress=False)
    asked = [{"input": stopped.input, "run_id": stopped.run_id}]  # under the id it has as the second item
    (limit,) = run_batch(short, asked, store=store, executor="local", progress=False)
    made = (len(typed.model_calls) + len(short.model_calls), len(typed.tool_calls) + len(short.tool_calls))
    assert _checkpoint(finished, str(store), "enough", typed)[1] == done
    assert done.output == Answer(finished.input, len(finished.input.split()))
    assert _checkpoint(stopped, str(store), "enough", short)[1] == limit
    assert limit.reason == "max_steps"
    assert (len(typed.model_calls) + len(short.model_calls), len(typed.tool_calls) + len(short.tool_calls)) == made


def _unmakeable() -> Agent:
    """A factory that fails where the batch was started: a package only the workers have."""
    msg = "no SDK on this machine"
    raise ImportError(msg)


def test_a_ray_run_that_ended_is_reported_as_it_ended_when_its_agent_cannot_be_made_in_the_driver(
    tmp_path: Path,
) -> None:
    """Not ``cancelled``: a stop stays its stop with its snapshot, Done keeps its answer; ``agent_error`` says why."""
    store = tmp_path / "runs.db"
    finished, stopped = batch_items(QUESTIONS[:2])
    typed, short = Bench(typed=True), Bench(max_steps=1)
    (done,) = run_batch(typed, [finished.input], store=store, executor="local", progress=False)
    asked = [{"input": stopped.input, "run_id": stopped.run_id}]
    (limit,) = run_batch(short, asked, store=store, executor="local", progress=False)
    made = (len(typed.model_calls) + len(short.model_calls), len(typed.tool_calls) + len(short.tool_calls))

    _, as_stopped = _checkpoint(stopped, str(store), "enough", _unmakeable)
    assert (as_stopped.reason, as_stopped.evidence["limit"]) == ("max_steps", 1)
    assert as_stopped.evidence["agent_error"] == "ImportError: no SDK on this machine"
    assert as_stopped.snapshot == limit.snapshot
    assert (as_stopped.messages, as_stopped.steps, as_stopped.usage) == (limit.messages, limit.steps, limit.usage)

    _, as_done = _checkpoint(finished, str(store), "enough", _unmakeable)
    assert (as_done.reason, as_done.final, as_done.usage) == (done.reason, done.final, done.usage)
    assert as_done.output is None  # the output type is the agent's, which could not be made
    assert done.output is not None
    assert as_done.evidence == {"agent_error": "ImportError: no SDK on this machine"}
    assert (len(typed.model_calls) + len(short.model_calls), len(typed.tool_calls) + len(short.tool_calls)) == made


def test_a_ray_run_cut_off_is_reported_cancelled_with_its_snapshot_when_its_agent_cannot_be_made_in_the_driver(
    tmp_path: Path,
) -> None:
    """A factory that fails where the batch was started costs the report neither its snapshot nor its cost."""
    store = tmp_path / "runs.db"
    bench = Bench()
    item = _cut_after_one_call(bench, store)
    _, result = _checkpoint(item, str(store), "enough", _unmakeable)
    assert (result.reason, result.evidence["why"], result.evidence["state"]) == (
        "cancelled",
        "enough",
        "CheckTruncation",
    )
    assert result.evidence["agent_error"] == "ImportError: no SDK on this machine"
    assert result.usage.cost == pytest.approx(0.01)
    assert result.snapshot is not None
    assert result.snapshot["state"] == "CheckTruncation"
    again = [{"input": item.input, "run_id": item.run_id}]  # the next pass resumes it: one call more, none again
    (resumed,) = run_batch(bench, again, store=store, executor="local", progress=False)
    assert (resumed.reason, len(bench.model_calls), len(bench.tool_calls)) == ("done", 2, 1)


@pytest.mark.slow
def test_a_local_batch_run_live_and_read_back_on_either_store_leaves_no_connection_open(store_target: str) -> None:
    """The batch's event loop closes its store connections before it ends: no warning of one left open, both passes."""
    live, stored = _twice(Bench(), store_target)
    gc.collect()  # a connection dropped unclosed warns as it is collected: an error under the suite's filter
    assert [r.usage.cost for r in stored] == [r.usage.cost for r in live] == pytest.approx([0.02] * 3)
