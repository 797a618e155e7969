"""A ``before_tool`` hook slow enough that the run's deadline passes in it: no call is made after it, none twice.

A watcher must not change what a run does.  A run whose deadline passes
between two calls stops ``timeout`` without making the next call (the
drivers look at the deadline before each call); a hook that takes up that
time must leave it so: the call is made once, by the resume that gives
the run time again.  The hook waits until the deadline has passed, however
busy the machine; the ``send`` it comes before takes a while, as a real
one does.  Nothing here asserts on time.  The same holds for a parallel
batch on the async driver (each call's hooks, then the deadline: the calls
after it are neither heard of nor made) and for a ``before_model`` hook.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support.counted_calls import drive, finish
from support.watch_audit import SlowPastTheDeadline, sends_taking_a_while

from fsm_agent import Agent
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

TIMEOUT = 0.5


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_call_delayed_past_the_deadline_by_its_hook_is_made_once(driver: str) -> None:
    ran: Counter[str] = Counter()
    registry = sends_taking_a_while(ran, 0.3)
    model = FakeModel(tool_turn(tool_call("send", id="s1", to="bob")), reply("sent"))
    agent = Agent(model, registry, timeout=TIMEOUT)
    slow = SlowPastTheDeadline(TIMEOUT + 0.1)
    agent.on("before_tool", slow)
    stopped = drive(agent, driver)
    assert slow.called == 1
    assert stopped.reason == "timeout"
    assert "unfinished" not in stopped.evidence  # left unmade, not cut in flight
    resumed = finish(Agent(model, registry).resume(stopped, timeout=60), driver)
    assert resumed.final == "sent"
    assert ran == Counter({"s1": 1})


@pytest.mark.slow
def test_a_parallel_batch_whose_first_hook_passes_the_deadline_makes_each_call_once() -> None:
    ran: Counter[str] = Counter()
    registry = sends_taking_a_while(ran, 0.3)
    calls = [tool_call("send", id=f"s{n}", to=to) for n, to in enumerate(("a", "b", "c"), 1)]
    model = FakeModel(tool_turn(*calls), reply("sent"))
    agent = Agent(model, registry, timeout=TIMEOUT)
    slow = SlowPastTheDeadline(TIMEOUT + 0.1)
    agent.on("before_tool", slow)
    stopped = drive(agent, "async")
    assert slow.called == 1  # the calls after it found the time up: not heard of, as on the sync driver
    assert stopped.reason == "timeout"
    assert "unfinished" not in stopped.evidence
    assert not ran
    resumed = finish(Agent(model, registry).resume(stopped, timeout=60), "async")
    assert resumed.final == "sent"
    assert ran == Counter({"s1": 1, "s2": 1, "s3": 1})


@pytest.mark.slow
@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_model_call_delayed_past_the_deadline_by_its_hook_is_made_once(driver: str) -> None:
    model = FakeModel(reply("hello"))
    agent = Agent(model, demo_registry(), timeout=TIMEOUT)
    slow = SlowPastTheDeadline(TIMEOUT + 0.1)
    agent.on("before_model", slow)
    stopped = drive(agent, driver)
    assert (slow.called, stopped.reason, model.seen) == (1, "timeout", [])
    assert "unfinished" not in stopped.evidence
    resumed = finish(Agent(model, demo_registry()).resume(stopped, timeout=60), driver)
    assert resumed.final == "hello"
    assert len(model.seen) == 1


@pytest.mark.slow
def test_a_batch_call_whose_hook_passes_the_deadline_keeps_the_one_that_ran_before_it() -> None:
    """One call at a time: ``s1`` runs and is kept, ``s2``'s hook takes the time left; the resume makes the rest."""
    ran: Counter[str] = Counter()
    registry = sends_taking_a_while(ran, 0)
    calls = [tool_call("send", id=f"s{n}", to=to) for n, to in enumerate(("a", "b", "c"), 1)]
    model = FakeModel(tool_turn(*calls), reply("sent"))
    agent = Agent(model, registry, timeout=TIMEOUT * 2, max_concurrency=1)
    slow = SlowPastTheDeadline(TIMEOUT * 2 + 0.1)
    agent.on("before_tool", lambda event: slow(event) if event.tool_call.id == "s2" else None)
    stopped = drive(agent, "async")
    assert (slow.called, stopped.reason) == (1, "timeout")
    assert ran == Counter({"s1": 1})
    resumed = finish(Agent(model, registry).resume(stopped, timeout=60), "async")
    assert resumed.final == "sent"
    assert ran == Counter({"s1": 1, "s2": 1, "s3": 1})
