"""``runs list`` paged by the cursor its "more runs: --after CURSOR" line gives, while the store changes between pages.

Between two pages a paused run is resumed to its end (saved again) and a
new run is started: paged by cursor, each run that was there at the first
page is listed exactly once, and the new one is not slipped into a later
page.  The runs' tool counts its executions per call id.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest

from fsm_agent import Agent, SqliteStore, ToolRegistry
from fsm_agent.__main__ import main
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn


def counted(ran: Counter[str]) -> ToolRegistry:
    registry = ToolRegistry()

    @registry.register
    def post(text: str, call_id: str) -> str:
        """Post a note (counted per call id)."""
        ran[call_id] += 1
        return "posted"

    return registry


def _run(store: SqliteStore, ran: Counter[str], run_id: str, approve: bool = False) -> str:
    """A run posting once (paused before the post if ``approve``), stored as ``run_id``; its reason."""
    model = FakeModel(tool_turn(tool_call("post", id=f"{run_id}-post", text=run_id)), reply("posted it"))
    agent = Agent(model, counted(ran), approve={"post"} if approve else None)
    return agent.run("post", store=store, run_id=run_id).reason


def _page(capsys: pytest.CaptureFixture[str], db: Path, *more: str) -> tuple[list[str], list[str]]:
    """One page of two: the run ids listed, and the arguments its "more runs" line names (none on the last page)."""
    assert main(["runs", "list", "--limit", "2", *more, "--store", str(db)]) == 0
    out = capsys.readouterr()
    ids = [line.split("\t")[0] for line in out.out.splitlines()]
    if not out.err:
        return ids, []
    assert out.err.startswith("more runs: --after "), out.err
    return ids, out.err.removeprefix("more runs: ").split()


def test_pages_after_a_cursor_list_every_run_once_while_runs_are_saved_and_started(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "runs.db"
    ran: Counter[str] = Counter()
    with SqliteStore(db) as store:
        assert _run(store, ran, "waiting", approve=True) == "paused"
        for n in range(4):
            assert _run(store, ran, f"answered-{n}") == "done"
        there = {run.run_id for run in store.list_runs()}
        seen, more = _page(capsys, db)
        assert seen == ["answered-3", "answered-2"]
        # Between the pages: the oldest run is resumed to its end, and a new run starts.
        resumed = Agent(FakeModel(reply("posted after approval")), counted(ran), approve={"post"})
        assert resumed.resume(store.load("waiting"), approvals={"waiting-post": True}, store=store).finish().ok
        assert _run(store, ran, "started-later") == "done"
        while more:
            page, more = _page(capsys, db, *more)
            seen.extend(page)
    assert seen == ["answered-3", "answered-2", "answered-1", "answered-0", "waiting"]
    assert set(seen) == there
    assert ran == Counter({f"{run_id}-post": 1 for run_id in [*there, "started-later"]})


@pytest.mark.parametrize(
    ("more", "said"),
    [
        (["--after", "not-a-cursor"], "argument --after: a run cursor is '<created>:<run id>'"),
        (["--after", "1.5:x", "--offset", "2"], "argument --offset: not allowed with argument --after"),
        (
            ["--offset", "-1"],
            "--limit must be from 1 to 9223372036854775806 and --offset from 0 to 9223372036854775807",
        ),
    ],
    ids=["no-cursor", "both", "negative-offset"],
)
def test_a_cursor_that_is_none_or_given_with_an_offset_is_one_line_and_exit_1(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], more: list[str], said: str
) -> None:
    db = tmp_path / "runs.db"
    ran: Counter[str] = Counter()
    with SqliteStore(db) as store:
        _run(store, ran, "one")
    assert main(["runs", "list", *more, "--store", str(db)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1
    assert said in err
    assert ran == Counter({"one-post": 1})
