"""The recording format: what an export holds, the command that writes it, the fixture and the versions it reads.

``recordings/test_a_committed_recording_still_replays.json`` was exported
by the first version of the format and is committed as it was written:
every later version must keep replaying it.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from fsm_agent import Agent
from fsm_agent.cli.main import main
from fsm_agent.persist import open_store
from fsm_agent.persist import recording as recordings
from fsm_agent.persist.recording import RecordingError, read_recording
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.testing.replay import RecordingFile, ReplayDivergence

COMMITTED = Path(__file__).parent / "recordings" / "test_a_committed_recording_still_replays.json"


def adder(model: FakeModel | None = None, system: str = "You add numbers.") -> Agent:
    """The agent the committed recording was made with; a model with an empty script unless one is given."""
    return Agent(model or FakeModel(), demo_registry(), system=system)


def stored(target: str) -> dict[str, Any]:
    """Run the adder into the store at ``target`` as run ``adds-1``; its export."""
    model = FakeModel(tool_turn(tool_call("add", id="call_1", a=2, b=3)), reply("5"))
    with open_store(target) as store:
        adder(model).run("What is 2 + 3?", store=store, run_id="adds-1")
        return store.export("adds-1")


def test_a_committed_recording_still_replays(fsm_recording: RecordingFile) -> None:
    """The fixture reads the recording named after the test, and the agent replays it without a call."""
    assert fsm_recording.path == COMMITTED
    assert fsm_recording.data["version"] == 1
    model = FakeModel()
    result = fsm_recording(adder(model))
    assert (result.final, result.ok, model.seen) == ("5", True, [])


@pytest.mark.fsm_recording("test_a_committed_recording_still_replays")
def test_the_marker_names_the_recording_and_areplay_drives_it_async(fsm_recording: RecordingFile) -> None:
    """``@pytest.mark.fsm_recording(NAME)`` picks the file; ``areplay`` replays it on the async driver."""
    result = asyncio.run(fsm_recording.areplay(adder()))
    assert result.final == "5"
    with pytest.raises(ReplayDivergence, match="You add numbers!"):
        fsm_recording(adder(system="You add numbers!"))


def test_a_missing_recording_names_the_file(fsm_recording: RecordingFile) -> None:
    """A test without its recording fails naming the file it looked for."""
    with pytest.raises(FileNotFoundError, match=r"test_a_missing_recording_names_the_file\.json"):
        fsm_recording(adder())


def test_an_older_version_is_upgraded_as_it_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """A version the loader has a migration for is brought up to date, then replays."""
    old = {**json.loads(COMMITTED.read_text()), "version": 0, "calls": "renamed later"}

    def from_0(data: dict[str, Any]) -> dict[str, Any]:
        return {k: v for k, v in data.items() if k != "calls"} | {"version": 1}

    monkeypatch.setitem(recordings.MIGRATIONS, 0, from_0)
    upgraded = read_recording(json.dumps(old))
    assert upgraded["version"] == 1
    assert "calls" not in upgraded


@pytest.mark.parametrize(
    ("given", "why"),
    [
        ("{not json", "not valid JSON"),
        ("[1]", "must be a JSON object"),
        (
            '{"format": "fsm_agent.Recording", "version": 99}',
            r"unsupported recording .*99.*reads 'fsm_agent.Recording' versions 1",
        ),
        ('{"format": "fsm_agent.Recording", "version": 1}', "recording lacks messages, trace"),
    ],
)
def test_an_unreadable_recording_says_why(given: str, why: str) -> None:
    """Broken JSON, another shape, an unknown version or missing parts are a ``RecordingError`` saying which."""
    with pytest.raises(RecordingError, match=why):
        read_recording(given)


def test_the_export_command_writes_what_the_store_exports(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """``runs export`` writes the store's recording to a file (folders made) or to stdout with ``--out -``."""
    target = str(tmp_path / "runs.db")
    exported = stored(target)
    out = tmp_path / "recordings" / "adds.json"
    assert main(["runs", "export", "adds-1", "--store", target, "--out", str(out)]) == 0
    assert json.loads(out.read_text(encoding="utf-8")) == exported
    capsys.readouterr()
    assert main(["runs", "export", "adds-1", "--store", target, "--out", "-"]) == 0
    assert json.loads(capsys.readouterr().out) == exported
    assert main(["runs", "export", "nope", "--store", target, "--out", str(out)]) == 1
    assert "no run 'nope'" in capsys.readouterr().err


def test_a_recording_names_nothing_of_its_store(store_target: str) -> None:
    """No path or database address (so no password) goes into a recording, whichever store it came from."""
    text = json.dumps(stored(store_target))
    assert store_target not in text
    assert "runs.db" not in text
    assert "postgresql://" not in text


def test_a_run_stored_before_calls_were_kept_exports_without_them(tmp_path: Path) -> None:
    """A snapshot without ``io`` (written by an older release) still loads and exports, with no calls."""
    target = str(tmp_path / "runs.db")
    stored(target)
    with open_store(target) as store:
        snapshot = store.load("adds-1")
        del snapshot["io"]
        store.save("old-1", {k: v for k, v in snapshot.items() if k != "stored_seq"})
        exported = store.export("old-1")
    assert (exported["model_calls"], exported["tool_calls"], exported["final"]) == ([], [], "5")
