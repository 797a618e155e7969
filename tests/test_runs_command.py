"""``python -m fsm_agent runs``: list, show and resume runs checkpointed with ``run --store``."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from provider_server import ProviderServer, body

from fsm_agent.__main__ import main

KEY = "sk-test-runs-0a1b2c3d4e5f"


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """The SDK finds its key in the environment."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


def _calculate(expression: str) -> dict[str, Any]:
    data = copy.deepcopy(body("openai", "tool_call"))
    function = data["choices"][0]["message"]["tool_calls"][0]["function"]
    function.update(name="calculate", arguments=json.dumps({"expression": expression}))
    return data


def _model(server: ProviderServer) -> list[str]:
    return ["--model", "openai:gpt-4o-mini", "--base-url", f"{server.url}/v1"]


def test_a_stopped_run_is_listed_shown_and_resumed_with_a_new_limit(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """run --store stops on max_steps; runs list/show report it; runs resume --max-steps finishes it."""
    store = str(tmp_path / "runs.db")
    provider_server.queue(_calculate("2+3"))
    code = main(
        ["run", "q", *_model(provider_server), "--max-steps", "1", "--store", store, "--run-id", "r1", "--quiet"]
    )
    assert code == 2
    capsys.readouterr()
    assert main(["runs", "list", "--store", store]) == 0
    assert capsys.readouterr().out == "r1\tFailed\tmax_steps\n"
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
    assert capsys.readouterr().out == "r1\tDone\tdone\n"


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
    from fsm_agent.persist.store import SqliteStore

    SqliteStore(store).close()
    assert main(["runs", "show", "ghost", "--store", str(store)]) == 1
    assert "no run 'ghost'" in capsys.readouterr().err
