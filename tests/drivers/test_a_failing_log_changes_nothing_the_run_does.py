"""A JSON Lines log whose file fails to take a line (a full disk) is a watcher that fails: the run goes on as it was.

docs/how-to/watching-runs.md: hooks, streams and ``log=`` are three ways in
to the same events, and "watching never changes a run"; a hook that raises
is logged while the run goes on.  Here the log's fourth line fails, in the
middle of a turn of three calls that each send something: every call must
still be made once, and the run end with its answer, whichever way the log
was given (``log=``, or a ``JsonlLog`` registered as a hook).  With a store,
the run so finished gives up its lease as any other: a new owner in the
same process takes the run id over.  Under ``strict_hooks`` the failing log
stops the run ``hook_error``, as a failing hook does: stored as that stop,
its lease given up too, no call made twice.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from support.counted_calls import Counted, drive
from support.watch_audit import FailingLog, sends_then_answer

from fsm_agent import Agent, JsonlLog, SqliteStore
from fsm_agent.testing import FakeModel, reply

ONCE_EACH = Counter({"s1": 1, "s2": 1, "s3": 1})


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_failing_log_registered_as_a_hook_skips_and_repeats_no_call(driver: str) -> None:
    tools = Counted()
    agent = Agent(sends_then_answer(), tools.registry)
    log = FailingLog(failing_at=4)
    agent.on("transition", JsonlLog(log))
    result = drive(agent, driver)
    assert result.final == "sent"
    assert tools.ran == ONCE_EACH
    assert len(log.getvalue().splitlines()) == len(result.trace) - 1  # every line but the one the disk refused


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_failing_log_given_as_log_skips_and_repeats_no_call(driver: str) -> None:
    tools = Counted()
    agent = Agent(sends_then_answer(), tools.registry)
    result = drive(agent, driver, log=FailingLog(failing_at=4))
    assert result.final == "sent"
    assert tools.ran == ONCE_EACH


@pytest.mark.parametrize("strict", [False, True], ids=["lenient", "strict_hooks"])
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_stored_run_whose_log_fails_gives_up_its_lease(tmp_path: Path, driver: str, strict: bool) -> None:
    """The run ends (its answer, or ``hook_error`` under ``strict_hooks``), written whole and its lease given up."""
    path = tmp_path / "runs.db"
    tools = Counted()
    agent = Agent(sends_then_answer(), tools.registry, strict_hooks=strict)
    with SqliteStore(path) as store:
        result = drive(agent, driver, log=FailingLog(failing_at=4), store=store, run_id="r1")
        stored = store.load("r1")
    assert (result.reason, stored["reason"]) == (("hook_error",) * 2 if strict else ("done",) * 2)
    assert len(stored["trace"]) == len(result.trace)  # written to its last transition
    if strict:
        assert set(tools.ran.values()) == {1}  # made once, whatever the stop left unmade
    else:
        assert (result.final, tools.ran) == ("sent", ONCE_EACH)
    with SqliteStore(path) as store:  # a new owner, in the same process: the run id is free to take over
        new_owner = Agent(FakeModel(reply("again")), Counted().registry)
        again = drive(new_owner, driver, store=store, run_id="r1", overwrite=True)
        assert again.final == "again"
        assert store.load("r1")["reason"] == "done"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_log_path_that_fails_to_close_leaves_the_result_standing(
    tmp_path: Path, driver: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A line the disk refused is flushed again as the file closes, after the run: that failure is only logged."""
    closing = JsonlLog.close

    def refused(self: JsonlLog) -> None:
        closing(self)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(JsonlLog, "close", refused)
    tools = Counted()
    result = drive(Agent(sends_then_answer(), tools.registry), driver, log=tmp_path / "run.jsonl")
    assert (result.final, tools.ran) == ("sent", ONCE_EACH)
