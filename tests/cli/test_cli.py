"""``python -m fsm_agent run``: end to end against the loopback server as an OpenAI-compatible endpoint."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body, openai_tool_call

from fsm_agent.__main__ import main
from fsm_agent.testing import TOOL_THEN_ANSWER

KEY = "sk-test-cli-5e4d3c2b1a0f9e8d7c6b"
QUESTION = "What is (2+3)*4?"


def _tool_call(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The recorded OpenAI tool-call body, asking for one of the built-in tools."""
    return openai_tool_call(name, arguments)


def _args(server: ProviderServer, *extra: str) -> list[str]:
    return ["run", QUESTION, "--model", "openai:gpt-4o-mini", "--base-url", f"{server.url}/v1", *extra]


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every in-process run finds the key where the SDK looks for it."""
    monkeypatch.setenv("OPENAI_API_KEY", KEY)


@pytest.mark.subprocess
def test_run_answers_through_an_openai_compatible_base_url(provider_server: ProviderServer, tmp_path: Path) -> None:
    """As a real process: the built-in calculator runs, the answer is stdout, exit 0, one stderr line per edge."""
    provider_server.queue(_tool_call("calculate", {"expression": "(2+3)*4"}), body("openai", "final_answer"))
    trace = tmp_path / "run.json"
    env = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()} | {"OPENAI_API_KEY": KEY}
    done = subprocess.run(
        [sys.executable, "-m", "fsm_agent", *_args(provider_server, "--trace", str(trace))],
        capture_output=True,
        text=True,
        env=env,
        timeout=60,
        check=False,
    )
    assert (done.returncode, done.stdout) == (0, "(2+3)*4 = 20\n"), done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("AwaitModel -> CheckTruncation  (")
    assert {"steps 1/8", "failures 0/3"} <= set(lines[0].split("(")[1].rstrip(")").split("  "))
    assert any('ExecuteTool -> AwaitModel  calculate({"expression": "(2+3)*4"}) -> 20' in line for line in lines)
    assert lines[-1].startswith("Dispatch -> Done [has_no_tool_calls]")
    first, second = provider_server.requests
    assert [t["function"]["name"] for t in first.json["tools"]] == ["calculate", "current_time"]
    assert second.json["messages"][-1] == {"role": "tool", "tool_call_id": "call_Ad1", "content": "20"}
    saved = json.loads(trace.read_text(encoding="utf-8"))
    assert (saved["reason"], saved["final"]) == ("done", "(2+3)*4 = 20")
    assert saved["trace"][-1]["dest"] == "Done"
    assert KEY not in trace.read_text(encoding="utf-8")


def test_a_stop_prints_its_reason_and_evidence_and_exits_2(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A truncated answer is no answer: nothing on stdout, the reason, evidence and partial text on stderr."""
    provider_server.queue(body("openai", "truncated_answer"))
    assert main(_args(provider_server, "--quiet")) == 2
    out, err = capsys.readouterr()
    assert out == ""
    stopped, partial = err.splitlines()
    reason, evidence = stopped.split(" ", 2)[1:]
    assert (stopped.split(" ")[0], reason) == ("stopped:", "max_tokens")
    assert json.loads(evidence)["stop_reason"] == "max_tokens"
    assert partial == "partial answer: Let me work this out step by step: first, 2+3 is"


def test_limit_flags_reach_the_agent(provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]) -> None:
    """--max-tool-calls 0 stops the run before the requested tool runs."""
    provider_server.queue(_tool_call("calculate", {"expression": "1+1"}))
    assert main(_args(provider_server, "--quiet", "--max-tool-calls", "0")) == 2
    assert capsys.readouterr().err.startswith("stopped: max_tool_calls ")


def test_an_invalid_limit_is_one_line_and_exit_1(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A limit the engine rejects is reported in the engine's words, before any request."""
    assert main(_args(provider_server, "--max-steps", "0")) == 1
    assert capsys.readouterr().err == "error: max_steps must be an integer >= 1, got 0\n"
    assert provider_server.requests == []


def test_files_lets_the_model_read_under_the_directory_only(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --files, read_file is offered and reads inside DIR; the model gets a failed result for a path outside."""
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "a.txt").write_text("alpha", encoding="utf-8")
    (tmp_path / "secret.txt").write_text("do not read", encoding="utf-8")
    provider_server.queue(
        _tool_call("read_file", {"path": "a.txt"}),
        _tool_call("read_file", {"path": "../secret.txt"}),
        body("openai", "final_answer"),
    )
    assert main(_args(provider_server, "--quiet", "--files", str(tmp_path / "docs"))) == 0
    assert capsys.readouterr().out == "(2+3)*4 = 20\n"
    second, third = provider_server.requests[1:]
    assert second.json["messages"][-1]["content"] == '"alpha"'
    refused = third.json["messages"][-1]["content"]
    assert "outside the readable directory" in json.loads(refused)["error"]
    assert "do not read" not in refused


def test_without_a_key_it_fails_in_one_line(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """No key for a hosted provider: one line naming the variable, exit 1, no traceback."""
    monkeypatch.delenv("OPENAI_API_KEY")
    assert main(["run", QUESTION, "--model", "openai:gpt-4o-mini"]) == 1
    err = capsys.readouterr().err
    assert err == "error: no API key: set OPENAI_API_KEY (or name another variable: --api-key-env)\n"


def test_a_named_key_variable_must_be_set(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """--api-key-env names the variable to read, also for Anthropic; unset, it is the one-line error."""
    monkeypatch.delenv("MY_CLAUDE_KEY", raising=False)
    assert main(["run", QUESTION, "--model", "anthropic:claude-x", "--api-key-env", "MY_CLAUDE_KEY"]) == 1
    assert capsys.readouterr().err == "error: no API key: set MY_CLAUDE_KEY\n"


def test_a_local_server_needs_no_key(
    provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """With --base-url and no key set, a placeholder key is sent: local servers ignore it."""
    monkeypatch.delenv("OPENAI_API_KEY")
    provider_server.queue(body("openai", "final_answer"))
    assert main(_args(provider_server, "--quiet")) == 0
    assert provider_server.requests[0].headers["authorization"] == "Bearer no-key-needed"


@pytest.mark.parametrize("spec", ["gpt-4o-mini", "mistral:large", "openai:"])
def test_a_bad_model_spec_is_one_line(spec: str, capsys: pytest.CaptureFixture[str]) -> None:
    """--model must be PROVIDER:NAME with a known provider."""
    assert main(["run", QUESTION, "--model", spec]) == 1
    assert capsys.readouterr().err.startswith(
        "error: --model wants PROVIDER:NAME with PROVIDER one of openai, openai-responses, anthropic, gemini"
    )


class _Terminal(io.StringIO):
    """A captured stderr that says it is a terminal."""

    def isatty(self) -> bool:
        return True


def test_on_a_terminal_the_status_line_is_rewritten_in_place(
    provider_server: ProviderServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """On a TTY each state overwrites one line (carriage return, clear) and the final counters stay."""
    terminal = _Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    provider_server.queue(_tool_call("calculate", {"expression": "2*3"}), body("openai", "final_answer"))
    assert main(_args(provider_server)) == 0
    shown = terminal.getvalue()
    assert shown.count("\n") == 1
    frames = shown.rstrip("\n").split("\r\x1b[K")[1:]
    assert [f.split()[0] for f in frames] == list(TOOL_THEN_ANSWER)
    assert {"steps 0/8", "failures 0/3"} <= set(frames[0].split("  "))
    assert "tokens 248" in frames[-1]


@pytest.mark.parametrize(("suffix", "marker"), [(".dot", "digraph"), (".mmd", "flowchart LR")])
def test_diagram_writes_the_runs_path(
    provider_server: ProviderServer, tmp_path: Path, suffix: str, marker: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """--diagram draws the machine with the run's path, as DOT or Mermaid text by the file's suffix."""
    provider_server.queue(body("openai", "final_answer"))
    picture = tmp_path / f"run{suffix}"
    assert main(_args(provider_server, "--quiet", "--diagram", str(picture))) == 0
    assert marker in picture.read_text(encoding="utf-8")
    assert capsys.readouterr().err == f"wrote {picture}\n"


@pytest.mark.subprocess
def test_the_command_line_imports_no_sdk_until_a_run_needs_one() -> None:
    """Loading the command (and its help) needs neither provider SDK."""
    code = (
        "import sys, fsm_agent.cli.main as m; m.build_parser(); "
        "print(sorted(n for n in ('openai', 'anthropic') if n in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60).stdout
    assert out.strip() == "[]"
