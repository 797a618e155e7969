"""Write a pytest file of the reachable stop paths: the shortest run to each ending, driven for real three ways.

Each path is driven while writing (``proof.driving.exercise``): a path the
script cannot make, or one the engine does not take as the checker said, is
left out and named, so the file written passes as written.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from fsm_agent.drivers.agent import Agent
from fsm_agent.proof.check import Proof
from fsm_agent.proof.driving import Exercised, exercise
from fsm_agent.proof.scripted import Plan
from fsm_agent.records import Transition
from fsm_agent.testing import edge_id


@attrs.frozen
class Written:
    """The file written, the endings it tests and those left out (with why)."""

    path: Path
    tested: tuple[str, ...]
    left_out: dict[str, str]


def plans(proof: Proof) -> dict[str, Plan]:
    """Each stop path as a plan ``drive`` takes, by reason."""
    return {reason: [(m.entry, m.choice) for m in path.moves] for reason, path in proof.paths.items()}


def write_tests(
    proof: Proof, agent: Agent, target: str, directory: Path, exercised: Exercised | None = None
) -> Written:
    """Write ``test_stop_paths.py`` into ``directory`` for the agent factory ``target`` (``MODULE:FUNCTION``).

    Three tests per path the engine takes as the checker said: the path
    itself; the path cut after every transition and resumed (each tool call
    runs exactly once); the path with every call held for a decision (none
    runs before it).  A path with a fault of either kind is left out, named.
    """
    module, _, function = target.partition(":")
    found = plans(proof)
    exercised = exercised or exercise(agent, found)
    left_out = dict(exercised.left_out)
    left_out |= {reason: f"crash fault: {why}" for reason, why in exercised.crash_faults.items()}
    left_out |= {reason: f"approval fault: {why}" for reason, why in exercised.gate_faults.items()}
    tested = tuple(reason for reason in exercised.taken if reason not in left_out)
    tests = [_tests(reason, found[reason], function) for reason in tested]
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "test_stop_paths.py"
    path.write_text(_header(target, module, function, left_out) + "\n\n".join(tests), encoding="utf-8")
    return Written(path, tested, left_out)


def _header(target: str, module: str, function: str, left_out: dict[str, str]) -> str:
    lines = [
        f'"""The reachable stop paths of {target}: the shortest run to each ending, as the checker found it.',
        "",
        "Written by `python -m fsm_agent check --write-tests`.  Each path is driven through the real engine with a",
        "scripted model, scripted tools and a scripted world, three ways: whole; cut after every transition and",
        "resumed from its snapshot by a fresh agent (each tool call runs exactly once); with every tool call held",
        "for a decision (none runs before it).",
    ]
    if left_out:
        lines += ["", "Not written:"]
        lines += [f"- {reason}: {why}" for reason, why in left_out.items()]
    lines += [
        '"""',
        "",
        "from fsm_agent.proof.driving import drive, drive_cut, drive_gated",
        "from fsm_agent.records import Transition",
        "from fsm_agent.testing import edges",
        f"from {module} import {function}",
        "",
        "",
    ]
    return "\n".join(lines)


def _transition(edge: Transition) -> str:
    return f"Transition({edge.source!r}, {edge.trigger!r}, {edge.dest!r}, {edge.guard!r}, {edge.reason!r})"


def _tests(reason: str, plan: Plan, function: str) -> str:
    expected = [edge_id(edge) for edge, _ in plan]
    name = "".join(ch if ch.isalnum() else "_" for ch in reason)
    big = name.upper()
    steps = "\n".join(f"    ({_transition(edge)}, {choice!r})," for edge, choice in plan)
    ids = "\n".join(f"    {edge!r}," for edge in expected)
    out = (
        f"PATH_TO_{big} = [\n{steps}\n]\nEDGES_TO_{big} = [\n{ids}\n]\n\n\n"
        f"def test_the_shortest_run_to_{name}() -> None:\n"
        f'    """{expected[-1]}: the shortest run to {reason}, {len(plan)} transition(s)."""\n'
        f"    assert edges(drive({function}(), PATH_TO_{big})) == EDGES_TO_{big}\n"
    )
    if len(plan) > 1:
        out += (
            f"\n\ndef test_the_run_to_{name}_cut_after_any_transition_and_resumed_runs_each_call_once() -> None:\n"
            f'    """A crash after any transition of the run to {reason}, and a resume: no call lost or run twice."""\n'
            f"    for cut in range(1, len(PATH_TO_{big})):\n"
            f"        driven = drive_cut({function}(), PATH_TO_{big}, cut)\n"
            f"        assert edges(driven.result) == EDGES_TO_{big}, cut\n"
            f"        assert set(driven.runs.values()) <= {{1}}, cut\n"
            f"\n\ndef test_the_run_to_{name}_with_every_call_held_runs_none_before_its_decision() -> None:\n"
            f'    """Every tool call of the run to {reason} waits for a decision; approved one by one, same path."""\n'
            f"    driven = drive_gated({function}(), PATH_TO_{big})\n"
            f"    assert edges(driven.result) == EDGES_TO_{big}\n"
            f"    assert driven.before_decision == ()\n"
        )
    return out
