"""The run viewer's server: the JSON it gives the page, its guards (hosts, read-only, origins), and the command."""

from __future__ import annotations

import http.client
import itertools
import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs the extra: there a missing one fails the import below
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")

from starlette.testclient import TestClient
from support.ui_runs import HOSTILE, all_runs, finished, mail_registry, paused, stopped

import fsm_agent.ui.app
from fsm_agent import TABLE, Agent, Price, SqliteStore, StopCondition, Usage
from fsm_agent.__main__ import main as cli
from fsm_agent.cli import SetupError
from fsm_agent.cli.ui import answered_hosts, bind, is_loopback
from fsm_agent.persist import open_store
from fsm_agent.testing import FakeModel, demo_registry, reply, tool_call, tool_turn
from fsm_agent.ui import create_app, moments

BASE = "http://127.0.0.1:8765"


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteStore]:
    """A store with a stopped, a finished, a paused and a hostile run."""
    with SqliteStore(tmp_path / "runs.db") as opened:
        all_runs(opened)
        yield opened


def client(store: Any, **options: Any) -> TestClient:
    """A test client for a viewer over ``store``, addressed as a browser on this machine would."""
    return TestClient(create_app(store, **options), base_url=BASE)


def row_of(reason: str) -> int:
    """The index of the (first) default-table row with this reason."""
    return next(i for i, row in enumerate(TABLE.rows) if row.reason == reason)


# --- the list --------------------------------------------------------------------------------


def test_list_gives_state_reason_tool_calls_tokens_and_time_latest_first(store: SqliteStore) -> None:
    """Each run in the list has its state, reason, tool calls, tokens, paused flag, last save and creation time."""
    body = client(store).get("/api/runs").json()
    runs = {run["run_id"]: run for run in body["runs"]}
    assert [run["run_id"] for run in body["runs"]] == ["hostile", "paused", "finished", "stopped"]
    assert runs["stopped"]["created"] <= runs["stopped"]["updated"] < runs["finished"]["created"]
    assert runs["stopped"] | {"updated": 0, "created": 0} == {
        "run_id": "stopped",
        "state": "Failed",
        "reason": "max_steps",
        "paused": False,
        "updated": 0,
        "created": 0,
        "tool_calls": 3,
        "tokens": 0,
        "session": None,
        "forked_from": None,
    }
    assert runs["paused"]["paused"] is True
    assert body["more"] is False
    assert body["now"] >= runs["stopped"]["updated"]


def test_list_filters_by_state_and_reason(store: SqliteStore) -> None:
    """?state= and ?reason= narrow the list as the store's list_runs does."""
    viewer = client(store)
    assert [r["run_id"] for r in viewer.get("/api/runs", params={"state": "Failed"}).json()["runs"]] == ["stopped"]
    done = viewer.get("/api/runs", params={"reason": "done"}).json()["runs"]
    assert [r["run_id"] for r in done] == ["hostile", "finished"]


def test_list_is_paginated(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """A page holds PAGE_SIZE runs; `more` says whether another page follows, ?offset= fetches it."""
    monkeypatch.setattr(fsm_agent.ui.app, "PAGE_SIZE", 3)
    viewer = client(store)
    first = viewer.get("/api/runs").json()
    second = viewer.get("/api/runs", params={"offset": "3"}).json()
    assert (len(first["runs"]), first["more"]) == (3, True)
    assert ([r["run_id"] for r in second["runs"]], second["more"]) == (["stopped"], False)
    assert viewer.get("/api/runs", params={"offset": "x"}).status_code == 400


def test_the_viewer_reads_and_decides_on_sqlite_and_postgresql(store_target: str) -> None:
    """The same list, run page and decision over a store opened by open_store: a file or a postgresql:// URL."""
    with open_store(store_target) as opened:
        stopped(opened)
        call_id = paused(opened, [])
        viewer = client(opened, allow_decisions=True)
        listed = viewer.get("/api/runs", params={"reason": "max_steps"}).json()["runs"]
        assert [(r["run_id"], r["tool_calls"]) for r in listed] == [("stopped", 3)]
        assert viewer.get("/api/run", params={"id": "stopped"}).json()["moments"][-1]["reason"] == "max_steps"
        body = {"call_id": call_id, "approve": True}
        assert viewer.post("/api/decide", params={"id": "paused"}, json=body).status_code == 200
        assert opened.load("paused")["approvals"] == {call_id: True}


# --- one run ---------------------------------------------------------------------------------


def test_a_stopped_run_s_last_transition_names_its_edge_and_carries_the_evidence(store: SqliteStore) -> None:
    """The stop edge's ids (row and its state's trunk), the stop's evidence, every counter against its limit."""
    run = client(store).get("/api/run", params={"id": "stopped"}).json()
    last = run["moments"][-1]
    assert (run["state"], run["reason"], run["live"]) == ("Failed", "max_steps", False)
    assert last["ids"] == [f"row{row_of('max_steps')}", "stops_ExecuteTool"]
    assert last["label"] == "max_steps"
    assert "[steps_exhausted]" in last["tooltip"]
    assert last["evidence"]["turns"] == last["evidence"]["limit"] == 3
    assert last["counters"]["steps"] == [3, 3]
    assert last["counted_from"] == "as the run stands now"
    assert last["call"]["name"] == "echo"


def test_each_tool_edge_brings_its_call_its_result_and_the_counters_after_it(store: SqliteStore) -> None:
    """In a finished run, Dispatch->ExecuteTool shows the call it dispatches, tool_done the call and its result."""
    run = client(store).get("/api/run", params={"id": "finished"}).json()
    dispatched = next(m for m in run["moments"] if (m["source"], m["dest"]) == ("Dispatch", "ExecuteTool"))
    ran = next(m for m in run["moments"] if m["trigger"] == "tool_done")
    assert dispatched["call"]["name"] == ran["call"]["name"] == "add"
    assert ran["result"]["content"] == "5"
    assert ran["counters"]["tool_calls"] == [1, None]
    assert run["moments"][-1]["dest"] == "Done"
    assert run["final"] == "(2+3)*4 = 20"


def test_steps_count_model_turns_and_tool_calls_are_counted_apart(tmp_path: Path) -> None:
    """Two model turns, two tool calls: the list says 2 tool calls, the run 2 steps (turns) and 2 tool calls."""
    model = FakeModel([tool_turn(tool_call("add", a=1, b=2), tool_call("add", a=3, b=4)), reply("3 and 7")])
    with SqliteStore(tmp_path / "runs.db") as runs:
        Agent(model, demo_registry()).run("two sums", store=runs, run_id="two_calls")
        viewer = client(runs)
        (row,) = viewer.get("/api/runs").json()["runs"]
        run = viewer.get("/api/run", params={"id": "two_calls"}).json()
    assert "steps" not in row  # a store counts its Step records (calls and the answer): 3 here, neither meaning
    assert row["tool_calls"] == 2
    assert (run["steps"], run["tool_calls"]) == (2, 2)
    assert (run["counters"]["steps"][0], run["counters"]["tool_calls"][0]) == (2, 2)
    notes = [m["counted_from"] for m in run["moments"] if m["trigger"] == "tool_done"]
    assert notes == ["after tool call 1", "after tool call 2"]


def test_the_run_shows_its_cost_and_each_tool_edge_the_dollars_spent_by_then(tmp_path: Path) -> None:
    """A priced run: its cost in the run's data, and the cost counter after each call; unpriced, no cost."""
    script = [tool_turn(tool_call("add", a=1, b=2), usage=Usage(6, 4)), reply("3", usage=Usage(20, 10))]
    with SqliteStore(tmp_path / "runs.db") as runs:
        Agent(FakeModel(script), demo_registry(), prices=Price(1000, 1000)).run("sum", store=runs, run_id="priced")
        Agent(FakeModel(script), demo_registry()).run("sum", store=runs, run_id="unpriced")
        viewer = client(runs)
        priced = viewer.get("/api/run", params={"id": "priced"}).json()
        unpriced = viewer.get("/api/run", params={"id": "unpriced"}).json()
    assert priced["cost"] == pytest.approx(0.04)
    ran = next(m for m in priced["moments"] if m["trigger"] == "tool_done")
    assert ran["counters"]["cost"] == [pytest.approx(0.01), None]
    assert unpriced["cost"] is None


def test_every_message_belongs_to_exactly_one_transition(store: SqliteStore) -> None:
    """The message ranges of the transitions follow each other without gap or overlap, up to the last message."""
    for run_id in ("stopped", "finished", "paused"):
        data = store.load(run_id)
        ranges = [m["messages"] for m in moments(data)]
        assert all(a[1] == b[0] for a, b in itertools.pairwise(ranges)), run_id
        assert ranges[-1][1] == len(data["messages"])
        replies = [m for m in moments(data) if m["trigger"] == "replied"]
        for moment in replies:
            end = moment["messages"][1]
            assert data["messages"][end - 1]["role"] == "assistant", run_id


def test_a_trace_of_another_table_is_listed_but_not_lit(tmp_path: Path) -> None:
    """A run of an agent with its own stop, shown over the default table: its stop has no ids to light."""

    def always(view: object) -> bool:
        """Always stop."""
        return True

    mine = StopCondition("mine", "AwaitModel", always)
    agent = Agent(FakeModel([reply("hi")]), demo_registry(), stop_conditions=[mine], on_stop={"mine": "return"})
    with SqliteStore(tmp_path / "own.db") as own:
        result = agent.run("go", store=own, run_id="own")
        assert result.reason == "mine"
        run = client(own).get("/api/run", params={"id": "own"}).json()
        assert run["moments"][-1]["ids"] == []
        assert run["moments"][-1]["label"] == "mine"
        lit = client(own, table=agent.table).get("/api/run", params={"id": "own"}).json()
        assert lit["moments"][-1]["ids"][1] == "stops_AwaitModel"


def test_an_unknown_run_is_404(store: SqliteStore) -> None:
    """Asking for a run the store does not have is a 404 naming it."""
    response = client(store).get("/api/run", params={"id": "nope"})
    assert response.status_code == 404
    assert "nope" in response.json()["error"]


def test_model_text_leaves_the_server_as_json_only(store: SqliteStore) -> None:
    """The hostile answer is a JSON string; no HTML the server sends contains it."""
    viewer = client(store)
    run = viewer.get("/api/run", params={"id": "hostile"})
    assert run.headers["content-type"] == "application/json"
    assert run.json()["final"] == HOSTILE
    page = viewer.get("/run", params={"id": "hostile"})
    assert page.headers["content-type"].startswith("text/html")
    assert "__pwned" not in page.text


# --- guards ----------------------------------------------------------------------------------


def test_a_request_for_another_host_is_refused(store: SqliteStore) -> None:
    """DNS rebinding: a Host the viewer was not bound to gets 421 and no data."""
    viewer = client(store)
    refused = viewer.get("/api/runs", headers={"host": "attacker.example:8765"})
    assert refused.status_code == 421
    assert "runs" not in refused.json()
    assert viewer.get("/api/runs", headers={"host": "localhost:8765"}).status_code == 200
    assert viewer.get("/api/runs", headers={"host": "[::1]:8765"}).status_code == 200


def test_every_answer_carries_a_strict_content_security_policy(store: SqliteStore) -> None:
    """Only the page's own script and style may load; no inline script, no framing."""
    headers = client(store).get("/").headers
    policy = headers["content-security-policy"]
    assert "script-src 'self'" in policy
    assert "unsafe-inline" not in policy
    assert "frame-ancestors 'none'" in policy
    assert headers["x-content-type-options"] == "nosniff"


def test_a_read_only_viewer_refuses_decisions_and_changes_nothing(store: SqliteStore) -> None:
    """Without allow_decisions a decision is 403 and the stored run keeps no approval."""
    response = client(store).post(
        "/api/decide", params={"id": "paused"}, json={"call_id": "call_mail", "approve": True}
    )
    assert response.status_code == 403
    assert "--allow-decisions" in response.json()["error"]
    assert store.load("paused")["approvals"] == {}


def test_an_approval_is_recorded_and_the_resumed_run_makes_the_call(tmp_path: Path) -> None:
    """Approve through the viewer; resuming the stored run (no decision given) sends the email once."""
    sent: list[dict[str, str]] = []
    with SqliteStore(tmp_path / "runs.db") as runs:
        call_id = paused(runs, sent)
        response = client(runs, allow_decisions=True).post(
            "/api/decide", params={"id": "paused"}, json={"call_id": call_id, "approve": True}
        )
        assert response.status_code == 200
        assert response.json()["approvals"] == {call_id: True}
        assert runs.load("paused")["approvals"] == {call_id: True}
        model = FakeModel([reply("mailed")])
        agent = Agent(model, mail_registry(sent), approve={"send_email"})
        result = agent.resume(runs.load("paused"), store=runs).finish()
    assert (result.reason, result.final) == ("done", "mailed")
    assert sent == [{"to": "boss@example.com", "body": "the report"}]


def test_a_rejection_with_a_reason_reaches_the_model_and_the_call_never_runs(tmp_path: Path) -> None:
    """Reject with a why; the resumed run tells the model so and the email is not sent."""
    sent: list[dict[str, str]] = []
    with SqliteStore(tmp_path / "runs.db") as runs:
        call_id = paused(runs, sent)
        body = {"call_id": call_id, "approve": False, "why": "not to the boss"}
        assert client(runs, allow_decisions=True).post("/api/decide", params={"id": "paused"}, json=body).is_success
        assert runs.load("paused")["approvals"] == {call_id: "not to the boss"}
        model = FakeModel([reply("ok, not sent")])
        Agent(model, mail_registry(sent), approve={"send_email"}).resume(runs.load("paused"), store=runs).finish()
    assert sent == []
    rejected = [m for m in model.seen[0] if m.role == "tool"]
    assert "not to the boss" in rejected[-1].content


def test_a_decision_must_be_json_from_the_viewer_s_own_origin(store: SqliteStore) -> None:
    """A form post (no preflight) is 415, another origin 403, a bad body 400; none is recorded."""
    viewer = client(store, allow_decisions=True)
    form = viewer.post("/api/decide", params={"id": "paused"}, data={"call_id": "call_mail", "approve": "true"})
    assert form.status_code == 415
    foreign = viewer.post(
        "/api/decide",
        params={"id": "paused"},
        json={"call_id": "call_mail", "approve": True},
        headers={"origin": "https://attacker.example"},
    )
    assert foreign.status_code == 403
    bad = viewer.post("/api/decide", params={"id": "paused"}, json={"call_id": "call_mail", "approve": "yes"})
    assert bad.status_code == 400
    assert store.load("paused")["approvals"] == {}


@pytest.mark.parametrize(
    ("run_id", "call_id", "message"),
    [("stopped", "c3", "not paused"), ("paused", "other", "not a pending call of the run"), ("nope", "x", "no run")],
)
def test_a_decision_that_cannot_be_taken_says_why(store: SqliteStore, run_id: str, call_id: str, message: str) -> None:
    """A run that is not paused, a call that is not pending, or no such run: 409/404 with the reason."""
    response = client(store, allow_decisions=True).post(
        "/api/decide", params={"id": run_id}, json={"call_id": call_id, "approve": True}
    )
    assert response.status_code in (404, 409)
    assert message in response.json()["error"]


def test_a_second_decision_on_the_same_call_is_refused(store: SqliteStore) -> None:
    """Once decided, a call cannot be decided again from the viewer."""
    viewer = client(store, allow_decisions=True)
    body = {"call_id": "call_mail", "approve": True}
    assert viewer.post("/api/decide", params={"id": "paused"}, json=body).status_code == 200
    again = viewer.post("/api/decide", params={"id": "paused"}, json={**body, "approve": False})
    assert again.status_code == 409
    assert store.load("paused")["approvals"] == {"call_mail": True}


def test_the_same_decision_posted_twice_is_taken_once(store: SqliteStore) -> None:
    """A retried request (a double click, a resent POST) goes on: 200 both times, one write."""
    viewer = client(store, allow_decisions=True)
    body = {"call_id": "call_mail", "approve": True}
    assert viewer.post("/api/decide", params={"id": "paused"}, json=body).status_code == 200
    version = store.load("paused")["stored_seq"]
    assert viewer.post("/api/decide", params={"id": "paused"}, json=body).status_code == 200
    stored = store.load("paused")
    assert (stored["approvals"], stored["stored_seq"]) == ({"call_mail": True}, version)


# --- following and drawing -------------------------------------------------------------------


def test_following_a_finished_run_sends_it_once_then_ends(store: SqliteStore) -> None:
    """The event stream of a run already over is one digest and an `end` event."""
    with client(store).stream("GET", "/api/events", params={"id": "finished"}) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        text = "".join(response.iter_text())
    assert text.count('data: {"run_id"') == 1
    assert text.endswith("event: end\ndata: {}\n\n")


@pytest.mark.usefixtures("dot")
def test_the_machine_drawing_has_the_ids_the_page_lights(store: SqliteStore) -> None:
    """The SVG names each row's edge row<index>, each state's trunk stops_<state>, each state state_<name>."""
    svg = client(store).get("/api/machine.svg")
    assert svg.headers["content-type"].startswith("image/svg+xml")
    for name in (f"row{row_of('max_steps')}", "stops_ExecuteTool", "finalize_Dispatch", "state_Failed"):
        assert f'id="{name}"' in svg.text


def test_without_graphviz_the_drawing_says_how_to_get_it(store: SqliteStore, monkeypatch: pytest.MonkeyPatch) -> None:
    """No dot: 503 with the install line; the rest of the viewer works."""
    monkeypatch.setattr(fsm_agent.ui.app, "dot_installed", lambda: False)
    viewer = client(store)
    response = viewer.get("/api/machine.svg")
    assert response.status_code == 503
    assert "apt-get install graphviz" in response.json()["error"]
    assert viewer.get("/api/run", params={"id": "stopped"}).status_code == 200


# --- the command -----------------------------------------------------------------------------


def test_the_viewer_binds_loopback_unless_told_and_answers_only_its_names() -> None:
    """Loopback names are recognised; a named host adds itself; a wildcard bind answers any Host."""
    assert is_loopback("127.0.0.1")
    assert is_loopback("::1")
    assert is_loopback("localhost")
    assert not is_loopback("0.0.0.0")
    assert not is_loopback("192.168.1.5")
    assert answered_hosts("127.0.0.1") == ["127.0.0.1", "localhost", "::1", "127.0.0.1"]
    assert answered_hosts("box.lan", ["box.lan"]) == ["127.0.0.1", "localhost", "::1", "box.lan", "box.lan"]
    assert answered_hosts("0.0.0.0", ["Box.LAN", "[fe80::1]"]) == [
        "127.0.0.1",
        "localhost",
        "::1",
        "box.lan",
        "fe80::1",
    ]


@pytest.mark.parametrize("host", ["0.0.0.0", "::", "192.0.2.7"])
def test_binding_a_non_loopback_address_without_allowed_host_is_a_usage_error(
    host: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`ui --host 0.0.0.0` (or any address but loopback) without --allowed-host: exit 1, one line naming the flag."""
    with SqliteStore(tmp_path / "runs.db") as runs:
        stopped(runs)
    taken = bind("0.0.0.0", 0)  # were the command to serve anyway, it would fail here instead of blocking the test
    try:
        argv = ["ui", "--store", str(tmp_path / "runs.db"), "--host", host, "--port", str(taken.getsockname()[1])]
        assert cli(argv) == 1
    finally:
        taken.close()
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith(f"error: ui: --host {host} ")
    assert "--allowed-host" in line


def test_a_viewer_that_answers_any_host_takes_no_decisions(store: SqliteStore) -> None:
    """hosts=None turns the Host check off, so a DNS-rebound page would pass the Origin check: refused at once."""
    with pytest.raises(ValueError, match="allow_decisions needs the host names"):
        create_app(store, allow_decisions=True, hosts=None)


def _ask(port: int, method: str, path: str, host: str, body: str | None = None, origin: str = "") -> int:
    """The status of one request to the viewer on 127.0.0.1:port, with the Host (and Origin) a browser would send."""
    headers = {"Host": f"{host}:{port}", "Content-Type": "application/json"} | ({"Origin": origin} if origin else {})
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        connection.request(method, path, body=body, headers=headers)
        return connection.getresponse().status
    finally:
        connection.close()


@pytest.mark.subprocess
def test_a_viewer_on_every_interface_answers_only_its_allowed_hosts_and_no_rebound_decision(tmp_path: Path) -> None:
    """--host 0.0.0.0 --allowed-host NAME (twice): those names and loopback answer; other Hosts, Origins are refused."""
    with SqliteStore(tmp_path / "runs.db") as runs:
        call_id = paused(runs, [])
    process = subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", "ui", "--store", str(tmp_path / "runs.db"), "--host", "0.0.0.0",
         "--allowed-host", "box.lan", "--allowed-host", "Viewer.Example", "--port", "0", "--allow-decisions"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert "(decisions allowed)" in line, line or process.stderr.read()
        port = int(line.split()[2].rstrip("/").rsplit(":", 1)[1])
        assert _ask(port, "GET", "/api/runs", "attacker.example") == 421
        assert [_ask(port, "GET", "/api/runs", name) for name in ("box.lan", "viewer.example", "localhost")] == [
            200
        ] * 3
        decide, decision = "/api/decide?id=paused", json.dumps({"call_id": call_id, "approve": True})
        # A DNS-rebound page: the attacker's name is both its origin and the Host its requests carry.
        rebound = f"http://attacker.example:{port}"
        assert _ask(port, "POST", decide, "attacker.example", decision, origin=rebound) == 421
        assert _ask(port, "POST", decide, "box.lan", decision, origin="http://attacker.example") == 403
        with SqliteStore(tmp_path / "runs.db") as runs:
            assert runs.load("paused")["approvals"] == {}
        assert _ask(port, "POST", decide, "box.lan", decision, origin=f"http://box.lan:{port}") == 200
        with SqliteStore(tmp_path / "runs.db") as runs:
            assert runs.load("paused")["approvals"] == {call_id: True}
    finally:
        process.terminate()
        process.communicate(timeout=10)


def test_a_port_in_use_is_a_setup_error_naming_it() -> None:
    """Binding where something already listens says where, instead of a traceback."""
    taken = bind("127.0.0.1", 0)
    port = taken.getsockname()[1]
    try:
        with pytest.raises(SetupError, match=f"cannot listen on 127.0.0.1:{port}"):
            bind("127.0.0.1", port)
    finally:
        taken.close()


def test_ui_refuses_a_missing_store_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A --store path that does not exist is exit 1 and one line, and no empty store is created."""
    assert cli(["ui", "--store", str(tmp_path / "typo.db")]) == 1
    assert capsys.readouterr().err == f"error: ui: --store {tmp_path / 'typo.db'}: no such file\n"
    assert not (tmp_path / "typo.db").exists()


def test_ui_refuses_a_file_that_is_not_a_store(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A text file given as the store is exit 1, naming it."""
    (tmp_path / "notes.txt").write_text("not a database " * 100, encoding="utf-8")
    assert cli(["ui", "--store", str(tmp_path / "notes.txt")]) == 1
    assert "notes.txt" in capsys.readouterr().err


@pytest.mark.subprocess
def test_ui_command_serves_on_loopback_and_says_where(tmp_path: Path) -> None:
    """`python -m fsm_agent ui --store FILE --port 0` prints its 127.0.0.1 URL, which answers; read-only."""
    with SqliteStore(tmp_path / "runs.db") as runs:
        stopped(runs)
        finished(runs)
    process = subprocess.Popen(
        [sys.executable, "-m", "fsm_agent", "ui", "--store", str(tmp_path / "runs.db"), "--port", "0"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert process.stdout is not None
        line = process.stdout.readline()
        assert line.startswith("fsm_agent ui: http://127.0.0.1:")
        assert "(read-only)" in line
        url = line.split()[2]
        with urllib.request.urlopen(url + "api/runs", timeout=10) as response:
            body = response.read().decode()
        assert '"run_id":"stopped"' in body.replace(" ", "")
    finally:
        process.terminate()
        process.communicate(timeout=10)


def test_an_offset_no_database_takes_is_a_400_not_a_500(store: SqliteStore) -> None:
    """``?offset=10**29`` (past a 64-bit integer) is refused as a bad page, in one line, not a server error."""
    response = client(store).get("/api/runs", params={"offset": str(10**29)})
    assert response.status_code == 400
    assert "offset must be a whole number from 0 to 2**63 - 1" in response.json()["error"]
