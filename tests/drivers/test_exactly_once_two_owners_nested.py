"""Two owners at once on a run cut inside its grandchild: the lease lets exactly one make the calls.

docs/concepts/exactly-once.md "One owner per run": a second owner is refused
before anything of the run is repeated.  The run (``support.exactly_once_audit``)
was cut by a Ctrl-C in the grandchild's ``work("g")``; then two owners, each
with its own agent and store object, started together, try to finish it:
both the parent, or one the parent and one the child by its own run id.
Whoever wins, every completed call is made once and ``g`` (in flight at the
cut) once more.
"""

from __future__ import annotations

import asyncio
import threading
import time
from pathlib import Path

import pytest
from support.exactly_once_audit import (
    LEASE,
    NESTED_EFFECTS,
    NESTED_FINAL,
    WAIT,
    Cutter,
    Tally,
    drive,
    durable_in,
    nested_agent,
    nested_levels,
)

from fsm_agent import Agent, AgentRun, RunLeasedError
from fsm_agent.persist import open_store

WANTED = {"cut": ["a"], "cut/sub": ["c"]}


def _owner(target: str, driver: str, run_id: str, agent: Agent, start: threading.Barrier, out: list[str]) -> None:
    """Take ``run_id`` over and finish it, retrying while it is leased; a run found finished is left alone."""
    start.wait()
    deadline = time.monotonic() + WAIT
    with open_store(target, lease=LEASE) as store:
        while True:
            data = store.load(run_id)
            if data["state"] in ("Done", "Failed"):
                out.append("found finished")
                return
            try:
                if driver == "sync":
                    agent.resume(data, store=store).finish()
                else:

                    async def go() -> None:
                        run: AgentRun = await agent.aresume(await store.aload(run_id), store=store)
                        await run.afinish()

                    asyncio.run(go())
            except RunLeasedError:
                assert time.monotonic() < deadline, "the run stayed leased"
                time.sleep(0.02)
                continue
            except ValueError as finished:  # the other owner finished it between this load and the claim
                out.append("found finished" if "nothing to resume" in str(finished) else repr(finished))
                return
            out.append("finished it")
            return


def _cut(target: str, tally: Tally) -> None:
    store = open_store(target, lease=LEASE)
    with pytest.raises(KeyboardInterrupt):
        drive(nested_agent(tally, Cutter("g", durable_in(target, WANTED))), "sync", store, "cut")
    store.close()


def _agent_for(tally: Tally, run_id: str) -> Agent:
    """The agent whose run ``run_id`` is: the parent's for ``cut``, the child's for ``cut/sub``."""
    return nested_levels(tally)["child" if run_id == "cut/sub" else "parent"]


def _race(target: str, tally: Tally, owners: list[tuple[str, str]]) -> list[str]:
    out: list[str] = []
    start = threading.Barrier(len(owners))
    threads = [
        threading.Thread(target=_owner, args=(target, driver, run_id, _agent_for(tally, run_id), start, out))
        for driver, run_id in owners
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(WAIT)
    assert not any(thread.is_alive() for thread in threads)
    return out


@pytest.mark.slow
@pytest.mark.parametrize(("first", "second"), [("sync", "sync"), ("sync", "async"), ("async", "async")])
def test_two_owners_taking_over_one_parent_cut_in_its_grandchild_make_each_call_once(
    store_target: str, tmp_path: Path, first: str, second: str
) -> None:
    tally = Tally(tmp_path / "tally")
    _cut(store_target, tally)
    out = _race(store_target, tally, [(first, "cut"), (second, "cut")])
    assert sorted(out) == ["finished it", "found finished"]
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}
    assert tally.counts("model") == {"parent": 2, "child": 2, "grand": 2}
    with open_store(store_target) as store:
        assert store.load("cut")["final"] == NESTED_FINAL


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_one_owner_taking_over_the_parent_and_another_its_child_at_once_make_each_call_once(
    store_target: str, tmp_path: Path, driver: str
) -> None:
    """The parent's owner finds its child taken by the other owner: it waits for it, then reads its result back."""
    tally = Tally(tmp_path / "tally")
    _cut(store_target, tally)
    out = _race(store_target, tally, [(driver, "cut"), (driver, "cut/sub")])
    assert all(word in ("finished it", "found finished") for word in out), out
    assert tally.counts("done") == NESTED_EFFECTS
    assert tally.counts("try") == {"a": 1, "c": 1, "g": 2}
    # The child's answer is asked once, whoever finished the child: its stored reply is read back by the other.
    assert tally.counts("model") == {"parent": 2, "child": 2, "grand": 2}
    with open_store(store_target) as store:
        assert store.load("cut")["final"] == NESTED_FINAL
        assert store.load("cut/sub")["state"] == "Done"
