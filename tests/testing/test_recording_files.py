"""Recordings as files: ``runs export`` and what reading a broken or foreign recording says.

``RecordingError``'s contract (API reference): "A recording that cannot be
read: not JSON, another format, a version this release does not know, or
malformed."  The command line's (reference/cli.md): exit 1 is "a set-up or
usage error: one line on stderr naming what is at fault".
"""

from __future__ import annotations

import copy
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.persist.recording import RecordingError, read_recording
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn
from fsm_agent.testing.replay import RecordingFile, replay


class Counted:
    """``add``, counting its executions."""

    def __init__(self) -> None:
        self.calls = 0

    def agent(self, model: FakeModel) -> Agent:
        registry = ToolRegistry()

        def add(a: float, b: float) -> float:
            """Add two numbers."""
            self.calls += 1
            return a + b

        registry.register(add)
        return Agent(model, registry, system="s \ud83d")


def _stored(path: Path, question: str = "q") -> dict[str, Any]:
    counted = Counted()
    with SqliteStore(path) as store:
        counted.agent(FakeModel(tool_turn(tool_call("add", id="c1", a=2, b=3)), reply("5 \udc00"))).run(
            question, store=store, run_id="r"
        )
        return store.export("r")


def _run_cli(*arguments: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PYTHONIOENCODING": "utf-8"}
    return subprocess.run(
        [sys.executable, "-m", "fsm_agent", *arguments], capture_output=True, text=True, env=env, check=False
    )


def test_runs_export_to_stdout_round_trips_lone_surrogates_and_replays_with_no_call(tmp_path: Path) -> None:
    """``runs export --out -`` in a subprocess: the text parses, equals store.export, and replays clean."""
    exported = _stored(tmp_path / "runs.db", question="half an emoji \ud83d")
    done = _run_cli("runs", "export", "r", "--store", str(tmp_path / "runs.db"), "--out", "-")
    assert done.returncode == 0, done.stderr
    assert done.stdout.isascii()  # the lone surrogates are JSON escapes
    recording = read_recording(done.stdout)
    assert recording == exported
    assert recording["messages"][1]["content"] == "half an emoji \ud83d"
    counted = Counted()
    unused = FakeModel()
    assert replay(counted.agent(unused), recording).final == "5 \udc00"
    assert (counted.calls, unused.seen) == (0, [])


def test_runs_export_of_a_missing_run_is_one_line_and_writes_no_file(tmp_path: Path) -> None:
    _stored(tmp_path / "runs.db")
    out = tmp_path / "deep" / "r.json"
    done = _run_cli("runs", "export", "nope", "--store", str(tmp_path / "runs.db"), "--out", str(out))
    assert done.returncode == 1
    assert done.stderr.count("\n") == 1, done.stderr
    assert "no run 'nope'" in done.stderr
    assert not out.exists()
    assert not out.parent.exists()


@pytest.mark.parametrize("where", ["a directory", "under a file"])
def test_runs_export_to_a_path_it_cannot_write_is_one_line(tmp_path: Path, where: str) -> None:
    _stored(tmp_path / "runs.db")
    (tmp_path / "afile").write_text("x")
    out = tmp_path if where == "a directory" else tmp_path / "afile" / "r.json"
    done = _run_cli("runs", "export", "r", "--store", str(tmp_path / "runs.db"), "--out", str(out))
    assert done.returncode == 1
    assert done.stderr.startswith("error: "), done.stderr
    assert done.stderr.count("\n") == 1, done.stderr


def test_a_truncated_recording_file_is_a_recording_error_through_the_fixture(tmp_path: Path) -> None:
    """What the ``fsm_recording`` fixture reads: a file cut short says it is not valid JSON; nothing runs."""
    text = json.dumps(_stored(tmp_path / "runs.db"))
    path = tmp_path / "recordings" / "cut.json"
    path.parent.mkdir()
    path.write_text(text[: len(text) // 2], encoding="utf-8")
    counted = Counted()
    unused = FakeModel()
    with pytest.raises(RecordingError, match="recording is not valid JSON"):
        RecordingFile(path)(counted.agent(unused))
    assert (counted.calls, unused.seen) == (0, [])


@pytest.mark.parametrize(("version", "shown"), [(0, "0"), (2, "2"), ("1", "'1'"), (None, "None")])
def test_a_version_this_release_does_not_read_is_named(tmp_path: Path, version: Any, shown: str) -> None:
    recording = {**_stored(tmp_path / "runs.db"), "version": version}
    with pytest.raises(RecordingError, match=rf"unsupported recording \('fsm_agent.Recording', {shown}\)"):
        read_recording(json.dumps(recording))


def _children_a_list(r: dict[str, Any]) -> None:
    r["children"] = [1]


def _tool_call_without_result(r: dict[str, Any]) -> None:
    del r["tool_calls"][0]["result"]


def _no_messages(r: dict[str, Any]) -> None:
    r["messages"] = []


def _prior_past_the_messages(r: dict[str, Any]) -> None:
    r["prior"] = 99


def _a_trace_entry_of_another_shape(r: dict[str, Any]) -> None:
    r["trace"][0] = {"from": "AwaitModel"}


def _version_true(r: dict[str, Any]) -> None:
    r["version"] = True


MALFORMED: dict[str, Callable[[dict[str, Any]], None]] = {
    "children as a list": _children_a_list,
    "a tool call without its result": _tool_call_without_result,
    "no messages": _no_messages,
    "prior past the messages": _prior_past_the_messages,
    "a trace entry of another shape": _a_trace_entry_of_another_shape,
    "version true": _version_true,
}


@pytest.mark.parametrize("broken", list(MALFORMED))
def test_a_malformed_recording_is_a_recording_error_before_anything_runs(tmp_path: Path, broken: str) -> None:
    recording = copy.deepcopy(_stored(tmp_path / "runs.db"))
    MALFORMED[broken](recording)
    counted = Counted()
    unused = FakeModel()
    with pytest.raises(RecordingError):
        replay(counted.agent(unused), json.dumps(recording))
    assert (counted.calls, unused.seen) == (0, [])
