"""The README's rendered blocks: drawn from the table, and kept in step with it."""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_agent import TABLE, Agent, StopCondition
from fsm_agent.render.markdown import fill, reasons_table, render_blocks, stops_by_state
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.testing import FakeModel, demo_registry

README = Path(__file__).resolve().parent.parent / "README.md"


def test_committed_readme_blocks_match_a_fresh_render() -> None:
    """A table change without `make diagram` leaves the README stale, and this fails."""
    text = README.read_text(encoding="utf-8")
    fresh = fill(text, render_blocks(TABLE, to_mermaid(TABLE, compact=True)))
    assert fresh == text, "README is stale: run `make diagram`"


def test_every_reason_has_a_row_and_every_state_its_edges_in_order() -> None:
    """The reasons table lists each reason once; the stop list follows row order per state."""
    table = reasons_table(TABLE)
    for reason in TABLE.reasons:
        assert table.count(f"| `{reason}` |") == 1
    stops = stops_by_state(TABLE)
    dispatch = stops.split("- **Dispatch**")[1].split("- **ExecuteTool**")[0]
    assert dispatch.index("**Done**") < dispatch.index("Failed(cancelled)") < dispatch.index("**ExecuteTool**")


def test_user_stops_appear_in_their_agents_rendering() -> None:
    """An agent's own stop is rendered from that agent's table, with its description."""

    def too_long(view: object) -> bool:
        """The conversation grew past a hundred messages."""
        return False

    agent = Agent(FakeModel([]), demo_registry(), stop_conditions=[StopCondition("too_long", "AwaitModel", too_long)])
    assert "**Failed(too_long)** when `replied` [`too_long`]: The conversation grew" in stops_by_state(agent.table)
    assert "| `too_long` | AwaitModel (`replied`) |" in reasons_table(agent.table)


def test_fill_names_a_missing_marker() -> None:
    """A README without a block's markers is an error naming the block, not a silent skip."""
    with pytest.raises(ValueError, match="no <!-- stops:start -->"):
        fill("no markers here", {"stops": "x"})
