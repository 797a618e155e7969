"""A typed answer sent back with a retry left, the retry forbidden by a cut: a resume that lifts the cut makes it.

docs/how-to/typed-answers.md ("A retry a stop forbade") and the
``Failed->AwaitModel[resumes_output_retry]`` row.  The run stops
``output_invalid`` with ``blocked_by`` naming the cut, as before; what
changed is that the retry it was owed is made by a resume with a fresh
token (or more time, or a higher limit), so a sub-agent cut by its parent's
cancel, and a batch's run cut by its Ctrl-C, go on when they are resumed
instead of ending for good.  The model counts its calls by turn and the
validator its checks by answer: each is made once.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import Counter
from typing import Any

import pytest

from fsm_agent import Agent, AgentLoopError, CancelToken, ForkEdit, Message, ModelResponse, Retry, ToolRegistry
from fsm_agent.batch import run_batch
from fsm_agent.persist import open_store
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn


class Cut:
    """What one test cuts with and counts: the token its validator cancels while it rejects "21"."""

    def __init__(self) -> None:
        self.token = CancelToken()
        self.counts: Counter[str] = Counter()
        self.lock = threading.Lock()

    def add(self, key: str) -> None:
        with self.lock:
            self.counts[key] += 1

    def agent(self, *, cancels: bool = True, settle: float = 0.0, **options: Any) -> Agent:
        """``settle``: seconds the validator waits after the cancel, for a batch to pass it on (it polls)."""
        cut = self

        class Answers:
            """Answers "21" (rejected: at most 10), then "7"."""

            def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
                turn = 1 + sum(1 for m in messages if m.role == "assistant")
                cut.add(f"model:{turn}")
                return reply("21" if turn == 1 else "7")

        def small(answer: str) -> str:
            cut.add(f"validator:{answer}")
            if int(answer) > 10:
                if cancels:
                    cut.token.cancel("Ctrl-C")  # the cancel lands while the answer is checked
                    time.sleep(settle)
                raise Retry("at most 10")
            return answer

        return Agent(Answers(), ToolRegistry(), output_type=str, output_validators=[small], **options)


EXPECTED = Counter({"model:1": 1, "model:2": 1, "validator:21": 1, "validator:7": 1})


class Parent:
    """Asks its sub-agent ``research`` once, then is done; keeps what the sub-agent answered in ``seen``."""

    def __init__(self, seen: list[str]) -> None:
        self.seen = seen

    def complete(self, messages: list[Message], tools: Any) -> ModelResponse:
        if messages[-1].role == "tool":
            self.seen.append(messages[-1].content)
            return reply("done")
        return tool_turn(tool_call("research", id="p1", input="x"))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_run_whose_retry_a_cancel_forbade_makes_it_when_resumed_with_a_fresh_token(
    store_target: str, driver: str
) -> None:
    cut = Cut()
    with open_store(store_target) as store:
        agent = cut.agent()
        with pytest.raises(AgentLoopError) as stop:
            _run(agent, driver, store, cut.token)
        assert (stop.value.reason, stop.value.result.evidence["blocked_by"]) == ("output_invalid", "cancelled")
        run = cut.agent().resume(store.load("r"), store=store, cancel=CancelToken())
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert (result.output, result.reason) == ("7", "done")
    assert [step.kind for step in result.steps] == ["output_invalid", "final"]
    assert "Failed->AwaitModel[resumes_output_retry]" in [str(entry) for entry in _edges(result)]
    assert cut.counts == EXPECTED  # the rejected answer is not checked again: its errors were kept


def _run(agent: Agent, driver: str, store: Any, token: CancelToken) -> Any:
    if driver == "sync":
        return agent.run("q", store=store, run_id="r", cancel=token)
    return asyncio.run(agent.arun("q", store=store, run_id="r", cancel=token))


def _edges(result: Any) -> list[str]:
    return [
        f"{t.source}->{t.dest}[{t.reason or t.guard}]" if (t.reason or t.guard) else f"{t.source}->{t.dest}"
        for t in result.trace
    ]


def test_a_retry_refused_for_good_stays_refused() -> None:
    """No retry left (``output_retries=0``): nothing is owed, and a resume says the stop is not lifted."""
    cut = Cut()
    agent = cut.agent(cancels=False, output_retries=0)
    with pytest.raises(AgentLoopError) as stop:
        agent.run("q")
    assert "blocked_by" not in stop.value.result.evidence
    with pytest.raises(ValueError, match="'output_invalid', which these limits do not lift"):
        agent.resume(stop.value.result)
    assert cut.counts == Counter({"model:1": 1, "validator:21": 1})


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agent_whose_retry_its_parents_cancel_forbade_goes_on_when_the_parent_is_resumed(
    store_target: str, driver: str
) -> None:
    """sub-agents.md: a child the parent's cancel stops does not answer the call; the parent's resume goes on
    with it, from its stored run: here, with the retry of its answer."""
    cut = Cut()
    seen: list[str] = []
    tools = ToolRegistry()
    tools.register(cut.agent().as_tool("research", "Answers."))
    parent = Agent(Parent(seen), tools, on_stop={"cancelled": "return"})
    with open_store(store_target) as store:
        if driver == "sync":
            stopped = parent.run("q", store=store, run_id="r", cancel=cut.token)
        else:
            stopped = asyncio.run(parent.arun("q", store=store, run_id="r", cancel=cut.token))
        assert stopped.reason == "cancelled"
        assert store.load("r/p1")["evidence"]["blocked_by"] == "cancelled"
        run = Agent(Parent(seen), tools).resume(store.load("r"), store=store)
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == "done"
    assert seen == ['"7"']
    assert cut.counts == EXPECTED


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_sub_agent_owed_a_retry_its_agent_no_longer_allows_is_read_back_as_it_stopped_when_the_parent_resumes(
    store_target: str, driver: str
) -> None:
    """The parent's cancel forbade the child's retry; the parent is resumed with a child agent of
    ``output_retries=0``, under which nothing lifts the child's stop.  The child is read back as it stopped (the
    call's tool error), as its timeout twin is, not resumed into a ``ValueError`` that left the parent stuck in
    ``Dispatch`` for every later resume."""
    cut = Cut()
    seen: list[str] = []

    def parent(**child_options: Any) -> Agent:
        tools = ToolRegistry()
        tools.register(cut.agent(**child_options).as_tool("research", "Answers."))
        return Agent(Parent(seen), tools, on_stop={"cancelled": "return"})

    with open_store(store_target) as store:
        stopped = _run(parent(), driver, store, cut.token)
        assert stopped.reason == "cancelled"
        run = parent(cancels=False, output_retries=0).resume(store.load("r"), store=store)
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == "done"
    assert len(seen) == 1
    assert "output_invalid" in seen[0]
    assert cut.counts == Counter({"model:1": 1, "validator:21": 1})


SETTLE = 2.0
"""The batch passes its caller's cancel on to its runs every 0.1 s (``batch.local._POLL``): twenty polls."""


@pytest.mark.slow
def test_a_batch_run_whose_retry_its_cancel_forbade_is_resumed_by_the_rerun(store_target: str) -> None:
    """ray.md: a cancelled batch's runs are resumed by a rerun; a typed answer's retry the cancel forbade too."""
    cut = Cut()

    def agent() -> Agent:
        return cut.agent(settle=SETTLE)

    first = run_batch(agent, ["q"], store=store_target, executor="local", progress=False, cancel=cut.token)
    assert (first[0].reason, first[0].evidence.get("blocked_by")) == ("output_invalid", "cancelled"), first[0].evidence
    again = run_batch(agent, ["q"], store=store_target, executor="local", progress=False)
    assert again[0].output == "7"
    assert cut.counts == EXPECTED


class Clocked(Cut):
    """A ``Cut`` whose validator, rejecting "21", takes 20 s of a shared manual clock: past a 10 s deadline."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = ManualClock()

    def agent(self, *, cancels: bool = False, settle: float = 0.0, **options: Any) -> Agent:
        agent = super().agent(cancels=False, **options)
        clock = self.clock
        (validator,) = agent.settings.output.validators  # type: ignore[union-attr]

        def slow(answer: str) -> str:
            if answer == "21":
                clock.advance(20.0)
            return str(validator(answer))

        return Agent(agent.model, agent.registry, output_type=str, output_validators=[slow], clock=clock, **options)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_sub_agent_whose_retry_its_parents_deadline_forbade_retries_when_given_more_time(
    store_target: str, driver: str
) -> None:
    """Its stored run is asked whether the parent's resume lifts its stop (``child_stored._resumes_under``): the
    typed answer's retries left are weighed there as the stepper weighs them."""
    cut = Clocked()
    seen: list[str] = []
    tools = ToolRegistry()
    tools.register(cut.agent().as_tool("research", "Answers."))
    parent = Agent(Parent(seen), tools, timeout=10.0, clock=cut.clock, on_stop={"timeout": "return"})
    with open_store(store_target) as store:
        stopped = _run(parent, driver, store, CancelToken())
        assert stopped.reason == "timeout"
        assert store.load("r/p1")["evidence"]["blocked_by"] == "timeout"
        run = Agent(Parent(seen), tools, clock=cut.clock).resume(store.load("r"), store=store, timeout=100.0)
        result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
    assert result.final == "done"
    assert seen == ['"7"']
    assert cut.counts == EXPECTED


@pytest.mark.parametrize("blocker", ["cancelled", "timeout"])
def test_a_run_whose_retry_a_cut_forbade_forks_at_every_transition_making_no_recorded_call_again(
    store_target: str, blocker: str
) -> None:
    """fork-a-run.md: a run cancelled or timed out and resumed to its end forks at any transition.  The cut is in
    its stop's evidence, not on its edge: the recording keeps the last stop's ``blocked_by`` and the rebuild meets
    a cut it went on from as a cancel, so it takes the source's edges."""
    cut = Clocked() if blocker == "timeout" else Cut()
    options: dict[str, Any] = {"timeout": 10.0} if blocker == "timeout" else {}
    with open_store(store_target) as store:
        with pytest.raises(AgentLoopError) as stop:
            _run(cut.agent(**options), "sync", store, cut.token)
        assert stop.value.result.evidence["blocked_by"] == blocker
        lift: dict[str, Any] = {"timeout": 1000.0} if blocker == "timeout" else {}
        cut.agent(**options).resume(store.load("r"), store=store, **lift).finish()
        trace = store.load("r")["trace"]
        made = Counter(cut.counts)
        edit = ForkEdit(limits=lift) if lift else None  # a fork at the timeout stop goes on with more time
        for at in range(len(trace) - 1):  # every transition but the one into Done
            forked = cut.agent(**options).fork("r", at, store=store, edit=edit).finish()
            assert forked.output == "7", at
    assert cut.counts["model:1"] == made["model:1"]  # each fork is taken after the first reply: never asked again
