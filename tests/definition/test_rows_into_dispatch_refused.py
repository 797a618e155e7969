"""A row into Dispatch or CheckTruncation on a trigger that brings no fresh reply is refused when the table is built.

``Dispatch`` and ``CheckTruncation`` read the model's reply just arrived, and
``Dispatch`` goes on to its tool calls.  A user's row
``AwaitModel->Dispatch`` on ``model_failed`` was accepted and ``check`` said
every run stops; after a turn whose call ran, a model error took the run to
``Dispatch`` with the old reply (it asked for a tool) and nothing pending,
and the engine raised ``IndexError``.  Such a row is refused, a
``DefinitionError`` naming it, as a row into ``ExecuteTool`` with no call
pending already was.
"""

from __future__ import annotations

import pytest

from fsm_agent import TABLE, DefinitionError, Row, State, Table
from fsm_agent.definition.derived import resumes_before_answer, resumes_before_tool
from fsm_agent.definition.guards import has_pending_calls

S = State


def carry_on(run: object) -> bool:
    """A user's guard: after a failed model call, go on with the turn anyway."""
    return True


@pytest.mark.parametrize(
    ("row", "named"),
    [
        (Row(S.AwaitModel, "model_failed", S.Dispatch, carry_on), "AwaitModel->Dispatch[carry_on] on 'model_failed'"),
        (Row(S.AwaitModel, "start", S.Dispatch, carry_on), "AwaitModel->Dispatch[carry_on] on 'start'"),
        (Row(S.AwaitModel, "expired", S.Dispatch, carry_on), "AwaitModel->Dispatch[carry_on] on 'expired'"),
        (
            Row(S.AwaitModel, "model_failed", S.CheckTruncation, carry_on),
            "AwaitModel->CheckTruncation[carry_on] on 'model_failed'",
        ),
        (Row(S.Dispatch, "dispatch", S.CheckTruncation, carry_on), "Dispatch->CheckTruncation[carry_on] on 'dispatch'"),
        (Row(S.Failed, "resume", S.Dispatch, carry_on), "Failed->Dispatch[carry_on] on 'resume'"),
    ],
    ids=[
        "AwaitModel->Dispatch[model_failed]",
        "AwaitModel->Dispatch[start]",
        "AwaitModel->Dispatch[expired]",
        "AwaitModel->CheckTruncation[model_failed]",
        "Dispatch->CheckTruncation",
        "Failed->Dispatch[resume]",
    ],
)
def test_a_row_into_dispatch_or_check_truncation_without_a_fresh_reply_is_refused_naming_it(
    row: Row, named: str
) -> None:
    with pytest.raises(DefinitionError) as info:
        TABLE.with_rows([row], [])
    assert named in str(info.value)
    assert "reply just arrived" in str(info.value)


def test_a_row_into_dispatch_right_after_the_reply_is_accepted() -> None:
    """AwaitModel->Dispatch on ``replied`` skips the reply's check, but the reply is fresh: the table builds."""
    table = TABLE.with_rows([Row(S.AwaitModel, "replied", S.Dispatch, carry_on)], [])
    assert Row(S.AwaitModel, "replied", S.Dispatch, carry_on) in table.rows


def test_the_built_in_rows_into_dispatch_and_check_truncation_still_build() -> None:
    """The rule names what the built-in table does: the reply's checks after ``replied``, back to Dispatch with a
    call pending, and a resume before the tool call, or the answer's check, the run stopped at."""
    into = {
        (str(row.source), row.trigger, row.guard) for row in TABLE.rows if row.dest in (S.Dispatch, S.CheckTruncation)
    }
    assert into == {
        ("AwaitModel", "replied", None),
        ("CheckTruncation", "check", None),
        ("ExecuteTool", "tool_done", has_pending_calls),
        ("Failed", "resume", resumes_before_tool),
        ("Failed", "resume", resumes_before_answer),
    }
    assert Table(TABLE.rows, TABLE.reasons, stops=TABLE.stops) == TABLE
