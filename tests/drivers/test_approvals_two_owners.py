"""Approvals with two owners, on both drivers and both stores: a held-back call runs once, only once approved.

A decision races a resume; two owners resume one paused run; a batch of held
calls is decided a part at a time; an owner crashes (a hook's exception, a
store that refuses a write) after the decision was stored and before the call
ran.  Every tool counts its side effects per call id, so a call made twice,
or made undecided, shows.
"""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections import Counter
from collections.abc import Sequence
from typing import Any

import pytest
from support.shared_runs import SECRET, Effects, office

from fsm_agent import (
    Agent,
    AgentRun,
    DecisionError,
    Message,
    ModelResponse,
    PostgresStore,
    RunLeasedError,
    RunResult,
    SqliteStore,
    StaleRunError,
    ToolRegistry,
)
from fsm_agent.persist import is_url, open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

RUN = "job"
LEASE = 0.5
"""A crashed owner's lease: short, so the next owner may take the run soon after."""
WAIT = 60.0
"""How long a new owner keeps trying while a crashed owner's lease is still live."""


def _finish(run: AgentRun, driver: str) -> RunResult:
    return run.finish() if driver == "sync" else asyncio.run(run.afinish())


def _start(agent: Agent, driver: str, store: Any) -> RunResult:
    if driver == "sync":
        return agent.run("go", store=store, run_id=RUN)
    return asyncio.run(agent.arun("go", store=store, run_id=RUN))


def _resume(agent: Agent, driver: str, source: Any, store: Any, **options: Any) -> RunResult:
    """Resume ``source`` with ``agent`` and drive it to its end (or pause) on ``driver``."""
    if driver == "sync":
        return agent.resume(source, store=store, **options).finish()

    async def go() -> RunResult:
        run = await agent.aresume(source, store=store, **options)
        return await run.afinish()

    return asyncio.run(go())


def _race(*work: Any) -> list[tuple[str, Any]]:
    """Run each ``work()`` in its own thread, released together; ``("ok", value)`` or ``("error", exc)`` for each."""
    start = threading.Barrier(len(work))
    outcomes: list[tuple[str, Any]] = [("none", None)] * len(work)

    def one(i: int) -> None:
        start.wait()
        try:
            outcomes[i] = ("ok", work[i]())
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcomes[i] = ("error", exc)

    threads = [threading.Thread(target=one, args=(i,)) for i in range(len(work))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return outcomes


# --- a decision racing a resume; two resumes at once -----------------------------------------------------------


@pytest.mark.parametrize("trial", range(4))
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_decision_racing_a_resume_elsewhere_keeps_one_and_the_mail_goes_at_most_once(
    store_target: str, driver: str, trial: int
) -> None:
    """One person rejects ``mail`` in the store while another resumes with it approved: whichever wins, it holds."""
    effects = Effects()
    with open_store(store_target) as deciding, open_store(store_target) as resuming:
        agent, _ = office(effects)
        assert _start(agent, driver, deciding).reason == "paused"
        loaded = resuming.load(RUN)
        other, model = office(effects)
        outcomes = _race(
            lambda: deciding.decide(RUN, "mail", "stop"),
            lambda: _resume(other, driver, loaded, resuming, approvals={"read": False, "mail": True}),
        )
        (decided, decision), (resumed, result) = outcomes
        assert [decided, resumed].count("ok") == 1, outcomes
        if decided == "ok":
            assert isinstance(result, StaleRunError), result
            assert effects == Effects()
            assert deciding.load(RUN)["approvals"] == {"mail": "stop"}
            deciding.decide(RUN, "read", False)
            done = _resume(office(effects, approve=False)[0], driver, deciding.load(RUN), deciding)
            assert done.reason == "done"
            assert effects == Effects(), "a rejected call ran"
        else:
            assert isinstance(decision, RunLeasedError | DecisionError), decision
            assert result.reason == "done"
            assert effects == {"mail": 1}
            assert deciding.load(RUN)["state"] == "Done"
        assert SECRET not in model.shown


@pytest.mark.parametrize("trial", range(4))
def test_two_owners_resuming_one_paused_run_at_once_send_the_mail_once(store_target: str, trial: int) -> None:
    """A sync and an async owner resume the same loaded snapshot with decisions at once: one runs it, one is refused."""
    effects = Effects()
    with open_store(store_target) as first, open_store(store_target) as second:
        agent, _ = office(effects)
        assert agent.run("go", store=first, run_id=RUN).reason == "paused"
        snapshot = first.load(RUN)
        decisions = {"read": "no", "mail": True}
        outcomes = _race(
            lambda: _resume(office(effects)[0], "sync", snapshot, first, approvals=decisions),
            lambda: _resume(office(effects)[0], "async", snapshot, second, approvals=decisions),
        )
        assert sorted(kind for kind, _ in outcomes) == ["error", "ok"], outcomes
        for kind, value in outcomes:
            if kind == "error":
                assert isinstance(value, StaleRunError | RunLeasedError), value
            else:
                assert value.reason == "done"
        assert effects == {"mail": 1}
        assert first.load(RUN)["state"] == "Done"


# --- a batch decided a part at a time ---------------------------------------------------------------------------


class Wires:
    """Asks in one turn for three ``wire`` calls (held back) and a ``note`` between them; then answers with the results.

    Its reply depends only on the conversation, so any agent built here goes on with a run another one began.
    """

    def __init__(self) -> None:
        self.calls = 0
        self.lock = threading.Lock()

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        with self.lock:
            self.calls += 1
        if not any(m.role == "assistant" for m in messages):
            return tool_turn(
                tool_call("wire", id="h1", amount=1),
                tool_call("wire", id="h2", amount=2),
                tool_call("note", id="f", text="wired"),
                tool_call("wire", id="h3", amount=3),
            )
        return reply(" | ".join(f"{m.tool_call_id}={m.content}" for m in messages if m.role == "tool"))


def _wires(made: Counter[str], model: Wires, lock: threading.Lock) -> Agent:
    registry = ToolRegistry()

    def wire(amount: int, call_id: str) -> str:
        """Wire money (held back for a person)."""
        with lock:
            made[call_id] += 1
        return f"wired {amount}"

    def note(text: str, call_id: str) -> str:
        """Write a note (needs nobody's approval)."""
        with lock:
            made[call_id] += 1
        return text

    registry.register(wire)
    registry.register(note)
    return Agent(model, registry, approve={"wire"})


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_batch_decided_a_part_at_a_time_runs_each_approved_call_once_and_no_rejected_one(
    store_target: str, driver: str
) -> None:
    """Three held calls and a free one in one turn: decide one (not the first), then the first, then the last."""
    made: Counter[str] = Counter()
    lock = threading.Lock()
    model = Wires()
    with open_store(store_target) as store:
        paused = _start(_wires(made, model, lock), driver, store)
        assert (paused.reason, [c.id for c in paused.pending]) == ("paused", ["h1", "h2", "h3"])  # what waits
        assert [c["id"] for c in store.load(RUN)["pending"]] == ["h1", "h2", "f", "h3"]

        # h2 approved, but h1 (first in line) is undecided: nothing may run, the free note included.
        store.decide(RUN, "h2", True)
        again = _resume(_wires(made, model, lock), driver, store.load(RUN), store)
        assert again.reason == "paused"
        assert made == Counter()
        stored = store.load(RUN)
        assert (stored["approvals"], stored["paused"]) == ({"h2": True}, True)
        with pytest.raises(DecisionError, match="already decided"):
            store.decide(RUN, "h2", "changed my mind")

        # h1 approved: h1, h2 and the note run, then the run waits on h3.
        store.decide(RUN, "h1", True)
        third = _resume(_wires(made, model, lock), driver, store.load(RUN), store)
        assert (third.reason, [c.id for c in third.pending]) == ("paused", ["h3"])
        assert made == {"h1": 1, "h2": 1, "f": 1}
        for gone in ("h1", "h2", "f"):
            with pytest.raises(DecisionError, match="not a pending call"):
                store.decide(RUN, gone, False)

        store.decide(RUN, "h3", "over the limit")
        done = _resume(_wires(made, model, lock), driver, store.load(RUN), store)
    assert done.reason == "done"
    assert made == {"h1": 1, "h2": 1, "f": 1}
    rejection = json.dumps({"error": "a person rejected this call to 'wire': over the limit"})
    assert done.final == f'h1="wired 1" | h2="wired 2" | f="wired" | h3={rejection}'
    assert model.calls == 2


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_live_paused_batch_decided_in_two_rounds_runs_each_call_once(store_target: str, driver: str) -> None:
    """The same batch, decided on the paused run object itself (no second owner): round one leaves h3 waiting."""
    made: Counter[str] = Counter()
    lock = threading.Lock()
    model = Wires()
    with open_store(store_target) as store:
        run = _wires(made, model, lock).start("go", store=store, run_id=RUN)
        assert _finish(run, driver).reason == "paused"
        run.decide({"h1": True, "h2": "no"})
        assert _finish(run, driver).reason == "paused"
        assert [c.id for c in run.awaiting()] == ["h3"]
        assert made == {"h1": 1, "f": 1}
        assert store.load(RUN)["approvals"] == {}  # the decided calls are dealt with; h3 waits undecided
        run.decide({"h3": True})
        assert _finish(run, driver).reason == "done"
    assert made == {"h1": 1, "f": 1, "h3": 1}
    assert model.calls == 2


# --- a crash between the stored decision and the call ---------------------------------------------------------


class Crash(BaseException):
    """A process dying in the middle of the run (not an ``Exception``: nothing in the run catches it)."""


def _take_over(agent: Agent, driver: str, store: Any) -> RunResult:
    """Resume the stored run as a new owner, once the crashed owner's lease lets it; its result."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return _resume(agent, driver, store.load(RUN), store)
        except RunLeasedError:
            assert time.monotonic() < deadline, "the crashed owner's lease never lapsed"
            threading.Event().wait(LEASE / 5)


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_an_owner_crashing_after_the_decision_was_stored_leaves_the_approved_call_to_run_once(
    store_target: str, driver: str
) -> None:
    """Decided in the store; the resuming owner dies in ``before_tool`` of the approved call; the next runs it once."""
    effects = Effects()
    with open_store(store_target, lease=LEASE) as store:
        assert _start(office(effects)[0], driver, store).reason == "paused"
        store.decide(RUN, "read", "private")
        store.decide(RUN, "mail", True)
        crashing, _ = office(effects)

        @crashing.on("before_tool")
        def die(event: Any) -> None:
            if event.tool_call.id == "mail":
                raise Crash

        with pytest.raises(Crash):
            _resume(crashing, driver, store.load(RUN), store)
        assert effects == Effects()
        stored = store.load(RUN)
        assert stored["approvals"].get("mail") is True, "the stored approval was lost with the crash"
        assert "read" not in [c["id"] for c in stored["pending"]]

        plain, model = office(effects, approve=False)
        result = _take_over(plain, driver, store)
    assert result.reason == "done"
    assert effects == {"mail": 1}
    assert SECRET not in model.shown
    assert "a person rejected this call to 'read_file': private" in result.final


def _refusing(target: str) -> Any:
    """A store on ``target`` whose appends can be refused (``refuse``: which, counted from ``arm``)."""
    base = PostgresStore if is_url(target) else SqliteStore

    class Refusing(base):  # type: ignore[misc, valid-type]
        refuse: frozenset[int] = frozenset()
        count = 0

        def arm(self, *which: int) -> None:
            self.refuse, self.count = frozenset(which), 0

        def _gate(self) -> None:
            self.count += 1
            if self.count in self.refuse:
                msg = "the store refused the write (disk full)"
                raise OSError(msg)

        def append(self, entry: Any, *, owner: str) -> None:
            self._gate()
            super().append(entry, owner=owner)

        async def aappend(self, entry: Any, *, owner: str) -> None:
            self._gate()
            await super().aappend(entry, owner=owner)

    return Refusing(target)


@pytest.mark.parametrize("where", [1, 2], ids=["before-the-call", "after-the-call"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_refused_write_around_an_approved_call_then_a_retry_runs_it_once(
    store_target: str, driver: str, where: int
) -> None:
    """Decided on the live paused run; a write is refused before (or right after) the call; going on, it ran once."""
    effects = Effects()
    store = _refusing(store_target)
    try:
        agent, model = office(effects)
        run = agent.start("go", store=store, run_id=RUN)
        assert _finish(run, driver).reason == "paused"
        run.decide({"read": "no", "mail": True})
        store.arm(where)
        with pytest.raises(OSError, match="refused the write"):
            _finish(run, driver)
        assert effects == (Effects() if where == 1 else {"mail": 1})
        result = _finish(run, driver)
        assert result.reason == "done"
        assert effects == {"mail": 1}
        stored = store.load(RUN)
        assert (stored["state"], stored["final"]) == ("Done", result.final)
        assert SECRET not in model.shown
    finally:
        store.close()


# --- the lease, and a decision too late --------------------------------------------------------------------------


def test_an_async_owner_holding_the_run_refuses_decisions_then_a_finished_run_refuses_them_too(
    store_target: str,
) -> None:
    """While ``aresume`` holds the run, ``adecide`` is a RunLeasedError; once it finished, the run is not paused."""
    effects = Effects()

    async def scenario() -> tuple[BaseException, RunResult, BaseException]:
        async with open_store(store_target) as store:
            agent, _ = office(effects)
            assert (await agent.arun("go", store=store, run_id=RUN)).reason == "paused"
            run = await agent.aresume(await store.aload(RUN), approvals={"read": True}, store=store)
            try:
                await store.adecide(RUN, "mail", False)
            except RunLeasedError as exc:
                leased: BaseException = exc
            else:
                raise AssertionError("a decision was taken on a run its owner is advancing")
            paused = await run.afinish()
            assert paused.reason == "paused"  # mail is still undecided
            await store.adecide(RUN, "mail", False)
            done = await (await agent.aresume(await store.aload(RUN), store=store)).afinish()
            try:
                await store.adecide(RUN, "mail", True)
            except DecisionError as exc:
                late: BaseException = exc
            else:
                raise AssertionError("a decision was taken on a finished run")
            return leased, done, late

    leased, done, late = asyncio.run(scenario())
    assert "is being advanced by" in str(leased)
    assert done.reason == "done"
    assert "not paused" in str(late)
    assert effects == {"read": 1}
