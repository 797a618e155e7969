"""The table's definition rules: a malformed table fails at construction, naming the states at fault."""

from __future__ import annotations

import pytest

from fsm_agent import TABLE, DefinitionError, Row, State, Table
from fsm_agent.definition.guards import has_no_tool_calls, is_truncated
from fsm_agent.definition.triggers import GUARDED_ONLY

S = State


def _base() -> list[Row]:
    return [
        Row(S.AwaitModel, "replied", S.CheckTruncation),
        Row(S.CheckTruncation, "check", S.Failed, is_truncated, "max_tokens"),
        Row(S.CheckTruncation, "check", S.Dispatch),
        Row(S.Dispatch, "dispatch", S.Done, has_no_tool_calls),
        Row(S.Dispatch, "dispatch", S.ExecuteTool),
        Row(S.ExecuteTool, "tool_done", S.AwaitModel),
    ]


def test_a_minimal_valid_table_builds() -> None:
    """The base fixture itself is valid, so each case below fails for its own mistake only."""
    assert len(Table(_base(), ["max_tokens"]).rows) == 6


def test_default_table_is_valid_and_has_one_fallback_last_per_trigger() -> None:
    """Every non-terminal state's trigger ends in exactly one unguarded row."""
    for state in (S.AwaitModel, S.CheckTruncation, S.Dispatch, S.ExecuteTool):
        for trigger in {r.trigger for r in TABLE.rows_from(state)} - GUARDED_ONLY:
            rows = TABLE.rows_from(state, trigger)
            assert [r.guard is None for r in rows] == [False] * (len(rows) - 1) + [True]


def test_state_without_exit_is_named() -> None:
    """A non-terminal state with no outgoing row is reported by name."""
    rows = [r for r in _base() if r.source is not S.ExecuteTool]
    with pytest.raises(DefinitionError, match="states with no outgoing edge: ExecuteTool"):
        Table(rows, ["max_tokens"])


def test_reason_on_an_edge_not_into_failed_is_rejected() -> None:
    """A reason belongs only on edges into Failed."""
    rows = _base()
    rows[3] = Row(S.Dispatch, "dispatch", S.Done, has_no_tool_calls, "max_tokens")
    with pytest.raises(DefinitionError, match=r"Dispatch->Done\[max_tokens\]: a reason belongs"):
        Table(rows, ["max_tokens"])


def test_edge_into_failed_without_reason_is_rejected() -> None:
    """Every edge into Failed must say why."""
    rows = _base()
    rows[1] = Row(S.CheckTruncation, "check", S.Failed, is_truncated)
    with pytest.raises(DefinitionError, match="if and only if it goes to Failed"):
        Table(rows, [])


def test_reason_no_edge_uses_is_named() -> None:
    """A declared reason that no edge carries is reported."""
    with pytest.raises(DefinitionError, match="reasons no edge uses: cycle"):
        Table(_base(), ["max_tokens", "cycle"])


def test_undeclared_reason_is_named() -> None:
    """An edge's reason must be declared."""
    with pytest.raises(DefinitionError, match="reason 'max_tokens' is not declared"):
        Table(_base(), [])


def test_unreachable_state_is_named() -> None:
    """A state no path from AwaitModel reaches is reported."""
    rows = _base()
    rows[4] = Row(S.Dispatch, "dispatch", S.AwaitModel)
    rows.pop(5)
    with pytest.raises(DefinitionError, match="states unreachable from AwaitModel: ExecuteTool"):
        Table(rows, ["max_tokens"])


def test_missing_or_misplaced_fallback_is_named() -> None:
    """The unguarded row must be the last of its state and trigger."""
    rows = _base()
    rows[1], rows[2] = rows[2], rows[1]
    with pytest.raises(DefinitionError, match="state CheckTruncation, trigger 'check': needs exactly one unguarded"):
        Table(rows, ["max_tokens"])


def test_lambda_guard_is_rejected() -> None:
    """Guards must be named functions because their names label the edges."""
    rows = _base()
    rows[3] = Row(S.Dispatch, "dispatch", S.Done, lambda run: True)
    with pytest.raises(DefinitionError, match="not lambdas"):
        Table(rows, ["max_tokens"])


def test_edge_out_of_a_terminal_state_is_rejected() -> None:
    """Done and Failed are final."""
    rows = [*_base(), Row(S.Done, "again", S.AwaitModel)]
    with pytest.raises(DefinitionError, match="terminal state Done must have no outgoing edge"):
        Table(rows, ["max_tokens"])


def test_all_problems_are_reported_at_once() -> None:
    """The error lists every mistake, not only the first."""
    rows = [r for r in _base() if r.source is not S.ExecuteTool]
    with pytest.raises(DefinitionError) as info:
        Table(rows, ["max_tokens", "cycle"])
    assert "ExecuteTool" in str(info.value)
    assert "cycle" in str(info.value)
