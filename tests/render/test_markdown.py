"""The rendered blocks of the README and the docs: drawn from the table and the parsers, and kept in step with them."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from fsm_agent import TABLE, Agent, StopCondition
from fsm_agent.cli.diagram import ALL_BLOCKS
from fsm_agent.cli.main import build_parser
from fsm_agent.cli.reference import cli_reference, usage
from fsm_agent.proof.report import proof_block
from fsm_agent.render.markdown import fill, marked, reasons_table, render_blocks, stops_by_state
from fsm_agent.render.mermaid import to_mermaid
from fsm_agent.testing import FakeModel, demo_registry

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
MARKED = [page for page in PAGES if marked(page.read_text(encoding="utf-8"), ALL_BLOCKS)]


def _fresh_blocks() -> dict[str, str]:
    """What `make diagram` writes: the table's blocks with the compact picture, the CLI reference and the proof."""
    return render_blocks(TABLE, to_mermaid(TABLE, compact=True)) | {"cli": cli_reference(), "proof": proof_block(TABLE)}


@pytest.mark.parametrize("page", MARKED, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_committed_blocks_match_a_fresh_render(page: Path) -> None:
    """A table or flag change without `make diagram` leaves a page stale, and this fails naming it."""
    text = page.read_text(encoding="utf-8")
    assert fill(text, _fresh_blocks()) == text, f"{page.relative_to(ROOT)} is stale: run `make diagram`"


@pytest.mark.parametrize(
    ("page", "blocks"),
    [
        ("docs/concepts/machine.md", {"stops"}),  # the site shows the Graphviz drawings, not Mermaid
        ("docs/concepts/stops.md", {"reasons"}),
        ("docs/reference/cli.md", {"cli"}),
        ("README.md", {"machine"}),
    ],
)
def test_the_pages_that_show_a_block_still_carry_it(page: str, blocks: set[str]) -> None:
    """Deleting a block's markers would leave the staleness test nothing to check: these must stay."""
    assert blocks <= set(marked((ROOT / page).read_text(encoding="utf-8"), ALL_BLOCKS))


def test_every_reason_has_a_row_and_every_state_its_edges_in_order() -> None:
    """The reasons table lists each reason once; the stop list follows row order per state."""
    table = reasons_table(TABLE)
    for reason in TABLE.reasons:
        assert table.count(f"| `{reason}` |") == 1
    stops = stops_by_state(TABLE)
    dispatch = stops.split("- **Dispatch**")[1].split("- **ExecuteTool**")[0]
    done = dispatch.index("`Dispatch->Done[has_no_tool_calls]`")
    stop = dispatch.index("`Dispatch->Failed[cancelled]` on `dispatch`")
    assert done < stop < dispatch.index("`Dispatch->ExecuteTool`")


def test_user_stops_appear_in_their_agents_rendering() -> None:
    """An agent's own stop is rendered from that agent's table, with its description."""

    def too_long(view: object) -> bool:
        """The conversation grew past a hundred messages."""
        return False

    agent = Agent(FakeModel([]), demo_registry(), stop_conditions=[StopCondition("too_long", "AwaitModel", too_long)])
    listed = stops_by_state(agent.table)
    assert "`AwaitModel->Failed[too_long]` on `replied` if `too_long`: The conversation grew" in listed
    assert "| `too_long` | AwaitModel (`replied`) |" in reasons_table(agent.table)


def test_fill_rewrites_the_blocks_a_text_has_and_leaves_the_rest() -> None:
    """A page carries any subset of the blocks, each as often as it likes; other text is untouched."""
    text = "a\n<!-- stops:start -->\nold\n<!-- stops:end -->\nb\n<!-- stops:start -->\n<!-- stops:end -->\nc\n"
    new = fill(text, {"stops": "S", "reasons": "R"})
    assert new == "a\n<!-- stops:start -->\nS\n<!-- stops:end -->\nb\n<!-- stops:start -->\nS\n<!-- stops:end -->\nc\n"
    assert (
        fill("<!-- x:start -->\n<!-- x:end -->", {"x": r"\1 \g<0>"}) == "<!-- x:start -->\n\\1 \\g<0>\n<!-- x:end -->"
    )


def test_fill_names_what_is_missing() -> None:
    """A text without any block, or with half of one, is an error naming it, never a silent skip."""
    with pytest.raises(ValueError, match=r"no rendered block: .* NAME one of stops, reasons"):
        fill("no markers here", {"stops": "x", "reasons": "y"})
    with pytest.raises(ValueError, match="the stops block needs a <!-- stops:start --> line and then"):
        fill("<!-- stops:start -->\nno end\n", {"stops": "x"})
    with pytest.raises(ValueError, match="the stops block needs"):
        fill("<!-- stops:end -->\n<!-- stops:start -->\n", {"stops": "x"})


def test_a_marker_inside_a_sentence_is_not_a_block() -> None:
    """Only a marker on a line of its own counts, so a page may name the markers in its prose."""
    prose = "Write `<!-- stops:start -->` and `<!-- stops:end -->` on lines of their own.\n"
    assert marked(prose, ["stops"]) == []


def _parsers(parser: argparse.ArgumentParser) -> list[argparse.ArgumentParser]:
    found = [parser]
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in action.choices.values():
                found += _parsers(sub)
    return found


def test_the_cli_reference_lists_every_command_and_flag() -> None:
    """Every command (and `runs` action) has a section, and every flag of it a row with its help."""
    reference = cli_reference()
    for parser in _parsers(build_parser())[1:]:
        name = parser.prog.removeprefix("python -m fsm_agent ")
        assert f"`{name}`\n" in reference, name
        assert usage(parser) in reference
        for action in parser._actions:
            if isinstance(action, argparse._HelpAction):
                continue  # said once for every command
            for flag in action.option_strings:
                section = reference.split(f"`{name}`\n", 1)[1]
                assert re.search(rf"^\| (`|<code>)([-\w]+, )?{flag}\b", section, re.M), f"{name} {flag}"


def test_the_usage_does_not_depend_on_the_terminal(monkeypatch: pytest.MonkeyPatch) -> None:
    """`make diagram` in a narrow terminal writes the same page as in a wide one."""
    monkeypatch.setenv("COLUMNS", "40")
    narrow = cli_reference()
    monkeypatch.setenv("COLUMNS", "300")
    assert cli_reference() == narrow
