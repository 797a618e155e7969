"""A newcomer's first hour, round six: the tutorial followed literally, then the mistakes a newcomer makes.

Each test is one defect found (marked ``xfail(strict=True)`` until it was
fixed): a doc step that does not work as written, an error that does not
say what is wrong, an effect left half-done by a refused call, something a
model or a tool produced that is dropped.  The mistakes the other newcomer
tests already cover (``tests/drivers/test_newcomer_mistakes.py``,
``test_bad_input_agent.py``, ``tests/cli/test_bad_input_cli.py``,
``tests/project/test_first_hour.py``) are not repeated.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_snippets import ROOT, parse
from support.first_hour_round_six import (
    JsonTextArgumentsAdapter,
    Sends,
    UserRoleAdapter,
    asks_to_send,
    sends,
    user_module,
)

from fsm_agent import Agent, AgentLoopError, SqliteStore
from fsm_agent.cli.main import main
from fsm_agent.testing import FakeModel, reply

BIN = Path(sys.executable).parent


def _one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("error: "), err
    return lines[0]


# --- the tutorial, read literally ------------------------------------------------------------------------------


def test_the_one_file_way_of_reading_a_page_says_to_run_its_console_blocks_where_they_stand() -> None:
    """docs/tutorial/index.md, lines 77-80: save a page's Python blocks in one file, run it, get the output shown.

    On durable-runs.md and batch.md a console block stands between two
    Python blocks and the later one reads what the command did (the email
    `runs resume` sent, the `results.jsonl` that `batch` wrote): the one
    file prints `['lookup_order B-1']` where the page shows the email too,
    and batch.md's file stops on FileNotFoundError: results.jsonl.
    """
    tutorial = ROOT / "docs" / "tutorial"
    between = []
    for path in sorted(tutorial.glob("*.md")):
        kinds = [step.kind for step in parse(path).steps if step.kind != "file"]
        python_at = [i for i, kind in enumerate(kinds) if kind == "python"]
        if python_at and any(kind == "command" for kind in kinds[python_at[0] : python_at[-1]]):
            between.append(path.name)
    assert {"durable-runs.md", "batch.md"} <= set(between)  # the pages where the one file misses a step
    text = (tutorial / "index.md").read_text(encoding="utf-8")
    section = text.split("## How to read the pages", 1)[1].split("\n## ", 1)[0]
    sentence = next(s for s in re.split(r"(?<=\.)\s", " ".join(section.split())) if "one file" in s)
    assert "console" in sentence, sentence


# --- the command line ------------------------------------------------------------------------------------------


@pytest.mark.subprocess
@pytest.mark.parametrize(
    ("source", "named"),
    [
        ("from fsm_agent import Agent\n\n\ndef make(:\n    return None\n", "line 4"),
        ('raise RuntimeError("set SHOP_DB first")\n\n\ndef make():\n    return None\n', "set SHOP_DB first"),
    ],
    ids=["syntax error", "raises at import"],
)
def test_an_agent_module_that_cannot_be_imported_is_one_line_naming_why(
    source: str, named: str, tmp_path: Path
) -> None:
    """``fsm-agent run q --agent shop:make`` where shop.py has a typo: exit 1 and one line, as the --help promises.

    Only ImportError is caught (fsm_agent/cli/__init__.py, import_named):
    a SyntaxError or any exception raised while the module runs escapes
    main(), and the user reads ~30 lines of the package's own frames.
    """
    (tmp_path / "shop.py").write_text(source, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH"}}
    done = subprocess.run(
        [str(BIN / "fsm-agent"), "run", "q", "--agent", "shop:make", "--quiet"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr, done.stderr
    line = _one_error_line(done.stderr)
    assert "--agent" in line
    assert "shop" in line
    assert named in line


def test_run_trace_into_a_missing_folder_is_written_or_refused_before_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run q --agent m:make --trace out/run.json`` where ``out`` does not exist.

    Today the tool runs (the message is sent), then "error: cannot write
    --trace: No such file or directory" and exit 0: the trace asked for is
    gone.  --diagram, runs export --out and diagram --out all create the
    folder; --trace alone neither creates it nor checks it before the run
    (fsm_agent/cli/run.py, main).
    """
    module = user_module(tmp_path, monkeypatch)
    trace = tmp_path / "out" / "run.json"
    code = main(["run", "go", "--agent", f"{module}:make", "--quiet", "--trace", str(trace)])
    err = capsys.readouterr().err
    if trace.exists():
        assert code == 0, err
    else:
        assert code == 1, err
        assert sends(module) == []


def test_batch_refused_for_an_out_file_it_cannot_write_creates_no_store(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``batch q.jsonl --store runs.db --out results/r.jsonl`` where ``results`` does not exist.

    The refusal (one line naming --out, exit 1) comes after the store file
    was made: runs.db is left behind, an empty store the user never got a
    run into.  The existing refusal test covers bad numbers, not this.
    """
    module = user_module(tmp_path, monkeypatch)
    inputs = tmp_path / "q.jsonl"
    inputs.write_text('"q1"\n', encoding="utf-8")
    store, out = tmp_path / "runs.db", tmp_path / "results" / "r.jsonl"
    args = ["batch", str(inputs), "--agent", f"{module}:make", "--local", "--quiet", "--store", str(store)]
    code = main([*args, "--out", str(out)])
    err = capsys.readouterr().err
    if out.exists():  # the folder made, as --diagram and runs export --out make theirs
        assert code == 0, err
    else:
        assert code == 1, err
        assert "--out" in _one_error_line(err)
        assert sends(module) == []
        assert not store.exists()


def test_run_with_a_run_id_the_store_holds_names_a_fix_the_command_line_has(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """``run q --store runs.db --run-id r1`` a second time: "resume it, or start it with overwrite=True".

    ``overwrite=True`` is a Python keyword with no flag behind it, and a run
    that finished cannot be resumed.  ``runs fork`` says what to do instead
    ("give the fork another --run-id, or leave it out for a fresh one");
    ``run`` passes RunExistsError's Python advice through (fsm_agent/cli/run.py).
    """
    module = user_module(tmp_path, monkeypatch)
    store = str(tmp_path / "runs.db")
    given = ["run", "go", "--agent", f"{module}:make", "--quiet", "--store", store, "--run-id", "r1"]
    assert main(given) == 0
    capsys.readouterr()
    assert main(given) == 1
    line = _one_error_line(capsys.readouterr().err)
    assert sends(module) == ["ada"]  # the second run made no call
    assert "r1" in line
    assert "overwrite=True" not in line
    assert "--run-id" in line.removeprefix("error: --run-id:")


# --- a model adapter of one's own ------------------------------------------------------------------------------


def test_a_reply_that_is_no_assistant_message_stops_with_model_error_naming_the_role() -> None:
    """An adapter returning ``ModelResponse(Message("user", text), "end_turn")``; the contract: an assistant Message.

    The reply check (fsm_agent/core/ledger.py) refuses a content of the
    wrong type, a usage dict, an id of None, but not the role: the run ends
    ``done`` with a ``user`` message as its last, which the next turn of
    the conversation sends to the provider as the user's own words.
    """
    with pytest.raises(AgentLoopError) as stop:
        Agent(UserRoleAdapter(), []).run("Send it.")  # type: ignore[arg-type]
    assert stop.value.reason == "model_error"
    assert "role" in stop.value.evidence["error"]
    assert "assistant" in stop.value.evidence["error"]


def test_tool_call_arguments_left_as_json_text_are_named_as_the_adapters_mistake() -> None:
    """``ToolCall("s1", "send", '{"to": "ada"}')``: an adapter that forgot ``json.loads`` on the provider's text.

    Today the call fails and the *model* is told "arguments must be a JSON
    object, got string", which it cannot fix (it sent an object): it asks
    again until tool_failures or repeated_action.  Expected: a model_error
    (or a TypeError at ToolCall) naming ``arguments`` and how to fill it:
    decoded, or the text in ``raw_arguments``.
    """
    sent = Sends()
    with pytest.raises((AgentLoopError, TypeError)) as refused:
        Agent(JsonTextArgumentsAdapter(), sent.tools()).run("Send it.")  # type: ignore[arg-type]
    if isinstance(refused.value, AgentLoopError):
        assert refused.value.reason == "model_error"
        said = str(refused.value.evidence["error"])
    else:
        said = str(refused.value)
    assert "arguments" in said
    assert "raw_arguments" in said or "json.loads" in said
    assert sent.calls == []


# --- approvals and stores --------------------------------------------------------------------------------------


def test_a_decision_text_that_reads_as_approval_is_refused_not_taken_as_a_rejection(tmp_path: Path) -> None:
    """``store.decide("p1", "s1", "yes")``: True approves, and a text is a rejection's reason, so "yes" rejects.

    The command line refuses ``--approve ID=y`` / ``=true`` for exactly this
    (test_first_hour: it "once rejected the call with 'maybe' as the
    reason"); from Python the call is rejected and never runs, silently.
    Expected: a ValueError pointing to ``True``, and no decision recorded.
    """
    sent = Sends()
    with SqliteStore(tmp_path / "runs.db") as store:
        paused = Agent(asks_to_send(), sent.tools(), approve={"send"}).run("go", store=store, run_id="p1")
        assert paused.reason == "paused"
        with pytest.raises(ValueError, match="True"):
            store.decide("p1", "s1", "yes")
        assert store.load("p1")["approvals"] == {}
    assert sent.calls == []


def test_decisions_on_a_stored_run_resumed_without_its_store_are_refused(tmp_path: Path) -> None:
    """``agent.resume(store.load("p1"), approvals={"s1": True})``: store= forgotten.

    The call runs, the stored run stays paused with no decision, and the
    next resume from the store (runs resume --approve s1, the viewer's
    Approve) makes the call a second time: two emails.  The snapshot says
    where it came from (``run_id``, ``stored_seq``); decisions belong to the
    stored run (durable-runs.md).  Expected: refused, naming store=.
    """
    sent = Sends()
    with SqliteStore(tmp_path / "runs.db") as store:
        Agent(asks_to_send(), sent.tools(), approve={"send"}).run("go", store=store, run_id="p1")
        agent = Agent(FakeModel(reply("Sent.")), sent.tools())  # the model's reply after the call
        refusal = ""
        try:
            resumed = agent.resume(store.load("p1"), approvals={"s1": True})
        except (ValueError, TypeError) as refused:
            refusal = str(refused)
        else:  # today: the call is made, the store not told; then the resume from the store makes it again
            resumed.finish()
            again = Agent(FakeModel(reply("Sent.")), sent.tools())
            again.resume(store.load("p1"), store=store, approvals={"s1": True}).finish()
        assert "store" in refusal or not refusal
        assert sent.calls in ([], ["ada"]), "the call was made twice"


def test_an_approve_predicate_that_raises_stops_the_run_keeping_the_reply(tmp_path: Path) -> None:
    """``approve=needs_review`` whose lookup fails: a bare RuntimeError, not a stop; the reply that asked is lost.

    A StopCondition that raises stops with stop_condition_error and a hook
    that raises with hook_error, each an AgentLoopError whose result holds
    the run.  The predicate's exception escapes ``run`` with no result, and
    with a store the run is left in AwaitModel without the reply, still
    leased (an immediate resume is RunLeasedError).
    """
    sent = Sends()

    def needs_review(call: object) -> bool:
        msg = "policy service unreachable"
        raise RuntimeError(msg)

    with SqliteStore(tmp_path / "runs.db") as store:
        with pytest.raises(AgentLoopError) as stop:
            Agent(asks_to_send(), sent.tools(), approve=needs_review).run("go", store=store, run_id="a1")
        assert "policy service unreachable" in str(stop.value.evidence)
        assert [call.id for call in stop.value.result.messages[-1].tool_calls] == ["s1"]
        assert [call.id for call in stop.value.result.pending] == ["s1"]
        assert store.load("a1")["state"] == "Failed"
    assert sent.calls == []
