"""Batches without Ray: ids, order, stops as results, resuming, cancelling, the progress text and the batch command."""

from __future__ import annotations

import copy
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.batch_agents import MODEL_LOG, TOOL_LOG, counts, factory, lines, tag
from support.provider_server import ProviderServer, body

from fsm_agent import CancelToken, RunResult, SqliteStore
from fsm_agent.batch import BatchItem, Tally, batch_items, derive_run_id, iter_batch, run_batch
from fsm_agent.cli.main import main

TESTS = Path(__file__).resolve().parent.parent


def _questions(n: int) -> list[str]:
    return [f"question {i}" for i in range(n)]


def test_run_ids_come_from_position_and_content_and_are_stable() -> None:
    """The same input at the same position has the same id; another position or text gives another id."""
    assert derive_run_id(3, "q") == derive_run_id(3, "q")
    assert len({derive_run_id(3, "q"), derive_run_id(4, "q"), derive_run_id(3, "r")}) == 3
    items = batch_items(["q", {"input": "q"}, {"input": "r", "run_id": "mine"}])
    assert [item.run_id for item in items[:2]] == [derive_run_id(0, "q"), derive_run_id(1, "q")]
    assert items[2] == BatchItem(2, "r", "mine")


@pytest.mark.parametrize(
    ("inputs", "error", "match"),
    [
        ("one string", TypeError, "single str"),
        ([3], TypeError, "input 0 must be a str or a dict"),
        ([{"text": "q"}], ValueError, r"unknown keys \['text'\]"),
        ([{"input": 5}], TypeError, "needs an 'input' that is a str"),
        ([{"input": "a", "run_id": "x"}, {"input": "b", "run_id": "x"}], ValueError, "inputs 0 and 1 share run_id"),
    ],
    ids=["bare-string", "not-text", "unknown-key", "input-not-text", "duplicate-id"],
)
def test_bad_inputs_are_refused_before_any_run_starts(inputs: object, error: type, match: str, tmp_path: Path) -> None:
    """Every input is checked up front, and the message names the entry at fault."""
    with pytest.raises(error, match=match):
        run_batch(factory(tmp_path), inputs, store=tmp_path / "runs.db", executor="local", progress=False)  # type: ignore[arg-type]
    assert not lines(tmp_path / MODEL_LOG)


def test_results_come_back_in_input_order_and_stops_are_results(tmp_path: Path) -> None:
    """One result per input, in input order; a run that stops is a result with its reason, not an exception."""
    inputs = ["question 0", "loop 1", "question 2", {"input": "question 3", "run_id": "custom"}]
    results = run_batch(factory(tmp_path), inputs, store=tmp_path / "runs.db", executor="local", progress=False)
    assert [r.reason for r in results] == ["done", "repeated_action", "done", "done"]
    assert [r.final for r in results if r.ok] == [f"answer to question {i}" for i in (0, 2, 3)]
    assert isinstance(results[1], RunResult)
    assert results[1].snapshot is not None


@pytest.mark.parametrize("executor", ["ray", "local"])
def test_an_empty_batch_returns_no_results_and_starts_nothing(executor: str, tmp_path: Path) -> None:
    """No inputs: an empty list, without opening the store or starting Ray."""
    assert run_batch(factory(tmp_path), [], store=tmp_path / "runs.db", executor=executor, progress=False) == []  # type: ignore[arg-type]
    assert not (tmp_path / "runs.db").exists()


def test_a_finished_batch_run_again_makes_no_model_call(tmp_path: Path) -> None:
    """Rerunning a batch returns every ended run from the store: the counting model is not called once."""
    store = tmp_path / "runs.db"
    first = run_batch(factory(tmp_path), _questions(6), store=store, executor="local", progress=False)
    calls = len(lines(tmp_path / MODEL_LOG))
    again = run_batch(factory(tmp_path), _questions(6), store=store, executor="local", progress=False)
    assert again == first
    assert len(lines(tmp_path / MODEL_LOG)) == calls


@pytest.mark.slow
def test_a_half_finished_batch_resumes_without_rerunning_the_finished_runs(tmp_path: Path) -> None:
    """Runs finished before are not called again; a run cut mid-way continues from its checkpoint."""
    store = tmp_path / "runs.db"
    questions = _questions(8)
    run_batch(factory(tmp_path), questions[:4], store=store, executor="local", progress=False)
    # Run 5 was cut after its first tool call, as a dead worker would leave it.
    owner = SqliteStore(store, lease=0.5)  # the dead worker's lease lapses soon; the batch waits for that
    cut = factory(tmp_path)().start(questions[5], store=owner, run_id=derive_run_id(5, questions[5]))
    for _ in range(4):
        cut.advance()
    before = counts(tmp_path / MODEL_LOG)
    results = run_batch(factory(tmp_path), questions, store=store, executor="local", progress=False)
    assert [r.reason for r in results] == ["done"] * 8, results[5].evidence
    new = counts(tmp_path / MODEL_LOG) - before
    assert not any(key.startswith(tuple(tag(q) for q in questions[:4])) for key in new)
    assert sorted(k for k in new if k.startswith(tag(questions[5]))) == [f"{tag(questions[5])} {t}" for t in (1, 2, 3)]
    assert all(n == 1 for n in counts(tmp_path / TOOL_LOG).values())


def test_a_cancelled_batch_reports_every_input_and_a_rerun_finishes_it(tmp_path: Path) -> None:
    """After cancel, runs in flight stop at their next check and unstarted ones end cancelled; rerunning completes."""
    store = tmp_path / "runs.db"
    token = CancelToken()
    seen: list[RunResult] = []
    for _, result in iter_batch(
        factory(tmp_path, latency=0.02), _questions(12), store=store, executor="local", max_in_flight=2, cancel=token
    ):
        seen.append(result)
        if len(seen) == 2:
            token.cancel("enough")
    assert len(seen) == 12
    assert {r.reason for r in seen[2:]} <= {"cancelled", "done"}
    assert any(r.evidence.get("started") is False for r in seen)
    again = run_batch(factory(tmp_path), _questions(12), store=store, executor="local", progress=False)
    assert all(r.ok for r in again)
    assert all(n == 1 for n in counts(tmp_path / TOOL_LOG).values())


def test_the_tally_line_and_table_say_done_failed_by_reason_and_in_flight() -> None:
    """The progress text is a pure function of the counts."""
    tally = Tally(5)
    item = BatchItem(0, "q", "r")
    for _ in range(4):
        tally.start(item)
    for _ in range(3):
        tally.end(item)
    tally.finish(RunResult((), (), "a"))
    tally.finish(RunResult((), (), "", reason="max_steps"))
    tally.finish(RunResult((), (), "", reason="error"))
    assert tally.line() == "done 1 · failed 2 (error 1, max_steps 1) · in flight 1"
    assert tally.table().splitlines() == [
        "reason       runs",
        "done            1",
        "error           1",
        "max_steps       1",
        "not run         2",
        "total           5",
    ]


def _command(tmp_path: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "fsm_agent", "batch", str(tmp_path / "in.jsonl"),
            "--agent", "support.batch_agents:cli_agent", "--store", str(tmp_path / "runs.db"), "--local",
            "--out", str(tmp_path / "out.jsonl"), *extra]  # fmt: skip


def _interruptible() -> None:
    """Give the command Ctrl-C's default action: a suite started in the background (``cmd &``) ignores SIGINT, and
    a child would inherit that."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _environment(tmp_path: Path, latency: float = 0.0) -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(TESTS), "BATCH_LEDGER": str(tmp_path), "BATCH_LATENCY": str(latency)}


@pytest.mark.subprocess
def test_the_batch_command_writes_results_shows_its_bar_and_sums_up(tmp_path: Path) -> None:
    """Results as JSON lines, a progress bar whose last line counts every run, a table of reasons, exit 2 on a stop."""
    (tmp_path / "in.jsonl").write_text('"question 0"\n{"input": "loop 1"}\n\n"question 2"\n')
    done = subprocess.run(_command(tmp_path), env=_environment(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted((r["index"], r["reason"]) for r in rows) == [(0, "done"), (1, "repeated_action"), (2, "done")]
    bar = [part for part in done.stderr.replace("\r", "\n").splitlines() if "runs |" in part]
    assert bar[-1].startswith("3/3 runs |")
    assert "done 2 · failed 1 (repeated_action 1) · in flight 0" in bar[-1]
    assert "repeated_action       1" in done.stderr
    (tmp_path / "in.jsonl").write_text('"question 0"\n"question 2"\n')
    assert subprocess.run(_command(tmp_path, "--quiet"), env=_environment(tmp_path), timeout=60).returncode == 0


@pytest.mark.subprocess
def test_ctrl_c_stops_the_batch_command_cleanly_and_a_rerun_resumes(tmp_path: Path) -> None:
    """SIGINT mid-batch: exit 130 saying how to resume; the rerun finishes, repeating at most the calls in flight."""
    (tmp_path / "in.jsonl").write_text("".join(f'"question {i}"\n' for i in range(40)))
    env = _environment(tmp_path, latency=0.05)
    command = [*_command(tmp_path), "--max-in-flight", "4"]
    batch = subprocess.Popen(command, env=env, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible)
    deadline = time.monotonic() + 30
    while len(lines(tmp_path / MODEL_LOG)) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    batch.send_signal(signal.SIGINT)
    _, err = batch.communicate(timeout=30)
    assert batch.returncode == 130, err
    assert "run the same command again to resume them" in err
    finished = len((tmp_path / "out.jsonl").read_text().splitlines())
    assert finished < 40
    again = subprocess.run(_command(tmp_path, "--quiet"), env=env, capture_output=True, text=True, timeout=60)
    assert again.returncode == 0, again.stderr
    rows = [json.loads(line) for line in (tmp_path / "out.jsonl").read_text().splitlines()]
    assert sorted(r["index"] for r in rows) == list(range(40))
    assert all(r["reason"] == "done" for r in rows)
    executed = counts(tmp_path / TOOL_LOG)
    assert len(executed) == 40 * 3
    # Only a call in flight at the interrupt may run again: at most one per run in flight.
    assert sum(n - 1 for n in executed.values()) <= 4


@pytest.mark.subprocess
def test_the_batch_command_reports_a_bad_input_line_as_a_setup_error(tmp_path: Path) -> None:
    """A line that is not JSON is exit 1 and one line naming the file and line number."""
    (tmp_path / "in.jsonl").write_text('"fine"\nnot json\n')
    done = subprocess.run(_command(tmp_path), env=_environment(tmp_path), capture_output=True, text=True, timeout=60)
    assert done.returncode == 1
    assert f"{tmp_path / 'in.jsonl'}:2: not JSON" in done.stderr


def test_the_batch_command_with_model_runs_the_provider_adapter_in_each_run(
    provider_server: ProviderServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``--model`` builds the run command's agent for every run: two questions, two requests, both answered."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test")
    answer = copy.deepcopy(body("openai", "final_answer"))
    provider_server.queue(answer, answer)
    (tmp_path / "in.jsonl").write_text('"one"\n"two"\n')
    model = ["--model", "openai:gpt-4o-mini", "--base-url", f"{provider_server.url}/v1", "--max-retries", "0"]
    out = tmp_path / "out.jsonl"
    argv = ["batch", str(tmp_path / "in.jsonl"), *model, "--store", str(tmp_path / "runs.db"), "--local", "--quiet"]
    assert main([*argv, "--out", str(out)]) == 0
    assert len(provider_server.bodies()) == 2
    assert [json.loads(line)["reason"] for line in out.read_text().splitlines()] == ["done", "done"]


@pytest.mark.subprocess
@pytest.mark.ray
def test_ctrl_c_on_ray_checkpoints_the_runs_in_flight_and_a_rerun_on_ray_finishes_with_its_bar(tmp_path: Path) -> None:
    """Without --local the command starts its own Ray instance; SIGINT stops it, and the same command resumes it."""
    pytest.importorskip("ray", reason="the ray extra is installed by `make test`")
    (tmp_path / "in.jsonl").write_text("".join(f'"question {i}"\n' for i in range(16)))
    command = [arg for arg in _command(tmp_path) if arg != "--local"]
    env = _environment(tmp_path, latency=0.2)
    batch = subprocess.Popen(
        [*command, "--max-in-flight", "4"], env=env, stderr=subprocess.PIPE, text=True, preexec_fn=_interruptible
    )
    deadline = time.monotonic() + 90
    while len(lines(tmp_path / MODEL_LOG)) < 12 and time.monotonic() < deadline:
        time.sleep(0.05)
    batch.send_signal(signal.SIGINT)
    _, err = batch.communicate(timeout=60)
    assert batch.returncode == 130, err
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) < 16
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert len((tmp_path / "out.jsonl").read_text().splitlines()) == 16
    executed = counts(tmp_path / TOOL_LOG)
    assert len(executed) == 16 * 3
    assert sum(n - 1 for n in executed.values()) <= 4  # only calls in flight at the interrupt may run again
    bar = [part for part in done.stderr.replace("\r", "\n").splitlines() if "runs |" in part]
    assert bar[-1].startswith("16/16 runs |")
    assert "done 16 · failed 0 · in flight 0" in bar[-1]
