"""``check`` on tables with users' rows (``Table.with_rows``): counterexamples replayed, and termination."""

from __future__ import annotations

from collections import deque

import attrs

from fsm_agent import TABLE, Agent, State
from fsm_agent.core.walker import walker_for
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.table import Row, Table
from fsm_agent.proof import check
from fsm_agent.proof.model import INITIAL, Config, Explorer, Setup
from fsm_agent.testing import CounterModel, demo_registry, edge_id


def another_look(run: object) -> bool:
    """A user's plain guard that always holds."""
    return True


def _agent_on(table: Table, max_steps: int) -> Agent:
    """An agent whose runs walk ``table`` (its walker swapped in), with a model that never stops asking for tools."""
    agent = Agent(CounterModel(), demo_registry(), max_steps=max_steps)
    agent.settings = attrs.evolve(agent.settings, walker=walker_for(table))
    return agent


def test_the_docs_counterexample_is_a_loop_a_real_run_takes_past_max_steps() -> None:
    """proof.md's looping table: the real run keeps lapping the counterexample's loop, far past max_steps."""
    table = TABLE.with_rows([Row(State.Dispatch, "dispatch", State.AwaitModel, guard=another_look)], [])
    proof = check(table, max_steps=3)
    assert not proof.ok
    assert proof.loop_start is not None
    loop = list(proof.counterexample[proof.loop_start :])
    run = _agent_on(table, max_steps=3).start("q")
    for _ in range(30 * len(loop)):
        run.advance()
    assert not run.done
    assert run.position.counts.turns > 3 * 5  # model calls: five times the limit, and no stop
    tail = list(run.trace[-len(loop) :])
    # the real run is in the same lap (up to where it was cut in it)
    shift = next(k for k in range(len(loop)) if loop[k:] + loop[:k] == tail)
    assert [edge_id(e) for e in loop[shift:] + loop[:shift]] == [edge_id(e) for e in tail]
    assert "Dispatch->AwaitModel[another_look]" in [edge_id(e) for e in tail]


def _explore(setup: Setup, cap: int) -> set[Config]:
    seen = {INITIAL}
    queue = deque([INITIAL])
    explorer = Explorer(setup)
    while queue and len(seen) < cap:
        for move in explorer.moves(queue.popleft()):
            if move.after not in seen:
                seen.add(move.after)
                queue.append(move.after)
    return seen


def test_a_row_back_to_dispatch_keeps_the_abstract_system_finite() -> None:
    """The claim: counters stop at their limit, so the system is finite and ``check`` ends.

    The row skips the reply's check on its way to Dispatch (one from ExecuteTool other than ``has_pending_calls``
    is refused when the table is built: it could enter Dispatch with no call pending).
    """
    table = TABLE.with_rows([Row(State.AwaitModel, "replied", State.Dispatch, guard=another_look)], [])
    plain = _explore(Setup(TABLE, Limits(max_steps=2), calls_per_reply=1), 100_000)
    seen = _explore(Setup(table, Limits(max_steps=2), calls_per_reply=1), 20 * len(plain))
    assert min(config.pending for config in seen) >= 0, "a turn cannot have fewer than no calls left"
    assert len(seen) < 20 * len(plain), "the exploration did not end"
    assert check(table, calls_per_reply=1, max_steps=2).configs > 0  # and check itself ends
