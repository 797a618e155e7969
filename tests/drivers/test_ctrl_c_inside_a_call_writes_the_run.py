"""A Ctrl-C inside a model or tool call writes what the run took since its store's last write; anywhere else, nothing.

A store that writes only some transitions (``every="call"`` or ``"turn"``)
lags the run object between its writes, though observers heard of every
transition.  A ``KeyboardInterrupt`` or ``SystemExit`` that comes out of a
call finds the run whole (the drivers mark the call itself, never the
changes around it), so that lag is written as the interrupt leaves, the cut
call left in flight: the next owner makes the cut call again and nothing
else, and announces no transition twice.  Each test counts every model call
(by turn) and every tool execution (by call id), and logs both owners'
transitions to one JSON Lines file, which must read back to the trace, each
``seq`` once.  Both drivers; both stores, but where a test doubles the store.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import signal
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest
from support.counted_calls import finish

from fsm_agent import Agent, AgentRun, Message, ModelResponse, Retry, RunLeasedError, RunResult, ToolRegistry
from fsm_agent.errors import RunStateError
from fsm_agent.observe.events import JsonlLog, read_log
from fsm_agent.persist import open_store
from fsm_agent.testing import reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

DRIVERS = ["sync", "async"]
LEASE = 0.5
"""Short: the heartbeat thread of a run a Ctrl-C left ends about a lease later (other tests count those threads)."""


def _interrupt(kind: str) -> BaseException:
    return KeyboardInterrupt() if kind == "KeyboardInterrupt" else SystemExit(1)


class Counts:
    """Every model call by turn (the assistant messages it was sent) and every tool execution by call id."""

    def __init__(self) -> None:
        self.model: Counter[int] = Counter()
        self.tools: Counter[str] = Counter()


class ByHistory:
    """A model answering by the conversation it is sent (any agent built here continues another's run).

    ``replies[n]`` answers the call made after ``n`` replies; the call of
    turn ``cut_turn`` raises ``cut`` once (a Ctrl-C while the model is asked).
    """

    def __init__(self, counts: Counts, replies: Sequence[ModelResponse], cut_turn: int | None, cut: BaseException):
        self.counts, self.replies, self.cut_turn, self.cut = counts, replies, cut_turn, cut

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        turn = sum(1 for m in messages if m.role == "assistant")
        self.counts.model[turn] += 1
        if turn == self.cut_turn:
            self.cut_turn = None
            raise self.cut
        return self.replies[turn]


def _registry(
    counts: Counts, cut: str | None = None, *, before_cut: Callable[[], object] = lambda: None
) -> ToolRegistry:
    """``send``, counting each execution by call id; the call ``cut`` raises a Ctrl-C once, after ``before_cut``."""
    armed = [cut]
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a note."""
        counts.tools[call_id] += 1
        if call_id == armed[0]:
            armed[0] = None
            before_cut()
            raise KeyboardInterrupt
        return f"sent to {to}"

    return tools


def _cut_then_resumed(
    target: str, every: str, driver: str, log: Path, make: Callable[[bool], Agent], run_id: str = "r"
) -> tuple[list[Any], RunResult]:
    """The first owner (``make(True)``) logs to ``log`` and is cut; a new store object and agent finish the run.

    Returns the trace the first owner's handle had when it was cut (what
    its observers heard), with the result.  The cut owner's lease is given
    up, as it lapses once that process is gone.
    """
    with open_store(target, every=every, lease=LEASE) as store:
        heard = JsonlLog(log)
        run = make(True).start("q", store=store, run_id=run_id, observers=[heard])
        try:
            with pytest.raises((KeyboardInterrupt, SystemExit)):
                finish(run, driver)
        finally:
            heard.close()
        stored = store.load(run_id)
        assert len(stored["trace"]) == len(run.trace), "the transitions heard before the Ctrl-C were not all written"
        store.renew(run_id, owner=run._journal.owner, seq=stored["stored_seq"], release=True)  # type: ignore[union-attr]
        cut_trace = list(run.trace)
    with open_store(target, every=every, lease=LEASE) as store:
        appended = JsonlLog(log)
        try:
            result = finish(make(False).resume(store.load(run_id), store=store, observers=[appended]), driver)
        finally:
            appended.close()
    return cut_trace, result


def _heard_once(log: Path, result: RunResult) -> None:
    """Both owners' lines read back to the trace, each transition once."""
    lines = log.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(len(result.trace)))
    assert list(read_log(log)) == list(result.trace)


# --- a Ctrl-C while the model is asked -------------------------------------------------------------------------


def _digits(text: str) -> str:
    if not text.isdigit():
        raise Retry("answer in digits")
    return text


@pytest.mark.parametrize("kind", ["KeyboardInterrupt", "SystemExit"])
@pytest.mark.parametrize("every", ["call", "turn"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ctrl_c_inside_a_model_call_writes_the_transitions_before_it(
    store_target: str, tmp_path: Path, driver: str, every: str, kind: str
) -> None:
    """A tool call, an answer sent back for digits (``Dispatch->AwaitModel``), then the model call that retries it is
    cut.  With ``every="call"`` the two transitions since the tool call's write are written by the Ctrl-C; with
    ``"turn"`` the store wrote them before the call.  The resume asks the cut turn again and makes no tool call."""
    counts = Counts()
    replies = [tool_turn(tool_call("send", id="s1", to="ops")), reply("seven"), reply("7")]

    def make(cut: bool) -> Agent:
        model = ByHistory(counts, replies, 2 if cut else None, _interrupt(kind))
        return Agent(model, _registry(counts), output_type=str, output_validators=[_digits])

    cut_trace, result = _cut_then_resumed(store_target, every, driver, tmp_path / "run.jsonl", make)
    assert [str(edge.dest) for edge in cut_trace[-2:]] == ["Dispatch", "AwaitModel"]
    assert result.output == "7"
    assert counts.model == {0: 1, 1: 1, 2: 2}  # only the cut model call was made again
    assert counts.tools == {"s1": 1}
    _heard_once(tmp_path / "run.jsonl", result)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ctrl_c_inside_a_model_call_of_a_run_with_a_timeout_is_what_propagates(tmp_path: Path, driver: str) -> None:
    """With a ``timeout`` the sync driver makes the calls on a worker thread: the model call's ``KeyboardInterrupt``
    reaches the caller as itself (it came out as ``RuntimeError: release unlocked lock``), the run written as above."""
    counts = Counts()
    replies = [tool_turn(tool_call("send", id="s1", to="ops")), reply("seven"), reply("7")]

    def make(cut: bool) -> Agent:
        model = ByHistory(counts, replies, 2 if cut else None, KeyboardInterrupt())
        return Agent(model, _registry(counts), output_type=str, output_validators=[_digits], timeout=60)

    _, result = _cut_then_resumed(str(tmp_path / "runs.db"), "call", driver, tmp_path / "run.jsonl", make)
    assert result.output == "7"
    assert counts.model == {0: 1, 1: 1, 2: 2}
    assert counts.tools == {"s1": 1}
    _heard_once(tmp_path / "run.jsonl", result)


# --- a Ctrl-C while a tool runs --------------------------------------------------------------------------------


@pytest.mark.parametrize("every", ["call", "turn", "transition"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ctrl_c_in_the_third_call_of_a_turn_runs_only_that_call_again(
    store_target: str, tmp_path: Path, driver: str, every: str
) -> None:
    """One reply asks for three calls, made one at a time (``max_concurrency=1``), the third cut.  With
    ``every="turn"`` the outcomes of the first two are written only by the Ctrl-C (before, the resume made them
    again); with any ``every`` each call runs once but the cut one, and each transition is heard once."""
    counts = Counts()
    calls = [tool_call("send", id=f"s{n}", to=f"desk {n}") for n in (1, 2, 3)]
    replies = [tool_turn(*calls), reply("all sent")]

    def make(cut: bool) -> Agent:
        tools = _registry(counts, "s3" if cut else None)
        return Agent(ByHistory(counts, replies, None, KeyboardInterrupt()), tools, max_concurrency=1)

    _, result = _cut_then_resumed(store_target, every, driver, tmp_path / "run.jsonl", make)
    assert result.final == "all sent"
    assert counts.tools == {"s1": 1, "s2": 1, "s3": 2}
    assert counts.model == {0: 1, 1: 1}
    _heard_once(tmp_path / "run.jsonl", result)


def _parallel_agent(counts: Counts, cut: bool, handle: list[AgentRun]) -> Agent:
    """One reply asking for three calls at once: ``quick`` q1 returns, ``hang`` h1 hangs (the first time), and ``cut``
    k1 raises a Ctrl-C once q1's outcome is in the run; then an answer."""
    tools = ToolRegistry()
    armed = [cut]

    @tools.register
    async def quick(call_id: str) -> str:
        """Return at once."""
        counts.tools[call_id] += 1
        return "quick"

    @tools.register
    async def hang(call_id: str) -> str:
        """Hang in the run that is cut; return at once in the resumed one."""
        counts.tools[call_id] += 1
        if cut:
            await asyncio.Event().wait()
        return "late"

    @tools.register
    async def cut_short(call_id: str) -> str:
        """A Ctrl-C once q1 came back (the first time)."""
        counts.tools[call_id] += 1
        if armed[0]:
            armed[0] = False
            while "q1" not in handle[0].position.calls.ran:
                await asyncio.sleep(0.001)
            raise KeyboardInterrupt
        return "done"

    calls = (tool_call("quick", id="q1"), tool_call("hang", id="h1"), tool_call("cut_short", id="k1"))
    return Agent(ByHistory(counts, [tool_turn(*calls), reply("batch done")], None, KeyboardInterrupt()), tools)


@pytest.mark.parametrize("every", ["call", "turn", "transition"])
def test_a_ctrl_c_in_a_parallel_batch_keeps_the_calls_that_came_back(
    store_target: str, tmp_path: Path, every: str
) -> None:
    """Async: q1 came back, h1 is in flight, k1 raises a Ctrl-C.  The write the Ctrl-C makes holds q1's outcome (with
    ``every="turn"`` no other write does), so the resume makes only the two calls cut in flight again."""
    counts = Counts()
    handle: list[AgentRun] = []
    log = tmp_path / "run.jsonl"
    with open_store(store_target, every=every, lease=LEASE) as store:
        heard = JsonlLog(log)
        run = _parallel_agent(counts, True, handle).start("q", store=store, run_id="r", observers=[heard])
        handle.append(run)
        try:
            with pytest.raises(KeyboardInterrupt):
                finish(run, "async")
        finally:
            heard.close()
        stored = store.load("r")
        assert len(stored["trace"]) == len(run.trace)
        assert "q1" in stored["ran"]
        store.renew("r", owner=run._journal.owner, seq=stored["stored_seq"], release=True)  # type: ignore[union-attr]
    with open_store(store_target, every=every, lease=LEASE) as store:
        appended = JsonlLog(log)
        try:
            resumed = _parallel_agent(counts, False, handle).resume(store.load("r"), store=store, observers=[appended])
            result = finish(resumed, "async")
        finally:
            appended.close()
    assert result.final == "batch done"
    assert counts.tools == {"q1": 1, "h1": 2, "k1": 2}
    assert counts.model == {0: 1, 1: 1}
    _heard_once(log, result)


# --- the write fails, the lease is lost, the interrupt lands elsewhere ---------------------------------------------


def _two_calls(counts: Counts, cut: str | None, before_cut: Callable[[], object] = lambda: None) -> Agent:
    calls = [tool_call("send", id="s1", to="a"), tool_call("send", id="s2", to="b")]
    model = ByHistory(counts, [tool_turn(*calls), reply("sent")], None, KeyboardInterrupt())
    return Agent(model, _registry(counts, cut, before_cut=before_cut), max_concurrency=1)


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_write_that_fails_at_a_ctrl_c_is_logged_and_the_interrupt_propagates(
    tmp_path: Path, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The store refuses the Ctrl-C's write: the ``KeyboardInterrupt`` propagates (not the store's error), a warning
    says what was not written, and the stored run is what the store last wrote (the next owner hears the rest again)."""
    counts = Counts()
    broken = [False]
    with open_store(tmp_path / "runs.db", every="turn", lease=LEASE) as store:
        for name in ("append", "aappend"):
            real = getattr(store, name)

            def refusing(*args: Any, _real: Any = real, **kwargs: Any) -> Any:
                if broken[0]:
                    raise OSError("the disk went away")
                return _real(*args, **kwargs)

            setattr(store, name, refusing)

        def break_the_store() -> None:
            broken[0] = True

        run = _two_calls(counts, "s2", break_the_store).start("q", store=store, run_id="r")
        with caplog.at_level(logging.WARNING, logger="fsm_agent"), pytest.raises(KeyboardInterrupt):
            finish(run, driver)
        assert len(store.load("r")["trace"]) < len(run.trace)  # s1's transition stays unwritten
    assert "could not be written" in caplog.text
    assert "the disk went away" in caplog.text


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_run_taken_over_while_its_call_was_in_flight_is_not_written_by_the_ctrl_c(
    store_target: str, driver: str, caplog: pytest.LogCaptureFixture
) -> None:
    """While s2 runs, another owner takes the run over (the lease given up, then claimed): the Ctrl-C's write is
    refused by the store's fence, so the other owner's run stands as it wrote it; the interrupt propagates."""
    counts = Counts()
    first: list[AgentRun] = []
    taken: dict[str, Any] = {}

    def another_owner_takes_it() -> None:
        with open_store(store_target, every="turn", lease=LEASE) as other:
            data = other.load("r")
            other.renew("r", owner=first[0]._journal.owner, seq=data["stored_seq"], release=True)  # type: ignore[union-attr]
            _two_calls(Counts(), None).resume(other.load("r"), store=other)
            taken.update(other.load("r"))

    with open_store(store_target, every="turn", lease=LEASE) as store:
        run = _two_calls(counts, "s2", another_owner_takes_it).start("q", store=store, run_id="r")
        first.append(run)
        with caplog.at_level(logging.WARNING, logger="fsm_agent"), pytest.raises(KeyboardInterrupt):
            finish(run, driver)
        stored = store.load("r")
    assert stored["stored_seq"] == taken["stored_seq"]
    assert stored["trace"] == taken["trace"]
    assert "could not be written" in caplog.text


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ctrl_c_outside_any_call_writes_nothing(tmp_path: Path, driver: str) -> None:
    """A ``before_tool`` hook raising ``KeyboardInterrupt`` (as a Ctrl-C landing there, before the second turn's call):
    the run may be in the middle of a change, so nothing is written, and the next owner hears the transitions taken
    since the last write again; no call is made twice."""
    counts = Counts()
    log = tmp_path / "run.jsonl"
    replies = [
        tool_turn(tool_call("send", id="s1", to="a")),
        tool_turn(tool_call("send", id="s2", to="b")),
        reply("ok"),
    ]

    def make(cut: bool) -> Agent:
        agent = Agent(ByHistory(counts, replies, None, KeyboardInterrupt()), _registry(counts))
        if cut:
            armed = [True]

            def ctrl_c(event: Any) -> None:
                if armed[0] and event.tool_call.id == "s2":
                    armed[0] = False
                    raise KeyboardInterrupt

            agent.on("before_tool", ctrl_c)
        return agent

    with open_store(tmp_path / "runs.db", every="call", lease=LEASE) as store:
        heard = JsonlLog(log)
        run = make(True).start("q", store=store, run_id="r", observers=[heard])
        try:
            with pytest.raises(KeyboardInterrupt):
                finish(run, driver)
        finally:
            heard.close()
        written, taken = len(store.load("r")["trace"]), len(run.trace)
        assert written < taken  # CheckTruncation->Dispatch->ExecuteTool (to s2): heard, not written
        seq = store.load("r")["stored_seq"]
        store.renew("r", owner=run._journal.owner, seq=seq, release=True)  # type: ignore[union-attr]
    with open_store(tmp_path / "runs.db", every="call", lease=LEASE) as store:
        appended = JsonlLog(log)
        try:
            result = finish(make(False).resume(store.load("r"), store=store, observers=[appended]), driver)
        finally:
            appended.close()
    assert result.final == "ok"
    assert counts.tools == {"s1": 1, "s2": 1}  # s2 never began before the Ctrl-C
    seqs = Counter(json.loads(line)["seq"] for line in log.read_text(encoding="utf-8").splitlines())
    assert sorted(n for n, times in seqs.items() if times == 2) == list(range(written, taken))
    assert sorted(seqs) == list(range(len(result.trace)))


# --- a real SIGINT -----------------------------------------------------------------------------------------------


@pytest.fixture
def sigint_raises() -> Iterator[None]:
    """SIGINT raises ``KeyboardInterrupt``, as in a terminal, even in a suite started in the background.

    A process started by a shell in the background ignores SIGINT, and Python
    then installs no handler of its own: the signal would be lost.
    """
    before = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, before)


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to its own process")
@pytest.mark.parametrize("timeout", [None, 60.0])
@pytest.mark.usefixtures("sigint_raises")
def test_a_real_sigint_while_a_tool_runs_writes_the_run(tmp_path: Path, timeout: float | None) -> None:
    """The process is sent SIGINT while s2 runs (sync driver).  Without a ``timeout`` the tool runs in the main thread,
    where the interrupt is raised; with one, the run is driven on a worker and the interrupt is raised in the caller's
    thread, waiting for it: the run is written there while the worker's call is in flight."""
    counts = Counts()
    release, ended, missed = threading.Event(), threading.Event(), threading.Event()
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a note; s2 is interrupted by a real SIGINT the first time."""
        counts.tools[call_id] += 1
        if call_id == "s2" and counts.tools[call_id] == 1:
            os.kill(os.getpid(), signal.SIGINT)
            if timeout is None:
                time.sleep(30)  # the SIGINT's KeyboardInterrupt is raised here, in the main thread
                missed.set()  # not reached when the signal does its work
            release.wait(30)  # on the worker: the caller's thread takes the interrupt meanwhile
            ended.set()
            raise KeyboardInterrupt  # the worker goes no further
        return f"sent to {to}"

    calls = [tool_call("send", id="s1", to="a"), tool_call("send", id="s2", to="b")]
    agent = Agent(
        ByHistory(counts, [tool_turn(*calls), reply("sent")], None, KeyboardInterrupt()), tools, timeout=timeout
    )
    with open_store(tmp_path / "runs.db", every="turn", lease=LEASE) as store:
        run = agent.start("q", store=store, run_id="r")
        with pytest.raises(KeyboardInterrupt):
            run.finish()
        stored = store.load("r")
        assert len(stored["trace"]) == len(run.trace)
        release.set()
        if timeout is not None:
            assert ended.wait(30)
            deadline = time.monotonic() + 30
            while run._mutex is not None and time.monotonic() < deadline:  # type: ignore[attr-defined]
                time.sleep(0.01)  # the worker unwinds (it writes nothing more)
        store.renew("r", owner=run._journal.owner, seq=stored["stored_seq"], release=True)  # type: ignore[union-attr]
        result = agent.resume(store.load("r"), store=store).finish()
    assert result.final == "sent"
    assert counts.tools == {"s1": 1, "s2": 2}
    assert not missed.is_set()  # the interrupt came from the signal, not from the tool's own raise


@pytest.mark.skipif(sys.platform == "win32", reason="SIGINT to its own process")
@pytest.mark.usefixtures("sigint_raises")
@pytest.mark.parametrize("to", ["main", "worker"])
def test_a_real_sigint_while_a_deadline_workers_call_runs_stops_the_worker_when_the_call_returns(
    store_target: str, to: str
) -> None:
    """With a ``timeout`` the interrupt lands in the caller's thread while the worker's call runs on, and returns.

    That call's outcome is not taken in and the worker makes no call after
    it: before, it went on with the run behind the caller's back (the next
    call made, the model asked, the run written to its end).  The next owner
    makes the cut call again and nothing else; the object the Ctrl-C left
    refuses to go on (its worker may be running still).  The same when the
    OS hands the signal to the worker's thread: before, the caller took it
    only once the whole run had ended.
    """
    counts = Counts()
    release, returned = threading.Event(), threading.Event()
    main = threading.main_thread().ident
    assert main is not None
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a note; s2's first run takes a real SIGINT to the process, then returns as if nothing happened."""
        counts.tools[call_id] += 1
        if call_id == "s2" and counts.tools[call_id] == 1:
            # The OS hands a terminal's Ctrl-C to one thread, mostly the main one; one handed the worker is run by
            # Python in the main thread once that runs Python code: the caller's wait wakes for it (Handoff.WAKE).
            signal.pthread_kill(main if to == "main" else threading.get_ident(), signal.SIGINT)
            release.wait(30)
            returned.set()
        return f"sent to {to}"

    calls = [tool_call("send", id=f"s{i}", to=f"t{i}") for i in (1, 2, 3)]
    agent = Agent(ByHistory(counts, [tool_turn(*calls), reply("sent")], None, KeyboardInterrupt()), tools, timeout=60)
    with open_store(store_target, lease=LEASE) as store:
        run = agent.start("q", store=store, run_id="r")
        with pytest.raises(KeyboardInterrupt):
            run.finish()
        written = store.load("r")
        release.set()
        assert returned.wait(30)
        deadline = time.monotonic() + 30
        while run._mutex is not None and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.01)  # the worker unwinds once its call is back
        assert (counts.tools, counts.model) == (Counter({"s1": 1, "s2": 1}), Counter({0: 1}))  # s3 never made
        assert store.load("r")["stored_seq"] == written["stored_seq"]  # the worker wrote nothing more
        with pytest.raises(RunStateError, match="resume it from its store"):
            run.finish()
        deadline = time.monotonic() + 30
        while True:  # the lease the worker's heartbeat kept lapses once its call is back
            try:
                resumed = agent.resume(store.load("r"), store=store)
                break
            except RunLeasedError:
                assert time.monotonic() < deadline
                time.sleep(0.05)
        result = resumed.finish()
    assert result.final == "sent"
    assert counts.tools == {"s1": 1, "s2": 2, "s3": 1}  # the cut call made again, as any cut call in flight
    assert counts.model == {0: 1, 1: 1}
