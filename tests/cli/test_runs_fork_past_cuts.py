"""``python -m fsm_agent runs fork`` on a stored run cut by its timeout or a task cancel, then resumed to its end.

The fork is taken past the cut: it rebuilds the stop and its resume calling
nothing (the agent the command builds, ``support.fork_past_cuts:make``,
counts every model request and tool run) and makes each call past the fork
point once (``--rerun-all``), on SQLite and on PostgreSQL.
"""

from __future__ import annotations

from collections import Counter

import pytest
from support.fork_past_cuts import ANSWER, CLI, after_the_cut, cut_source

from fsm_agent import Transition
from fsm_agent.__main__ import main
from fsm_agent.persist import open_store


@pytest.mark.parametrize("how", [pytest.param("timeout-sync", marks=pytest.mark.slow), "task-cut-model"])  # 0.5 s
def test_runs_fork_takes_a_source_past_its_cut_and_runs_it_once(
    store_target: str, how: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """``fsm-agent runs fork`` past a timeout (or a task cut) prints the answer, exit 0; the rebuild calls nothing."""
    with open_store(store_target) as store:
        _, source, _, _ = cut_source(how, store)
        stored = store.export("src")
    at = after_the_cut(source.trace)
    arguments = ["runs", "fork", "src", "--at", str(at), "--store", store_target, "--run-id", "f1", "--rerun-all"]
    code = main([*arguments, "--agent", "support.fork_past_cuts:make", "--quiet"])
    out = capsys.readouterr()
    assert (code, out.out) == (0, f"{ANSWER}\n"), out.err
    model, tool = CLI
    assert (model.asked, tool.ran) == (2, Counter({"c3": 1}))
    with open_store(store_target) as store:
        assert store.export("src") == stored
        forked = store.load("f1")
        assert forked["forked_from"] == ["src", at]
        assert [Transition(**t) for t in forked["trace"]] == list(source.trace)
