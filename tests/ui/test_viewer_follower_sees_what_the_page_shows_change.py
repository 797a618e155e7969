"""A tab following a run is sent a page whenever what the page shows changes, a sub-agent run's standing too.

The run page shows, beside the run's own record, where each of its sub-agent
runs stands (state, reason, paused), read from the child's record.  The
stream (``fsm_agent/ui/live.py``) used to decide from a key of the parent's
record alone (state, trace and message counts, paused, approvals), so a child
that moved on while the parent wrote nothing was shown only at the parent's
next write, and a parent's record saved again with the same counts (a
message's text redacted) not at all until then.  Each test follows the run
through the served viewer (``support.viewer_clients``) over a real store (SQLite,
PostgreSQL); ``support.viewer2_children.ReadsCounted`` says when the stream has
read the run again after a write, so no test sleeps.  Every tool call and
model call is counted, and the run is resumed by both drivers.
"""

from __future__ import annotations

import asyncio
import threading
from typing import Any

import pytest
from support.app_owners import JOIN, at_once
from support.shared_runs import Effects, office
from support.viewer2_children import CHILD, PARENT, InFlight, Paused, ReadsCounted, counted_reads
from support.viewer_clients import Shown, follow, post, served

pytest.importorskip("uvicorn", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")


def _child(page: dict[str, Any]) -> dict[str, Any]:
    """The parent page's one sub-agent run, as listed beside it."""
    (child,) = page["children"]
    assert child["run_id"] == CHILD, page["children"]
    return child


def _ended(names: list[str], shown: Shown) -> None:
    """One ``message`` per page, then ``end``; every page a different one (nothing sent twice), the last one Done."""
    assert names == ["message"] * len(shown.pages) + ["end"], names
    assert shown.pages[-1]["state"] == "Done", shown.pages[-1]
    assert all(a != b for a, b in zip(shown.pages, shown.pages[1:], strict=False)), "a page was sent twice"


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_paused_parents_follower_is_sent_its_sub_agent_run_ending_while_the_parent_stays_put(
    store_target: str, driver: str
) -> None:
    """The clerk's run resumed to its end under the paused boss: the follower is sent it before anything else moves."""
    shown, reads, effects = Shown(), list[ReadsCounted](), Effects()
    runs = Paused(effects)
    with served(store_target, wrap=counted_reads(reads), allow_decisions=True) as (store, viewer, logged):
        runs.start(store)

        def other_tab() -> None:
            shown.wait_for(lambda page: _child(page)["paused"], "the paused clerk beside the paused boss")
            runs.resume_clerk(store, driver)
            reads[0].past(2)  # the page built on the first read after the clerk ended was sent
            assert post(viewer.url, "/api/decide", PARENT, {"call_id": "m1", "approve": True})[0] == 200
            runs.resume_boss(store, driver)

        names, ended = at_once(lambda: follow(viewer.url, PARENT, shown), other_tab)
        assert ended is None, ended
        _ended(names, shown)
        first = shown.pages[0]
        assert (first["paused"], _child(first)["state"], _child(first)["paused"]) == (True, "ExecuteTool", True)
        ended_child = [page for page in shown.pages if _child(page)["state"] == "Done"]
        assert ended_child, shown.pages
        # Sent while the boss's record was the one the first page showed: paused, m1 undecided, the same version.
        assert (ended_child[0]["version"], ended_child[0]["approvals"]) == (first["version"], {}), ended_child[0]
        assert _child(ended_child[0]) == {**_child(first), "state": "Done", "reason": "done", "paused": False}
        assert effects == {"k1": 1, "m1": 1}
        assert runs.model_calls() == (1, 2, 1, 1)
        assert not logged.records


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_parent_s_follower_is_sent_each_state_its_sub_agent_run_reaches_during_one_call(
    store_target: str, driver: str
) -> None:
    """The boss waits on its research call; the child's run goes from its tool to its model: the follower sees it."""
    shown, reads, effects = Shown(), list[ReadsCounted](), Effects()
    runs = InFlight(effects)
    with served(store_target, wrap=counted_reads(reads)) as (store, viewer, logged):
        boss = threading.Thread(target=runs.run, args=(store, driver), daemon=True)
        boss.start()
        try:
            assert runs.digging.wait(JOIN), "the sub-agent never ran dig"

            def other_tab() -> None:
                shown.wait_for(lambda page: bool(page["children"]), "the sub-agent run beside the boss")
                runs.dug.set()
                assert runs.asking.wait(JOIN), "the sub-agent's model was never asked again"
                reads[0].past(2)  # the page built on the first read after the child's write was sent
                runs.answer.set()

            names, ended = at_once(lambda: follow(viewer.url, PARENT, shown), other_tab)
        finally:
            runs.dug.set()
            runs.answer.set()
            boss.join(JOIN)
        assert not boss.is_alive()
        assert ended is None, ended
        _ended(names, shown)
        first = shown.pages[0]
        # The boss's record never moved while the child went from its tool call to its model call (and on, to its
        # end, whatever other writes of the child a poll fell between).
        states = [_child(page)["state"] for page in shown.pages if page["version"] == first["version"]]
        assert states[:2] == [_child(first)["state"], "AwaitModel"], states
        assert _child(first)["state"] not in {"AwaitModel", "Done"}, first["children"]
        assert _child(shown.pages[-1])["state"] == "Done", shown.pages[-1]["children"]
        assert effects == {"d1": 1}
        assert (runs.child_model.calls, len(runs.boss_model.seen)) == (2, 2)
        assert not logged.records


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_followed_run_saved_again_with_a_message_redacted_is_sent_though_no_count_changed(
    store_target: str, driver: str
) -> None:
    """A paused run saved again (``store.save``) with its request's text redacted: same counts, new page sent."""
    shown, reads, effects = Shown(), list[ReadsCounted](), Effects()
    with served(store_target, wrap=counted_reads(reads, "office"), allow_decisions=True) as (store, viewer, logged):
        agent, model = office(effects)
        assert agent.run("tidy up, my pin is 1234", store=store, run_id="office").reason == "paused"

        def other_tab() -> None:
            shown.wait_for(lambda page: page["paused"], "the paused run")
            data = store.load("office")
            data["messages"][0]["content"] = "tidy up, my pin is [redacted]"
            store.save("office", data)
            reads[0].past(2)  # the page built on the first read after the save was sent
            for call_id in ("read", "mail"):
                assert post(viewer.url, "/api/decide", "office", {"call_id": call_id, "approve": True})[0] == 200
            again, resumed_model = office(effects)
            run = again.resume(store.load("office"), store=store)
            result = run.finish() if driver == "sync" else asyncio.run(run.afinish())
            assert (result.reason, resumed_model.calls) == ("done", 1)

        names, ended = at_once(lambda: follow(viewer.url, "office", shown), other_tab)
        assert ended is None, ended
        _ended(names, shown)
        texts = [(page["paused"], page["approvals"], page["messages"][0]["content"]) for page in shown.pages]
        # The second page still paused, nothing decided: sent for the save alone.
        assert texts[:2] == [(True, {}, "tidy up, my pin is 1234"), (True, {}, "tidy up, my pin is [redacted]")], texts
        assert effects == {"read": 1, "mail": 1}
        assert model.calls == 1
        assert not logged.records
