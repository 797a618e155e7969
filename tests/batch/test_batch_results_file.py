"""The ``batch`` command's ``--out`` file: one JSON line per input with the documented fields, nothing dropped.

Each line names the input (``index``, ``run_id``), says how the run ended
(``ok``, ``reason``, ``final``) and holds the whole ``RunResult`` as
``result``, its evidence and usage included.  A run whose agent factory
raises is a failed line, not a crash; bad inputs are refused before
anything runs.  The command runs in this process (``--local``); every call
of the factory, the model and the tool is counted in the ledger directory.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, Message, ModelResponse, ToolRegistry, Usage
from fsm_agent.batch import derive_run_id
from fsm_agent.cli.main import main
from fsm_agent.testing import ManualClock, reply, tool_call, tool_turn
from fsm_agent.tools import JSONSchema

LEDGER = "RESULTS_FILE_LEDGER"
"""The environment variable naming the directory the factory, model and tool count into."""

FAIL_AT = "RESULTS_FILE_FAIL_AT"
"""The factory call (1-based) that raises; the command's own check is call 1."""

HALF_EMOJI = "\ud83d"
"""A lone surrogate, as providers send half an emoji."""


def _count(name: str, line: str) -> int:
    """Append ``line`` to the ledger file ``name``; how many lines it has now."""
    path = Path(os.environ[LEDGER]) / name
    with path.open("a", encoding="utf-8") as log:
        log.write(line + "\n")
    return len(path.read_text(encoding="utf-8").splitlines())


class _Model:
    """One tool call, then an answer; ``loop`` asks for the same call again; ``half`` answers with half an emoji."""

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        question = next(m.content for m in messages if m.role == "user")
        _count("model.log", question)
        results = [m for m in messages if m.role == "tool"]
        if question.startswith("loop") or not results:
            return tool_turn(tool_call("work", id=f"{question}-{len(results)}", topic=question), usage=Usage(3, 2))
        if question.startswith("half"):
            return reply(f"answer {HALF_EMOJI}", usage=Usage(3, 2))
        return reply(f"answer to {question}", usage=Usage(3, 2))


def make_agent() -> Agent:
    """The ``--agent``: raises at the factory call ``$RESULTS_FILE_FAIL_AT`` (if set)."""
    calls = _count("factory.log", "made")
    if str(calls) == os.environ.get(FAIL_AT):
        msg = "no client today"
        raise ConnectionError(msg)
    tools = ToolRegistry()

    @tools.register
    def work(topic: str) -> str:
        """Do some work."""
        _count("tools.log", topic)
        return f"worked on {topic}"

    return Agent(_Model(), tools, max_steps=4, clock=ManualClock())


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines() if path.exists() else []


def _batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, inputs: str, *extra: str) -> int:
    monkeypatch.setenv(LEDGER, str(tmp_path))
    (tmp_path / "in.jsonl").write_text(inputs, encoding="utf-8")
    argv = ["batch", str(tmp_path / "in.jsonl"), "--agent", f"{__name__}:make_agent", "--store",
            str(tmp_path / "runs.db"), "--local", "--quiet", "--out", str(tmp_path / "out.jsonl"), *extra]  # fmt: skip
    return main(argv)


def _rows(tmp_path: Path) -> list[dict[str, Any]]:
    return sorted((json.loads(line) for line in _lines(tmp_path / "out.jsonl")), key=lambda row: row["index"])


def test_every_input_is_one_line_with_its_reason_evidence_and_usage_and_a_factory_error_is_a_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Done, a stop and a factory that raises for one run: one line each, in the documented shape; exit 2."""
    monkeypatch.setenv(FAIL_AT, "3")  # the check (1), input 0 (2), then input 1's run: one at a time, in order
    inputs = '"alpha"\n"beta"\n\n{"input": "loop gamma", "run_id": "mine"}\n"delta"\n'
    assert _batch(tmp_path, monkeypatch, inputs, "--max-in-flight", "1") == 2
    rows = _rows(tmp_path)
    assert [set(row) for row in rows] == [{"index", "run_id", "ok", "reason", "final", "result"}] * 4
    ids = [derive_run_id(0, "alpha"), derive_run_id(1, "beta"), "mine", derive_run_id(3, "delta")]
    assert [(row["index"], row["run_id"]) for row in rows] == list(enumerate(ids))
    assert [(row["ok"], row["reason"]) for row in rows] == [
        (True, "done"),
        (False, "error"),
        (False, "repeated_action"),
        (True, "done"),
    ]
    assert [row["final"] for row in rows] == ["answer to alpha", "", "", "answer to delta"]
    assert all(row["result"]["reason"] == row["reason"] and row["result"]["ok"] == row["ok"] for row in rows)
    assert all("snapshot" not in row["result"] for row in rows)  # kept in the store
    error = rows[1]["result"]["evidence"]
    assert (error["type"], error["error"]) == ("ConnectionError", "no client today")
    assert rows[2]["result"]["evidence"], "a stop's evidence is in its line"
    usage = [(row["result"]["usage"]["input_tokens"], row["result"]["usage"]["output_tokens"]) for row in rows]
    assert usage == [(6, 4), (0, 0), (6, 4), (6, 4)]
    assert sorted(_lines(tmp_path / "tools.log")) == ["alpha", "delta", "loop gamma"]
    table = [line.split() for line in capsys.readouterr().err.splitlines()]
    assert table == [["reason", "runs"], ["done", "2"], ["error", "1"], ["repeated_action", "1"], ["total", "4"]]


def test_a_final_answer_with_half_an_emoji_is_written_and_no_result_is_dropped(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A provider's half emoji in one answer (which the store keeps): that line and every other one are written."""
    assert _batch(tmp_path, monkeypatch, '"first"\n"half"\n"last"\n', "--max-in-flight", "1") == 0
    rows = _rows(tmp_path)
    assert [row["index"] for row in rows] == [0, 1, 2]
    assert rows[1]["final"] == f"answer {HALF_EMOJI}"


@pytest.mark.parametrize(
    ("inputs", "said"),
    [
        ('"a"\n{"input": "b", "run_id": "x"}\n{"input": "c", "run_id": "x"}\n', "inputs 1 and 2 share run_id 'x'"),
        ('"a"\n{"input": "b", "id": "x"}\n', "input 1 has unknown keys ['id']"),
        ('"a"\n"b"\nnot json\n', "in.jsonl:3: not JSON"),
        ('"a"\n{"input": 7}\n', "input 1 needs an 'input' that is a str"),
        ('"a"\n{"input": "b", "run_id": ""}\n', "input 1 has run_id ''"),
        ('"a"\n"b"\n["c"]\n', "input 2 must be a str or a dict"),
        ('"a"\n{"input": "b", "run_id": "x\\u0000y"}\n"c"\n', "input 1: run_id 'x\\x00y' must be text without NUL"),
        ('"a"\n{"input": "b", "run_id": "half\\ud83d"}\n', "input 1: run_id 'half\\ud83d' must be text without NUL"),
        (f'"a"\n{{"input": "b", "run_id": "{"x" * 1025}"}}\n', "input 1: run_id must be at most 1024 bytes"),
    ],
    ids=[
        "duplicate-run-id",
        "unknown-key",
        "not-json",
        "input-not-text",
        "empty-run-id",
        "a-list",
        "run-id-with-nul",
        "run-id-with-half-an-emoji",
        "run-id-too-long",
    ],
)
def test_bad_inputs_are_refused_before_the_agent_the_store_or_the_out_file_is_touched(
    inputs: str, said: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Exit 1 naming the entry; no factory call, no store created, the previous --out file kept as it was."""
    (tmp_path / "out.jsonl").write_text("kept\n", encoding="utf-8")
    assert _batch(tmp_path, monkeypatch, inputs) == 1
    assert said in capsys.readouterr().err
    assert not (tmp_path / "factory.log").exists()
    assert not (tmp_path / "model.log").exists()
    assert not (tmp_path / "runs.db").exists()
    assert _lines(tmp_path / "out.jsonl") == ["kept"]


def test_a_second_pass_rewrites_every_line_from_the_store_without_a_model_or_tool_call(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same command again: the same lines (in input order here), and no model or tool call is made."""
    inputs = '"alpha"\n"loop beta"\n"gamma"\n'
    assert _batch(tmp_path, monkeypatch, inputs, "--max-in-flight", "1") == 2
    first = _rows(tmp_path)
    made = (_lines(tmp_path / "model.log"), _lines(tmp_path / "tools.log"))
    assert _batch(tmp_path, monkeypatch, inputs, "--max-in-flight", "1") == 2
    assert _rows(tmp_path) == first
    assert (_lines(tmp_path / "model.log"), _lines(tmp_path / "tools.log")) == made
