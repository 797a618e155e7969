"""``runs list --parent RUN_ID``: a run's own sub-agent runs, each with the parent's call that made it, on both stores.

The ``trip`` run calls its sub-agent ``helper`` twice in one turn: call
``c1`` (input ``deep``) whose helper run calls the sub-agent ``deeper``
(call ``d1``: the grandchild ``trip/c1/d1``), and call ``c2`` (input
``fail``) whose helper's model breaks after its note (``Failed``,
``model_error``).  An unrelated run ``alone`` notes once and fails the same
way.  Every agent's one counted tool, ``note``, counts its calls by the text
it was given, which names the agent and its input: one each.
"""

from __future__ import annotations

import sqlite3
import time
from collections import Counter
from collections.abc import Sequence

import pytest

from fsm_agent import Agent, AgentLoopError, Message, ModelResponse, ToolRegistry
from fsm_agent.__main__ import main
from fsm_agent.persist import is_url, open_store
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

NOTES = Counter({"helper:deep": 1, "deeper:deepest": 1, "helper:fail": 1, "alone": 1})
"""Each ``note`` call the runs made, once: the setup ran every tool it was meant to, and none again."""


class Scripted:
    """A sub-agent's model: ``note`` its input (and, given ``deep``, call ``deeper``), then answer or break."""

    def __init__(self, name: str) -> None:
        self.name = name

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema], output: object = None) -> ModelResponse:
        text = next(m.content for m in messages if m.role == "user")
        if not any(m.role == "tool" for m in messages):
            calls = [tool_call("note", id="n1", text=f"{self.name}:{text}")]
            if text == "deep":
                calls.append(tool_call("deeper", id="d1", input="deepest"))
            return tool_turn(*calls)
        if text == "fail":
            msg = f"{self.name}'s model broke"
            raise RuntimeError(msg)
        return reply(f"{self.name} noted {text}")


def _store_runs(target: str) -> Counter[str]:
    """Run ``trip`` (two children, one grandchild) and ``alone`` into the store at ``target``; the notes counted."""
    notes: Counter[str] = Counter()

    def note(text: str) -> str:
        """Note something (counted by its text)."""
        notes[text] += 1
        return "noted"

    below = ToolRegistry()
    below.register(note)
    middle = ToolRegistry()
    middle.register(note)
    middle.register(Agent(Scripted("deeper"), below).as_tool("deeper", "Goes deeper."))
    top = ToolRegistry()
    top.register(Agent(Scripted("helper"), middle).as_tool("helper", "Helps."))
    turn = tool_turn(tool_call("helper", id="c1", input="deep"), tool_call("helper", id="c2", input="fail"))
    trip = Agent(FakeModel(turn, reply("all helped")), top)
    alone = Agent(FakeModel(tool_turn(tool_call("note", id="a1", text="alone")), RuntimeError("broke")), below)
    with open_store(target) as store:
        assert trip.run("plan", store=store, run_id="trip").final == "all helped"
        with pytest.raises(AgentLoopError) as stopped:
            alone.run("alone", store=store, run_id="alone")
        assert stopped.value.reason == "model_error"
    return notes


def _lines(capsys: pytest.CaptureFixture[str], target: str, *more: str) -> tuple[list[list[str]], str]:
    """``runs list`` run to exit 0: its lines split into columns, and its stderr."""
    assert main(["runs", "list", *more, "--store", target]) == 0
    out = capsys.readouterr()
    return [line.split("\t") for line in out.out.splitlines()], out.err


def test_parent_lists_its_two_sub_agent_runs_each_with_its_call_and_nothing_else(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    lines, err = _lines(capsys, store_target, "--parent", "trip")
    assert [(line[0], line[1], line[2], line[-1]) for line in lines] == [
        ("trip/c2", "Failed", "model_error", "call=c2"),
        ("trip/c1", "Done", "done", "call=c1"),
    ]
    assert [len(line) for line in lines] == [7, 7]
    assert err == ""
    # One level: the grandchild is its own parent's, listed under trip/c1 only.
    lines, _ = _lines(capsys, store_target, "--parent", "trip/c1")
    assert [(line[0], line[-1]) for line in lines] == [("trip/c1/d1", "call=d1")]


def test_pages_of_one_after_the_printed_cursor_list_each_child_once(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    first, err = _lines(capsys, store_target, "--parent", "trip", "--limit", "1")
    assert err.startswith("more runs: --after "), err
    second, last = _lines(capsys, store_target, "--parent", "trip", "--limit", "1", *err.split()[2:])
    assert last == ""
    assert [line[0] for line in first + second] == ["trip/c2", "trip/c1"]
    by_offset, _ = _lines(capsys, store_target, "--parent", "trip", "--limit", "1", "--offset", "1")
    assert [line[0] for line in by_offset] == ["trip/c1"]


def test_state_and_reason_narrow_the_parents_listing_not_widen_it(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    failed, _ = _lines(capsys, store_target, "--state", "Failed")
    assert sorted(line[0] for line in failed) == ["alone", "trip/c2"]
    failed, _ = _lines(capsys, store_target, "--parent", "trip", "--state", "Failed")
    assert [(line[0], line[-1]) for line in failed] == [("trip/c2", "call=c2")]
    done, _ = _lines(capsys, store_target, "--parent", "trip", "--reason", "done", "--since", "1h")
    assert [(line[0], line[-1]) for line in done] == [("trip/c1", "call=c1")]
    none, _ = _lines(capsys, store_target, "--parent", "trip", "--session", "no-such-conversation")
    assert none == []


def test_an_unknown_parent_is_an_error_naming_it_and_a_childless_one_lists_nothing(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    assert main(["runs", "list", "--parent", "nobody", "--store", store_target]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    assert out.err.startswith("error: no run 'nobody' in "), out.err
    assert out.err.count("\n") == 1
    assert main(["runs", "list", "--parent", "no\x00body", "--store", store_target]) == 1
    assert "--parent 'no\\x00body' must be text without NUL" in capsys.readouterr().err
    lines, err = _lines(capsys, store_target, "--parent", "alone")
    assert (lines, err) == ([], "")


def test_a_parent_stored_but_unreadable_still_lists_its_sub_agent_runs(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    if is_url(store_target):
        import psycopg

        with psycopg.connect(store_target, autocommit=True) as conn:
            conn.execute("UPDATE fsm_agent_runs SET snapshot = 'not a run' WHERE run_id = 'trip'")
    else:
        with sqlite3.connect(store_target) as db:
            db.execute("UPDATE runs SET snapshot = 'not a run' WHERE run_id = 'trip'")
        db.close()
    assert main(["runs", "show", "trip", "--store", store_target]) == 1
    assert "corrupted" in capsys.readouterr().err
    lines, err = _lines(capsys, store_target, "--parent", "trip")
    assert [(line[0], line[-1]) for line in lines] == [("trip/c2", "call=c2"), ("trip/c1", "call=c1")]
    assert err == ""


def test_lines_without_parent_keep_their_six_columns_byte_for_byte(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert _store_runs(store_target) == NOTES
    assert main(["runs", "list", "--store", store_target]) == 0
    printed = capsys.readouterr().out
    with open_store(store_target) as store:
        runs = store.list_runs(order="created")
    expected = [
        f"{run.run_id}\t{run.state}\t{run.reason}\t{run.tool_calls} tool call{'' if run.tool_calls == 1 else 's'}"
        f"\t{run.tokens} tokens\t{time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(run.updated))}"
        for run in runs
    ]
    assert printed.splitlines() == expected
    assert [line.count("\t") for line in printed.splitlines()] == [5] * 5
    assert "call=" not in printed
