"""A run stored in SQLite, resumed by another interpreter: given its deps again, or its tool says it has none."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

APP = textwrap.dedent(
    '''
    """An application: its database object, a tool that needs it, and a script a new process runs."""

    import json
    import sys

    from fsm_agent import Agent, RunContext, SqliteStore
    from fsm_agent.testing import reply, tool_call, tool_turn

    SCRIPT = [tool_turn(tool_call("lookup", id="c1", key="a")), reply("done")]
    executed = []


    class Db:
        rows = {"a": "apple"}


    class Conversation:
        def complete(self, messages, tools):
            return SCRIPT[sum(1 for m in messages if m.role == "assistant")]


    def lookup(key: str, ctx: RunContext[Db]) -> str:
        """Look a key up in the database."""
        executed.append(key)
        return ctx.deps.rows[key]


    agent = Agent(Conversation(), [lookup], approve=["lookup"])
    action, path = sys.argv[1], sys.argv[2]
    with SqliteStore(path) as store:
        if action == "start":
            result = agent.run("fruit?", store=store, run_id="r1", deps=Db())
        else:
            deps = Db() if action == "resume-with-deps" else None
            result = agent.resume(store.load("r1"), approvals={"c1": True}, store=store, deps=deps).finish()
    answers = [m.content for m in result.messages if m.role == "tool"]
    print(json.dumps({"reason": result.reason, "executed": executed, "answers": answers}))
    '''
)


def _process(folder: Path, *args: str) -> dict[str, Any]:
    done = subprocess.run(
        [sys.executable, str(folder / "app.py"), *args], capture_output=True, text=True, cwd=folder, check=False
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.splitlines()[-1])  # type: ignore[no-any-return]


@pytest.mark.subprocess
@pytest.mark.parametrize("given", [True, False], ids=["deps-given-again", "no-deps"])
def test_a_run_resumed_in_a_new_process_is_given_its_deps_again(tmp_path: Path, given: bool) -> None:
    """Paused in one interpreter, resumed in another: with deps the tool answers; without, its result says why."""
    (tmp_path / "app.py").write_text(APP, encoding="utf-8")
    store = str(tmp_path / "runs.db")
    paused = _process(tmp_path, "start", store)
    assert paused == {"reason": "paused", "executed": [], "answers": []}
    resumed = _process(tmp_path, "resume-with-deps" if given else "resume-without-deps", store)
    assert resumed["reason"] == "done"
    assert resumed["executed"] == ["a"]  # the one call, made once, in the new process
    (answer,) = resumed["answers"]
    if given:
        assert answer == '"apple"'
    else:
        error = json.loads(answer)["error"]
        assert "NoDepsError" in error
        assert "run 'r1' was given none" in error
        assert "resume(..., deps=...)" in error
