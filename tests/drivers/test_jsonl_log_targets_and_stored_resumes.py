"""A run's ``log=``: a target it cannot write to is refused before anything runs; a resume from a store appends once.

``JsonlLog`` checks its target when it is made, "not at the first line: a
run's log must not fail after its first call was made".  And a run left by
a Ctrl-C, resumed by a new owner from its store with the same log file,
must leave the file reading back to its trace: every transition once.
"""

from __future__ import annotations

import io
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from support.counted_calls import drive, finish

from fsm_agent import Agent, RunResult, SqliteStore, ToolRegistry
from fsm_agent.observe.events import JsonlLog, read_log
from fsm_agent.testing import CounterModel, FakeModel, demo_registry, reply, tool_call, tool_turn

# --- targets that cannot take a line ----------------------------------------------------------------------------


@contextmanager
def unwritable(kind: str, tmp_path: Path) -> Iterator[Any]:
    """A text file object ``log=`` cannot write to: closed, or open for reading only."""
    path = tmp_path / "run.jsonl"
    path.write_text("", encoding="utf-8")
    if kind == "closed":
        closed = io.StringIO()
        closed.close()
        yield closed
        return
    with path.open(encoding="utf-8") as read_only:
        yield read_only


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_binary_file_is_refused_before_the_model_is_called(tmp_path: Path, driver: str) -> None:
    model = CounterModel()
    with (tmp_path / "run.jsonl").open("ab") as binary, pytest.raises(TypeError, match="binary file"):
        drive(Agent(model, demo_registry(), max_steps=2), driver, log=binary)
    assert model.n == 0


@pytest.mark.parametrize("kind", ["closed", "read_only"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_text_file_that_cannot_be_written_is_refused_before_the_model_is_called(
    tmp_path: Path, driver: str, kind: str
) -> None:
    """Refused when the log is made, with a message naming the log, as a binary file is: no model call made."""
    model = CounterModel()
    with unwritable(kind, tmp_path) as target, pytest.raises((TypeError, ValueError)) as refused:
        drive(Agent(model, demo_registry(), max_steps=2), driver, log=target)
    assert model.n == 0
    assert "log" in str(refused.value)


def test_a_path_in_a_missing_folder_is_refused_before_the_model_is_called(tmp_path: Path) -> None:
    model = CounterModel()
    with pytest.raises(FileNotFoundError):
        Agent(model, demo_registry(), max_steps=2).run("q", log=tmp_path / "missing" / "run.jsonl")
    assert model.n == 0


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_text_file_object_open_for_appending_logs_the_whole_trace(tmp_path: Path, driver: str) -> None:
    path = tmp_path / "run.jsonl"
    model = FakeModel(tool_turn(tool_call("echo", id="e1", text="a")), reply("done"))
    with path.open("a", encoding="utf-8") as target:
        result = drive(Agent(model, demo_registry()), driver, log=target)
        assert not target.closed  # the caller's file stays the caller's
    assert result.final == "done"
    assert read_log(path) == result.trace


# --- a run left by a Ctrl-C, resumed by a new owner from its store ---------------------------------------------------

LEASE = 0.5
"""Short: the heartbeat thread of the run the Ctrl-C left ends about a lease later (other tests count those threads)."""


def _interrupted_once(executions: list[str]) -> ToolRegistry:
    registry = demo_registry()

    @registry.register
    def deliver(call_id: str) -> str:
        """A Ctrl-C the first time it is called, then delivered."""
        executions.append(call_id)
        if len(executions) == 1:
            raise KeyboardInterrupt
        return "delivered"

    return registry


def _left_by_ctrl_c_then_resumed_from_the_store(tmp_path: Path, driver: str, every: str) -> tuple[RunResult, Path]:
    """The first owner logs to ``run.jsonl`` and is interrupted; a new agent and store object finish the run."""
    path, log = tmp_path / "runs.db", tmp_path / "run.jsonl"
    executions: list[str] = []
    first = Agent(FakeModel(tool_turn(tool_call("deliver", id="d1")), reply("done")), _interrupted_once(executions))
    with SqliteStore(path, every=every, lease=LEASE) as store:  # type: ignore[arg-type]
        kept = JsonlLog(log)
        run = first.start("q", store=store, run_id="r1", observers=[kept])
        try:
            with pytest.raises(KeyboardInterrupt):
                finish(run, driver)
        finally:
            kept.close()
        # The interrupted owner's lease is given up, as it lapses once that process is gone.
        stored = store.load("r1")
        store.renew("r1", owner=run._journal.owner, seq=stored["stored_seq"], release=True)
    second = Agent(FakeModel(reply("done")), _interrupted_once(executions))
    with SqliteStore(path, every=every, lease=LEASE) as store:  # type: ignore[arg-type]
        appended = JsonlLog(log)
        try:
            result = finish(second.resume(store.load("r1"), store=store, observers=[appended]), driver)
        finally:
            appended.close()
    assert result.final == "done"
    assert executions == ["d1", "d1"]  # the call cut in flight is made again: documented
    return result, log


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_checkpointing_every_transition_a_stored_resume_appends_each_transition_once(
    tmp_path: Path, driver: str
) -> None:
    result, log = _left_by_ctrl_c_then_resumed_from_the_store(tmp_path, driver, "transition")
    assert read_log(log) == result.trace
    lines = log.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(len(result.trace)))


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_checkpointing_every_call_a_stored_resume_appends_each_transition_once(tmp_path: Path, driver: str) -> None:
    """The default store: the log must still read back to the trace, each seq once, after the new owner's lines."""
    result, log = _left_by_ctrl_c_then_resumed_from_the_store(tmp_path, driver, "call")
    lines = log.read_text(encoding="utf-8").splitlines()
    assert [json.loads(line)["seq"] for line in lines] == list(range(len(result.trace)))
    assert read_log(log) == result.trace
