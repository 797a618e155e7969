"""``--price`` on ``run``, ``batch`` and ``runs resume``: a budget in dollars on a server nothing prices (loopback)."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
from support.provider_server import ProviderServer, body, openai_tool_call

from fsm_agent.__main__ import main

QUESTION = "What is (2+3)*4?"
TOOL_CALL_DOLLARS = (82 * 1000 + 17 * 2000) / 1_000_000
"""The recorded tool-call reply (82 input, 17 output tokens) at ``--price 1000,2000``."""


@pytest.fixture(autouse=True)
def api_key(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every run finds a key where the SDK looks for it."""
    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-cli-price")


def _calculate(expression: str) -> dict[str, Any]:
    """The recorded OpenAI tool-call body, asking the built-in calculator."""
    return openai_tool_call("calculate", {"expression": expression})


def _model(server: ProviderServer) -> list[str]:
    return ["--model", "openai:gpt-4o-mini", "--base-url", f"{server.url}/v1", "--max-retries", "0"]


def _run(server: ProviderServer, *extra: str) -> list[str]:
    return ["run", QUESTION, *_model(server), "--quiet", *extra]


def test_price_lets_a_cost_budget_stop_a_run_on_an_unpriced_server(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """At the given price the second call crosses the budget: the run stops there, before a third request."""
    provider_server.queue(*(_calculate(f"{n}+1") for n in range(3)), body("openai", "final_answer"))
    assert main(_run(provider_server, "--price", "1000,2000", "--cost-budget", "0.2")) == 2
    stopped = capsys.readouterr().err.splitlines()[0]
    assert stopped.startswith("stopped: cost_budget {"), stopped
    evidence = json.loads(stopped.split(" ", 2)[2])
    assert evidence["cost"] == pytest.approx(2 * TOOL_CALL_DOLLARS)
    assert (evidence["budget"], evidence["priced_calls"], evidence["unpriced_calls"]) == (0.2, 2, 0)
    assert len(provider_server.requests) == 2


def test_price_without_a_budget_prices_the_runs_calls_in_its_trace(
    provider_server: ProviderServer, tmp_path: Path
) -> None:
    """Each call is priced at INPUT,OUTPUT,CACHED per million tokens: the cached input at the third price."""
    cached = copy.deepcopy(body("openai", "final_answer"))  # 140 input tokens, 100 of them cached; 9 output
    cached["usage"]["prompt_tokens_details"]["cached_tokens"] = 100
    provider_server.queue(_calculate("(2+3)*4"), cached)
    trace = tmp_path / "run.json"
    assert main(_run(provider_server, "--price", "1000,2000,100", "--trace", str(trace))) == 0
    usage = json.loads(trace.read_text(encoding="utf-8"))["usage"]
    answer_dollars = (40 * 1000 + 100 * 100 + 9 * 2000) / 1_000_000
    assert usage["cost"] == pytest.approx(TOOL_CALL_DOLLARS + answer_dollars)


def test_the_status_lines_show_the_priced_cost_to_a_millionth_of_a_dollar(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """At a real model's price a run costs cents or less: each status line's cost counter still shows it."""
    provider_server.queue(_calculate("(2+3)*4"), body("openai", "final_answer"))
    argv = ["run", QUESTION, *_model(provider_server), "--price", "0.15,0.60"]
    assert main(argv) == 0
    lines = capsys.readouterr().err.splitlines()
    assert "cost 0.000023" in lines[0]  # 82 input and 17 output tokens
    assert "cost 0.000049" in lines[-1]  # and 140 input and 9 output tokens more


def test_the_status_lines_of_an_unpriced_run_say_its_cost_is_unknown(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Without a price the server's calls cost something nobody knows: the status line says so, not 0."""
    provider_server.queue(_calculate("(2+3)*4"), body("openai", "final_answer"))
    assert main(["run", QUESTION, *_model(provider_server)]) == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) >= 2
    assert all("cost unknown" in line for line in lines), lines
    assert "cost 0" not in "\n".join(lines)


def test_without_price_a_cost_budget_on_an_unpriced_server_is_refused_naming_the_flag(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """The engine's refusal, in one line and exit 1 before any request, tells the user to pass --price."""
    assert main(_run(provider_server, "--cost-budget", "0.5")) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: cost_budget needs a price for every model call, and model 'gpt-4o-mini' has none")
    assert "pass --price INPUT,OUTPUT (US dollars per million tokens" in line
    assert "prices=Price" not in line
    assert provider_server.requests == []


def test_an_invalid_cost_budget_is_reported_as_itself_not_as_a_missing_price(
    provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """Only the refusal of an unpriced model is reworded: a budget of 0 is the engine's own error about it."""
    assert main(_run(provider_server, "--cost-budget", "0")) == 1
    assert capsys.readouterr().err == "error: cost_budget must be a finite number of US dollars > 0, got 0.0\n"


@pytest.mark.parametrize(
    ("price", "says"),
    [
        ("1", "wants INPUT,OUTPUT or INPUT,OUTPUT,CACHED"),
        ("1,2,3,4", "wants INPUT,OUTPUT or INPUT,OUTPUT,CACHED"),
        ("0.15,cheap", "wants numbers of US dollars per million tokens, got '0.15,cheap'"),
        ("1,", "wants numbers of US dollars per million tokens"),
        ("-1,2", "a price must be a finite number of US dollars >= 0, got -1.0"),
        ("nan,2", "a price must be a finite number of US dollars >= 0, got nan"),
        ("1,2,inf", "a price must be a finite number of US dollars >= 0, got inf"),
    ],
)
def test_a_malformed_price_is_one_line_naming_the_flag_before_any_request(
    price: str, says: str, provider_server: ProviderServer, capsys: pytest.CaptureFixture[str]
) -> None:
    """A usage error: one line naming --price and what is wrong, exit 1 as every usage error, no request."""
    assert main(_run(provider_server, f"--price={price}")) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: python -m fsm_agent run: argument --price: "), line
    assert says in line
    assert provider_server.requests == []


def test_price_beside_an_own_agent_is_refused(capsys: pytest.CaptureFixture[str]) -> None:
    """--agent brings its own prices: a --price beside it is named as a flag to drop, not silently ignored."""
    assert main(["run", QUESTION, "--agent", "support.batch_agents:cli_agent", "--price", "1,2"]) == 1
    assert capsys.readouterr().err == "error: --agent brings its own model, prompt, tools and limits: drop --price\n"


def test_batch_with_an_own_agent_refuses_the_model_agents_flags(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """batch --agent names each flag that only sets up the --model agent, as run does, before any run."""
    (tmp_path / "in.jsonl").write_text('"one"\n', encoding="utf-8")
    argv = ["batch", str(tmp_path / "in.jsonl"), "--agent", "support.batch_agents:cli_agent", "--local"]
    assert main([*argv, "--store", str(tmp_path / "runs.db"), "--price", "1,2", "--max-steps", "3", "--quiet"]) == 1
    message = "error: --agent brings its own model, prompt, tools and limits: drop --max-steps, --price\n"
    assert capsys.readouterr().err == message
    assert not (tmp_path / "runs.db").exists()


def test_runs_resume_takes_price_to_lift_a_cost_budget_stop(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A run stopped on its budget goes on under a larger one: runs resume --model prices it with --price too."""
    store = str(tmp_path / "runs.db")
    provider_server.queue(_calculate("2+3"))
    budget = ["--price", "1000,2000", "--store", store, "--run-id", "r1"]
    assert main(_run(provider_server, *budget, "--cost-budget", "0.1")) == 2
    assert capsys.readouterr().err.splitlines()[1].startswith("stopped: cost_budget ")
    provider_server.queue(body("openai", "final_answer"))
    resume = ["runs", "resume", "r1", *_model(provider_server), *budget[:4], "--cost-budget", "1", "--quiet"]
    assert main(resume) == 0
    assert capsys.readouterr().out == "(2+3)*4 = 20\n"
    assert len(provider_server.requests) == 2


def test_batch_takes_price_for_its_model_agent(provider_server: ProviderServer, tmp_path: Path) -> None:
    """batch --model builds its agent with the price: a budget is counted and stops the run, one request made."""
    provider_server.queue(_calculate("1+1"), body("openai", "final_answer"))
    (tmp_path / "in.jsonl").write_text('"one"\n', encoding="utf-8")
    out = tmp_path / "out.jsonl"
    budget = ["--price", "1000,2000", "--cost-budget", "0.1", "--out", str(out)]
    argv = ["batch", str(tmp_path / "in.jsonl"), *_model(provider_server), "--store", str(tmp_path / "runs.db")]
    assert main([*argv, "--local", "--quiet", *budget]) == 2
    (line,) = out.read_text(encoding="utf-8").splitlines()
    assert json.loads(line)["reason"] == "cost_budget"
    assert len(provider_server.requests) == 1


def test_batch_without_price_refuses_a_budget_on_an_unpriced_server_naming_the_flag(
    provider_server: ProviderServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The batch builds its agent once before any run: the refusal is one line naming --price, and exit 1."""
    (tmp_path / "in.jsonl").write_text('"one"\n', encoding="utf-8")
    argv = ["batch", str(tmp_path / "in.jsonl"), *_model(provider_server), "--store", str(tmp_path / "runs.db")]
    assert main([*argv, "--local", "--quiet", "--cost-budget", "0.1"]) == 1
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("error: cost_budget needs a price"), line
    assert "pass --price INPUT,OUTPUT" in line
    assert provider_server.requests == []
