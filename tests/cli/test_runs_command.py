"""``python -m fsm_agent runs``: list, show and resume runs checkpointed with ``run --store``."""

from __future__ import annotations

import contextlib
import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body, openai_tool_call
from support.store_cases import tick_agent

from fsm_agent import Agent, AgentLoopError, SqliteStore
from fsm_agent.__main__ import main
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn

KEY = "sk-test-runs-0a1b2c3d4e5f"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK finds its key in the environment."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _calculate(expression: str) -> dict[str, Any]:
    """The recorded OpenAI tool-call body, asking the built-in calculator."""
    return openai_tool_call("calculate", {"expression": expression})


def _model(server: ProviderServer) -> list[str]:
    return ["--model", "openai:gpt-4o-mini", "--base-url", f"{server.url}/v1"]


def _listed(out: str) -> list[tuple[str, ...]]:
    """``runs list`` lines without their last column (the time of the last save)."""
    return [tuple(line.split("\t")[:-1]) for line in out.splitlines()]


def test_a_stopped_run_is_listed_shown_and_resumed_with_a_new_limit(
    provider_server: ProviderServer, store_target: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run --store (file or URL) stops on max_steps; runs list/show report it; runs resume --max-steps finishes it."""
    store = store_target
    provider_server.queue(_calculate("2+3"))
    code = main(
        ["run", "q", *_model(provider_server), "--max-steps", "1", "--store", store, "--run-id", "r1", "--quiet"]
    )
    assert code == 2
    capsys.readouterr()
    assert main(["runs", "list", "--store", store]) == 0
    assert _listed(capsys.readouterr().out) == [("r1", "Failed", "max_steps", "1 tool call", "99 tokens")]
    diagram = tmp_path / "r1.dot"
    assert main(["runs", "show", "r1", "--store", store, "--diagram", str(diagram)]) == 0
    shown = capsys.readouterr().out
    assert "run r1: Failed, reason max_steps" in shown
    assert "ExecuteTool -> Failed [max_steps]" in shown
    assert "digraph" in diagram.read_text(encoding="utf-8")
    provider_server.queue(body("openai", "final_answer"))
    code = main(["runs", "resume", "r1", *_model(provider_server), "--store", store, "--max-steps", "4", "--quiet"])
    out = capsys.readouterr()
    assert (code, out.out) == (0, "(2+3)*4 = 20\n"), out.err
    main(["runs", "list", "--store", store])
    assert _listed(capsys.readouterr().out)[0][:3] == ("r1", "Done", "done")


def test_resume_refuses_a_stop_the_new_limits_do_not_lift(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Resuming a max_steps stop without a larger limit is one clear error line, exit 1."""
    store = str(tmp_path / "runs.db")
    provider_server.queue(_calculate("1+1"))
    main(["run", "q", *_model(provider_server), "--max-steps", "1", "--store", store, "--run-id", "r2", "--quiet"])
    capsys.readouterr()
    assert main(["runs", "resume", "r2", *_model(provider_server), "--store", store]) == 1
    assert "which these limits do not lift" in capsys.readouterr().err


def test_unknown_store_or_run_is_one_line(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A missing store file or run id is reported in one line with exit 1."""
    assert main(["runs", "list", "--store", str(tmp_path / "none.db")]) == 1
    assert capsys.readouterr().err.startswith("error: no store at")
    store = tmp_path / "empty.db"
    SqliteStore(store).close()
    assert main(["runs", "show", "ghost", "--store", str(store)]) == 1
    assert "no run 'ghost'" in capsys.readouterr().err


def test_run_id_reuse_and_an_empty_run_id_are_one_line_errors(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run --run-id naming a stored run, or an empty one, exits 1 with one line; the stored run is untouched."""
    store = str(tmp_path / "runs.db")
    provider_server.queue(_calculate("2+3"))
    main(["run", "q", *_model(provider_server), "--max-steps", "1", "--store", store, "--run-id", "job", "--quiet"])
    capsys.readouterr()
    assert main(["run", "other", *_model(provider_server), "--store", store, "--run-id", "job", "--quiet"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert "--run-id: run 'job' already exists" in err
    assert main(["run", "other", *_model(provider_server), "--store", store, "--run-id", "", "--quiet"]) == 1
    assert "run_id must not be empty" in capsys.readouterr().err
    with SqliteStore(store) as opened:
        assert opened.load("job")["messages"][-3]["content"] == "q"


def test_runs_list_counts_tool_calls_not_step_records(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A run that made two tool calls and answered is listed with 2 tool calls, not 3 "steps" (a step is a turn)."""
    model = FakeModel([tool_turn(tool_call("add", a=1, b=2), tool_call("add", a=3, b=4)), reply("3 and 7")])
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(model, demo_registry()).run("two sums", store=store, run_id="two_calls")
    assert main(["runs", "list", "--store", str(tmp_path / "runs.db")]) == 0
    assert _listed(capsys.readouterr().out) == [("two_calls", "Done", "done", "2 tool calls", "0 tokens")]


def test_runs_list_filters_and_pages_and_prune_forgets_finished_runs(
    store_target: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--state, --reason, --since, --limit/--offset select runs; prune --older-than deletes only finished ones."""
    with open_store(store_target) as store:
        for name in ("a", "b", "c"):
            tick_agent(1).run("go", store=store, run_id=name)
        with pytest.raises(AgentLoopError):
            tick_agent(3, max_steps=1).run("go", store=store, run_id="stopped")
        tick_agent(3, approve={"tick"}).run("go", store=store, run_id="paused")
    assert main(["runs", "list", "--store", store_target, "--state", "Failed"]) == 0
    assert [row[0] for row in _listed(capsys.readouterr().out)] == ["stopped"]
    main(["runs", "list", "--store", store_target, "--reason", "done", "--limit", "2"])
    out = capsys.readouterr()
    assert [row[0] for row in _listed(out.out)] == ["c", "b"]
    assert out.err.startswith("more runs: --after ")
    assert out.err.endswith(":b\n")
    main(["runs", "list", "--store", store_target, "--reason", "done", "--limit", "2", *out.err.split()[2:]])
    assert [row[0] for row in _listed(capsys.readouterr().out)] == ["a"]
    main(["runs", "list", "--store", store_target, "--reason", "done", "--limit", "2", "--offset", "0"])
    out = capsys.readouterr()
    assert ([row[0] for row in _listed(out.out)], out.err) == (["c", "b"], "more runs: --offset 2\n")
    main(["runs", "list", "--store", store_target, "--reason", "done", "--limit", "2", "--offset", "2"])
    assert [row[0] for row in _listed(capsys.readouterr().out)] == ["a"]
    main(["runs", "list", "--store", store_target, "--since", "1h"])
    assert _listed(capsys.readouterr().out)[0][:2] == ("paused", "awaiting approval")
    main(["runs", "list", "--store", store_target, "--since", "2999-01-01"])
    assert capsys.readouterr().out == ""
    assert main(["runs", "prune", "--store", store_target, "--older-than", "1d"]) == 0
    assert capsys.readouterr().out == "deleted 0 finished runs\n"
    assert main(["runs", "prune", "--store", store_target, "--older-than", "0"]) == 0
    assert capsys.readouterr().out == "deleted 4 finished runs\n"
    main(["runs", "list", "--store", store_target])
    assert [row[0] for row in _listed(capsys.readouterr().out)] == ["paused"]


def _hand_written(path: Path, run_id: str, **counters: Any) -> None:
    """Store as ``run_id`` a finished run's snapshot with ``counters`` changed, by SQL, as an older version might."""
    with SqliteStore(path) as store:
        Agent(FakeModel([reply("hi")]), demo_registry()).run("go", store=store, run_id="good")
        snapshot = {k: v for k, v in store.load("good").items() if k != "stored_seq"}
    snapshot["counters"].update(counters)
    with contextlib.closing(sqlite3.connect(path)) as db, db:
        db.execute(
            "INSERT INTO runs (run_id, snapshot, state, reason, paused, updated, steps, tokens, seq, base_seq)"
            " VALUES (?, ?, 'Done', 'done', 0, 1.0, 1, 0, 0, 0)",
            (run_id, json.dumps(snapshot)),
        )


@pytest.mark.parametrize("field", ["input_tokens", "output_tokens", "turns", "tool_calls"])
def test_runs_show_of_a_stored_run_with_a_negative_counter_is_one_line_naming_run_and_field(
    field: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A counter below zero in a hand-written row: exit 1, one line naming the run and counters.<field>."""
    _hand_written(tmp_path / "runs.db", "tampered", **{field: -5})
    assert main(["runs", "show", "tampered", "--store", str(tmp_path / "runs.db")]) == 1
    out = capsys.readouterr()
    assert out.out == ""
    (line,) = out.err.splitlines()
    assert line.startswith("error: stored run 'tampered' is corrupted: ")
    assert f"counters.{field} must be a whole number >= 0, got -5" in line


@pytest.mark.parametrize(
    ("flag", "value"), [("--reason", "\udcff"), ("--state", "Done\x00"), ("--session", "chat\ud800")]
)
def test_runs_list_with_a_filter_no_store_can_compare_is_one_line_naming_the_flag(
    flag: str, value: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A byte like 0xff in argv (a lone surrogate once decoded) or a NUL: exit 1, one line naming the flag."""
    SqliteStore(tmp_path / "runs.db").close()
    assert main(["runs", "list", "--store", str(tmp_path / "runs.db"), flag, value]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line == f"error: runs list: {flag} {value!r} must be text without NUL or lone surrogates"


@pytest.mark.parametrize("where", ["text file", "directory", "unwritable place", "unreachable server"])
def test_a_store_that_cannot_be_opened_is_one_line(
    where: str, tmp_path: Path, unused_port: int, capsys: pytest.CaptureFixture[str]
) -> None:
    """A text file, a directory, a place nobody may write or a server nobody answers: one line naming it, exit 1."""
    target = {
        "text file": str(tmp_path / "notes.txt"),
        "directory": str(tmp_path),
        "unwritable place": "/proc/self/status",  # read-only even for root, which ignores file modes
        "unreachable server": f"postgresql://fsm@127.0.0.1:{unused_port}/x?connect_timeout=3",
    }[where]
    (tmp_path / "notes.txt").write_text("not a database\n" * 50, encoding="utf-8")
    if where == "unreachable server":
        pytest.importorskip("psycopg")
    assert main(["runs", "list", "--store", target]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert err.startswith("error: --store ")
    assert "is not a usable" in err
