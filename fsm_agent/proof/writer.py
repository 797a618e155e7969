"""Write a pytest file with one test per reachable stop path: the shortest run to each ending, driven for real.

Each path is driven once while writing (``proof.scripted.drive``): a path the
script cannot make, or one the engine does not take as the checker said, is
left out and named, so the file written passes as written.
"""

from __future__ import annotations

from pathlib import Path

import attrs

from fsm_agent.drivers.agent import Agent
from fsm_agent.proof.check import Proof, StopPath
from fsm_agent.proof.scripted import Unscriptable, drive
from fsm_agent.records import Transition
from fsm_agent.testing import edge_id, edges


@attrs.frozen
class Written:
    """The file written, the endings it tests and those left out (with why)."""

    path: Path
    tested: tuple[str, ...]
    left_out: dict[str, str]


def write_tests(proof: Proof, agent: Agent, target: str, directory: Path) -> Written:
    """Write ``test_stop_paths.py`` into ``directory`` for the agent factory ``target`` (``MODULE:FUNCTION``)."""
    module, _, function = target.partition(":")
    tests: list[str] = []
    tested: list[str] = []
    left_out: dict[str, str] = {}
    for reason, stop_path in proof.paths.items():
        plan = [(move.entry, move.choice) for move in stop_path.moves]
        try:
            result = drive(agent, plan)
        except Unscriptable as exc:
            left_out[reason] = f"needs {exc}"
            continue
        expected = [edge_id(edge) for edge in stop_path.edges]
        if edges(result) != expected:
            left_out[reason] = "the engine took another path: " + ", ".join(edges(result))
            continue
        tested.append(reason)
        tests.append(_test(reason, stop_path, function))
    header = _header(target, module, function, left_out)
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / "test_stop_paths.py"
    path.write_text(header + "\n\n".join(tests) + "\n", encoding="utf-8")
    return Written(path, tuple(tested), left_out)


def _header(target: str, module: str, function: str, left_out: dict[str, str]) -> str:
    lines = [
        f'"""One test per reachable stop path of {target}: the shortest run to each ending, as the checker found it.',
        "",
        "Written by `python -m fsm_agent check --write-tests`; each test drives its path through the real engine",
        "with a scripted model, scripted tools and a scripted world, and asserts the edges taken.",
    ]
    if left_out:
        lines += ["", "Not written:"]
        lines += [f"- {reason}: {why}" for reason, why in left_out.items()]
    lines += [
        '"""',
        "",
        "from fsm_agent.proof.scripted import drive",
        "from fsm_agent.records import Transition",
        "from fsm_agent.testing import edges",
        f"from {module} import {function}",
        "",
        "",
    ]
    return "\n".join(lines)


def _transition(edge: Transition) -> str:
    return f"Transition({edge.source!r}, {edge.trigger!r}, {edge.dest!r}, {edge.guard!r}, {edge.reason!r})"


def _test(reason: str, stop_path: StopPath, function: str) -> str:
    name = "".join(ch if ch.isalnum() else "_" for ch in reason)
    steps = "\n".join(f"        ({_transition(m.entry)}, {m.choice!r})," for m in stop_path.moves)
    ids = "\n".join(f"        {edge_id(edge)!r}," for edge in stop_path.edges)
    summary = f"{edge_id(stop_path.edges[-1])}: the shortest run to {reason}, {len(stop_path.moves)} transition(s)."
    return (
        f"def test_the_shortest_run_to_{name}() -> None:\n"
        f'    """{summary}"""\n'
        f"    path = [\n{steps}\n    ]\n"
        f"    result = drive({function}(), path)\n"
        f"    assert edges(result) == [\n{ids}\n    ]\n"
    )
