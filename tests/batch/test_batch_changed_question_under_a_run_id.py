"""A question list that changed between passes: an edited question must never get the old question's answer.

Under a derived run id an edited question is a new run; under an explicit
one it is an ``error`` result saying the id holds another question's run.
"""

from __future__ import annotations

from pathlib import Path

from support.batch_agents import MODEL_LOG, factory, lines
from support.batch_audit import first_question

from fsm_agent import Message, SqliteStore
from fsm_agent.batch import run_batch
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.persist import open_store


def test_an_edited_question_without_a_run_id_is_a_new_run_and_the_unchanged_ones_are_read_back(tmp_path: Path) -> None:
    """Derived ids: the edited question runs afresh, the others come from the store without a model call."""
    store = tmp_path / "runs.db"
    first = run_batch(factory(tmp_path), ["question 0", "question 1", "question 2"], store=store, executor="local",
                      progress=False)  # fmt: skip
    calls = len(lines(tmp_path / MODEL_LOG))
    second = run_batch(factory(tmp_path), ["question 0", "question one", "question 2"], store=store,
                       executor="local", progress=False)  # fmt: skip
    assert [r.final for r in second] == ["answer to question 0", "answer to question one", "answer to question 2"]
    assert [second[0], second[2]] == [first[0], first[2]]
    assert len(lines(tmp_path / MODEL_LOG)) == calls + 4  # only the edited question's run: three calls and an answer


def test_an_edited_question_under_its_old_run_id_is_not_answered_with_the_old_answer(tmp_path: Path) -> None:
    """The second pass asks something else under ``ticket-7``: an error naming both questions; nothing runs."""
    store = tmp_path / "runs.db"
    [first] = run_batch(factory(tmp_path), [{"input": "How tall is the tower?", "run_id": "ticket-7"}], store=store,
                        executor="local", progress=False)  # fmt: skip
    calls = len(lines(tmp_path / MODEL_LOG))
    [again] = run_batch(factory(tmp_path), [{"input": "How old is the bridge?", "run_id": "ticket-7"}], store=store,
                        executor="local", progress=False)  # fmt: skip
    assert first_question(again) == "How old is the bridge?" or again.reason == "error", (again.reason, again.final)
    assert (again.reason, again.evidence["type"], again.evidence["run_id"]) == ("error", "RunStateError", "ticket-7")
    error = again.evidence["error"]
    assert "'How tall is the tower?'" in error
    assert "'How old is the bridge?'" in error
    assert "new run_id" in error
    assert "delete the stored run" in error
    assert len(lines(tmp_path / MODEL_LOG)) == calls  # nothing was run for it
    with open_store(str(store)) as opened:
        assert first_question(stored_result(None, opened.load("ticket-7"))) == "How tall is the tower?"
    [same] = run_batch(factory(tmp_path), [{"input": "How tall is the tower?", "run_id": "ticket-7"}], store=store,
                       executor="local", progress=False)  # fmt: skip
    assert same == first  # the stored run's own question still reads it back


def test_a_stored_run_that_continued_a_conversation_is_compared_on_its_own_question(tmp_path: Path) -> None:
    """A run started with a history under an explicit id: its question is the one after that history."""
    store = SqliteStore(tmp_path / "runs.db")
    history = [Message("user", "Earlier question?"), Message("assistant", "Earlier answer.")]
    stored = factory(tmp_path)().run("How tall is the tower?", store=store, run_id="ticket-9", history=history)
    store.close()
    calls = len(lines(tmp_path / MODEL_LOG))
    [again] = run_batch(factory(tmp_path), [{"input": "How tall is the tower?", "run_id": "ticket-9"}],
                        store=tmp_path / "runs.db", executor="local", progress=False)  # fmt: skip
    assert (again.reason, again.final) == ("done", stored.final)
    assert len(lines(tmp_path / MODEL_LOG)) == calls
    [other] = run_batch(factory(tmp_path), [{"input": "Earlier question?", "run_id": "ticket-9"}],
                        store=tmp_path / "runs.db", executor="local", progress=False)  # fmt: skip
    assert other.reason == "error"
    assert "asked 'How tall is the tower?'" in other.evidence["error"]
