"""A table whose row could enter ExecuteTool, or Dispatch from ExecuteTool, with no tool call pending is refused.

``ExecuteTool`` runs the turn's next pending call, and ``Dispatch`` after a
tool call dispatches the next one, so the engine reads the first pending
call there (the effect's batch, ``repeats_last_call``): a run that arrived
with none raised ``IndexError`` from inside the engine.  Such a table could
be built with the public ``Table.with_rows`` (which places a row just before
its trigger's fallback, so after ``ExecuteTool->Dispatch[has_pending_calls]``:
it could fire only once no call is left), and ``check`` passed it.  It is
refused when it is built, the row named, as every other malformed table is.
"""

from __future__ import annotations

import pytest

from fsm_agent import TABLE, DefinitionError, Row, State, Table
from fsm_agent.definition.guards import has_pending_calls

S = State


def another_look(run: object) -> bool:
    """A user's guard that always holds."""
    return True


@pytest.mark.parametrize(
    ("row", "named"),
    [
        (Row(S.ExecuteTool, "tool_done", S.Dispatch, another_look), "ExecuteTool->Dispatch[another_look]"),
        (Row(S.ExecuteTool, "tool_done", S.ExecuteTool, another_look), "ExecuteTool->ExecuteTool[another_look]"),
        (Row(S.CheckTruncation, "check", S.ExecuteTool, another_look), "CheckTruncation->ExecuteTool[another_look]"),
    ],
    ids=["ExecuteTool->Dispatch", "ExecuteTool->ExecuteTool", "CheckTruncation->ExecuteTool"],
)
def test_a_users_row_into_a_tool_call_with_none_pending_is_refused_naming_the_row(row: Row, named: str) -> None:
    with pytest.raises(DefinitionError) as info:
        TABLE.with_rows([row], [])
    assert named in str(info.value)
    assert "pending" in str(info.value)


def test_a_hand_built_table_going_back_to_dispatch_on_its_own_guard_is_refused() -> None:
    """Not only ``with_rows``: a ``Table`` built whole with the row first, before ``has_pending_calls``, too."""
    rows = list(TABLE.rows)
    first = next(i for i, row in enumerate(rows) if row.source is S.ExecuteTool and row.dest is S.Dispatch)
    rows.insert(first, Row(S.ExecuteTool, "tool_done", S.Dispatch, guard=another_look))
    with pytest.raises(DefinitionError, match=r"ExecuteTool->Dispatch\[another_look\]"):
        Table(rows, TABLE.reasons, stops=TABLE.stops)


def test_the_built_in_rows_back_to_dispatch_and_into_execute_tool_still_build() -> None:
    """The rule names what the built-in table does: back to Dispatch on ``has_pending_calls``, into ExecuteTool from
    Dispatch only; a table rebuilt from its rows is valid."""
    back = [row for row in TABLE.rows if row.source is S.ExecuteTool and row.dest is S.Dispatch]
    assert [row.guard for row in back] == [has_pending_calls]
    assert {row.source for row in TABLE.rows if row.dest is S.ExecuteTool} == {S.Dispatch}
    assert Table(TABLE.rows, TABLE.reasons, stops=TABLE.stops) == TABLE
