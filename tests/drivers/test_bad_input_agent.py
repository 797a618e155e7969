"""What ``Agent(...)``, ``run``/``arun``, ``resume``/``aresume`` and the tools accept from the user.

A mistake is an error naming the argument, raised before the model or a
tool is called and before a run is written to its store; nothing given is
silently ignored.  Tools count their calls, the scripted model its replies.
"""

from __future__ import annotations

import asyncio
import io
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, AgentRun, RunResult, SqliteStore, ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["run", "arun"]


class Counted:
    """Two tools, ``send`` and ``add``, each counting its calls."""

    def __init__(self) -> None:
        self.calls: dict[str, int] = {"send": 0, "add": 0}

    def tools(self) -> list[Callable[..., Any]]:
        calls = self.calls

        def send(to: str) -> str:
            """Send a message."""
            calls["send"] += 1
            return f"sent to {to}"

        def add(a: int, b: int) -> int:
            """Add two numbers."""
            calls["add"] += 1
            return a + b

        return [send, add]


def _send_then_answer() -> FakeModel:
    return FakeModel(tool_turn(tool_call("send", id="s1", to="ada")), reply("Sent."))


def _drive(agent: Agent, driver: str, question: str = "go", **options: Any) -> RunResult:
    if driver == "run":
        return agent.run(question, **options)
    return asyncio.run(agent.arun(question, **options))


# --- names that match nothing -------------------------------------------------------------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_approve_naming_no_tool_is_refused_before_the_unapproved_call_runs(driver: str) -> None:
    """``approve={"sned"}`` (meant: send): refused with a ValueError naming it, at construction or at the run's start.

    Accepted, it is silently ignored and the call the user wanted a person
    to approve runs unapproved.
    """
    counted = Counted()
    with pytest.raises(ValueError, match="sned"):
        _drive(Agent(_send_then_answer(), counted.tools(), approve={"sned"}), driver)
    assert counted.calls["send"] == 0


@pytest.mark.parametrize("driver", DRIVERS)
def test_max_tool_calls_for_no_such_tool_is_refused_before_a_call(driver: str) -> None:
    """``max_tool_calls={"sned": 0}`` (meant: send): a ValueError naming it, not a cap that never applies."""
    counted = Counted()
    with pytest.raises(ValueError, match="sned"):
        _drive(Agent(_send_then_answer(), counted.tools(), max_tool_calls={"sned": 0}), driver)
    assert counted.calls["send"] == 0


# --- arguments of the wrong type: an error naming them, before anything happens ----------------------------


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_log_that_cannot_take_text_is_refused_before_the_run_starts(driver: str, tmp_path: Path) -> None:
    """``log=`` a binary file: a TypeError naming log before the model is called; no run left in the store."""
    model = _send_then_answer()
    counted = Counted()
    with SqliteStore(tmp_path / "runs.db") as store:
        with pytest.raises(TypeError, match="log"):
            _drive(Agent(model, counted.tools()), driver, log=io.BytesIO(), store=store, run_id="r1")
        assert store.list_runs() == []
    assert model.seen == []
    assert counted.calls["send"] == 0


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_store_of_the_wrong_type_is_a_type_error_naming_store(driver: str) -> None:
    """``store=3``: a TypeError naming ``store`` and what it takes; the model is never called."""
    model = FakeModel(reply("hi"))
    with pytest.raises(TypeError, match="store"):
        _drive(Agent(model, []), driver, store=3)
    assert model.seen == []


def _paused(tmp_path: Path) -> tuple[SqliteStore, Counted, dict[str, Any]]:
    """A store holding run ``p1`` paused on ``send`` (s1); the tools' counter; the stored snapshot."""
    store = SqliteStore(tmp_path / "runs.db")
    counted = Counted()
    result = Agent(_send_then_answer(), counted.tools(), approve={"send"}).run("go", store=store, run_id="p1")
    assert result.reason == "paused"
    return store, counted, store.load("p1")


def _resume(agent: Agent, driver: str, source: Any, **options: Any) -> AgentRun:
    if driver == "run":
        return agent.resume(source, **options)
    return asyncio.run(agent.aresume(source, **options))


@pytest.mark.parametrize("driver", DRIVERS)
def test_approvals_that_are_no_mapping_are_a_type_error_naming_approvals(driver: str, tmp_path: Path) -> None:
    """``approvals=[("s1", True)]``: a TypeError naming approvals; the stored run unchanged and not claimed."""
    store, counted, before = _paused(tmp_path)
    with store:
        agent = Agent(_send_then_answer(), counted.tools(), approve={"send"})
        with pytest.raises(TypeError, match="approvals"):
            _resume(agent, driver, before, approvals=[("s1", True)], store=store)
        after = store.load("p1")
    assert (after["stored_seq"], after["approvals"]) == (before["stored_seq"], {})
    assert counted.calls["send"] == 0


@pytest.mark.parametrize("driver", DRIVERS)
def test_a_decision_on_no_pending_call_is_refused_and_the_stored_run_unchanged(driver: str, tmp_path: Path) -> None:
    """``approvals={"zz": True}``: a ValueError naming zz and the pending calls; nothing stored, nothing run."""
    store, counted, before = _paused(tmp_path)
    with store:
        agent = Agent(FakeModel(reply("Sent.")), counted.tools(), approve={"send"})  # the model's next reply
        with pytest.raises(ValueError, match=r"'zz' \(pending: s1\)"):
            _resume(agent, driver, before, approvals={"zz": True, "s1": True}, store=store)
        after = store.load("p1")
        # Refused whole: the valid decision beside it was not applied either, and a later resume can claim the run.
        assert (after["stored_seq"], after["approvals"], after["paused"]) == (before["stored_seq"], {}, True)
        assert counted.calls["send"] == 0
        resumed = _resume(agent, driver, after, approvals={"s1": True}, store=store)
        assert resumed.finish().final == "Sent."
    assert counted.calls["send"] == 1


@pytest.mark.parametrize("driver", DRIVERS)
@pytest.mark.parametrize(("name", "value"), [("max_steps", 0), ("timeout", -1.0), ("token_budget", "many")])
def test_a_bad_new_limit_on_resume_names_the_argument_not_the_snapshot(
    driver: str, name: str, value: Any, tmp_path: Path
) -> None:
    """``resume(..., max_steps=0)``: a ValueError about max_steps; the snapshot is fine and must not be blamed."""
    store, counted, before = _paused(tmp_path)
    with store:
        agent = Agent(_send_then_answer(), counted.tools(), approve={"send"})
        with pytest.raises(ValueError, match=name) as refused:
            _resume(agent, driver, before, store=store, **{name: value})
        assert "snapshot" not in str(refused.value)
        assert store.load("p1")["stored_seq"] == before["stored_seq"]


# --- errors that do not name what the user got wrong --------------------------------------------------------


def _fork_source() -> RunResult:
    return Agent(FakeModel(tool_turn(tool_call("add", id="k", a=2, b=2)), reply("4")), Counted().tools()).run("q")


def _fork_with_rerun_3() -> object:
    return Agent(FakeModel(reply("x")), Counted().tools()).fork(_fork_source(), 1, rerun=3)  # type: ignore[arg-type]


CASES: list[tuple[str, Callable[[], object], str]] = [
    ("approve=3", lambda: Agent(FakeModel(), [], approve=3), "approve"),  # type: ignore[arg-type]
    ("register(3)", lambda: ToolRegistry().register(3), "tool"),  # type: ignore[arg-type]
    ("register(name=3)", lambda: ToolRegistry().register(lambda x: x, name=3), "name"),  # type: ignore[arg-type]
    ("fork(rerun=3)", _fork_with_rerun_3, "rerun"),
]


@pytest.mark.parametrize(("given", "call", "named"), CASES, ids=[case[0] for case in CASES])
def test_a_value_of_the_wrong_type_is_an_error_naming_the_argument(
    given: str, call: Callable[[], object], named: str
) -> None:
    """Each is a TypeError or ValueError whose message names the argument at fault, not one from deep inside."""
    with pytest.raises((TypeError, ValueError)) as refused:
        call()
    assert named in str(refused.value), f"{given}: {refused.value!r}"
