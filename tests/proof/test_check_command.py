"""``python -m fsm_agent check``: the proof printed, exit codes, and the stop-path tests it writes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fsm_agent.cli.stop_tests import write_tests
from fsm_agent.proof import check
from fsm_agent.proof.driving import drive
from fsm_agent.proof.scripted import Unscriptable
from fsm_agent.testing import edge_id, edges

AGENTS = textwrap.dedent(
    """
    from fsm_agent import TABLE, Agent, StopCondition
    from fsm_agent.definition.states import State
    from fsm_agent.definition.table import Row
    from fsm_agent.testing import FakeModel, demo_registry

    def every_part():
        stop = StopCondition("too_long", "ExecuteTool", lambda view: False)
        return Agent(
            FakeModel(), demo_registry(), max_steps=3, token_budget=500, timeout=30, max_tool_calls=4,
            strict_hooks=True, output_type=str, on_stop={"max_steps": "finalize"}, stop_conditions=[stop],
        )

    def plain():
        return Agent(FakeModel(), demo_registry())

    def another_look(run):
        return True

    LOOPING = TABLE.with_rows([Row(State.Dispatch, "dispatch", State.AwaitModel, guard=another_look)], [])
    """
)


def _unscripted(source: str, reachable: tuple[str, ...]) -> str:
    """Why the written tests are not one per reachable ending: the endings ``check`` wrote none for, and why not."""
    missing = [reason for reason in reachable if f"\ndef test_the_shortest_run_to_{reason}()" not in source]
    header = source.split('"""', 2)[1]
    why = header.split("Not written:", 1)[1].strip() if "Not written:" in header else "(the file says nothing)"
    return (
        f"every_part reaches {len(reachable)} endings, and check --write-tests wrote no test for {missing}. "
        f"The file's header says why (a path the script cannot make, or one the engine did not take):\n{why}\n"
        "A guard the checker reads only by name (a fact) needs a reading in Explorer._fact (proof/model.py) and a "
        "script in Script._world (proof/scripted.py); see docs/concepts/architecture.md, 'A built-in stop'."
    )


def _command(cwd: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent", "check", *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def agents(tmp_path: Path) -> Path:
    """A folder holding a module of agent factories and a looping table."""
    (tmp_path / "my_agents.py").write_text(AGENTS, encoding="utf-8")
    return tmp_path


@pytest.mark.subprocess
def test_check_prints_the_bound_and_exits_0_when_every_run_stops(agents: Path) -> None:
    """The plain agent: every run stops, within 8 model calls; the reasons it can and cannot reach."""
    done = _command(agents, "my_agents:plain", "--calls-per-reply", "2")
    assert done.returncode == 0, done.stderr
    assert "every run stops: yes" in done.stdout
    assert "bound: at most 48 transitions, 8 model call(s)" in done.stdout
    assert "unreachable: hook_error, output_invalid" in done.stdout


@pytest.mark.subprocess
def test_check_exits_1_with_the_counterexample_of_a_loop_that_never_ends(agents: Path) -> None:
    """A table with an unbounded user row: exit 1, the loop printed edge by edge."""
    refuted = _command(agents, "my_agents:LOOPING", "--draw", "loop.svg")
    assert refuted.returncode == 1
    assert "every run stops: NO" in refuted.stdout
    assert "Dispatch->AwaitModel[another_look] on dispatch" in refuted.stdout
    drawing = (agents / "loop.svg").read_text(encoding="utf-8")
    assert drawing.startswith("<?xml")
    assert "another_look" in drawing


@pytest.mark.subprocess
def test_check_names_a_factory_it_cannot_load_in_one_line(agents: Path) -> None:
    """A missing module or function: exit 1 and one line on stderr."""
    missing = _command(agents, "my_agents:nobody")
    assert missing.returncode == 1
    assert missing.stderr.strip() == "error: check: my_agents has no function 'nobody'"


@pytest.mark.subprocess
def test_the_written_tests_pass_as_written_one_per_reachable_stop_path(agents: Path) -> None:
    """--write-tests: one test per reachable ending, each passing when pytest runs the file."""
    written = _command(agents, "my_agents:every_part", "--write-tests", "generated")
    assert written.returncode == 0, written.stderr
    assert "each call ran once, none before its decision" in written.stdout
    source = (agents / "generated" / "test_stop_paths.py").read_text(encoding="utf-8")
    sys.path.insert(0, str(agents))
    try:
        import my_agents  # type: ignore[import-not-found]

        proof = check(my_agents.every_part())
    finally:
        sys.path.remove(str(agents))
        sys.modules.pop("my_agents", None)
    assert source.count("\ndef test_the_shortest_run_to_") == len(proof.reachable), _unscripted(source, proof.reachable)
    long_paths = sum(len(path.moves) > 1 for path in proof.paths.values())
    assert source.count("_cut_after_any_transition_and_resumed_runs_each_call_once()") == long_paths
    tests = source.count("\ndef test_")
    run = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "generated/test_stop_paths.py"],
        cwd=agents,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    assert f"{tests} passed" in run.stdout


def test_each_stop_path_is_the_path_the_engine_takes() -> None:
    """Driven for real, every scriptable shortest path takes exactly the checker's edges, ending on its reason."""
    from fsm_agent import Agent, StopCondition
    from fsm_agent.testing import FakeModel, demo_registry

    stop = StopCondition("too_long", "ExecuteTool", lambda view: False)
    agent = Agent(
        FakeModel(),
        demo_registry(),
        max_steps=3,
        token_budget=500,
        timeout=30,
        max_tool_calls=4,
        strict_hooks=True,
        output_type=str,
        stop_conditions=[stop],
        on_stop={"repeated_action": "finalize"},
    )
    proof = check(agent)
    driven = 0
    for reason, path in proof.paths.items():
        try:
            result = drive(agent, [(move.entry, move.choice) for move in path.moves])
        except Unscriptable:
            continue
        assert edges(result) == [edge_id(edge) for edge in path.edges], reason
        assert (result.trace[-1].reason or "done") == reason  # a finalize run keeps the stop that asked for it
        driven += 1
    assert driven >= len(proof.reachable) - 1


def test_a_path_the_script_cannot_make_is_left_out_and_named(tmp_path: Path) -> None:
    """A sub-agent's stop cannot be scripted: the writer leaves that path out and says why."""
    from fsm_agent import Agent
    from fsm_agent.testing import FakeModel, demo_registry

    registry = demo_registry()
    registry.register(Agent(FakeModel(), demo_registry()).as_tool("helper", "a helper", on_child_stop="raise"))
    agent = Agent(FakeModel(), registry)
    written = write_tests(check(agent), agent, "nowhere:agent", tmp_path)
    assert "child_stopped" in written.left_out
    assert "child_stopped" not in written.tested
    assert "- child_stopped: needs the guard passes_child_stop holding" in written.path.read_text(encoding="utf-8")
