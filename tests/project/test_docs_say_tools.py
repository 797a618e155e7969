"""docs/tutorial/tools.md: a name already taken by ``tools.include(other)`` is a ``ValueError`` naming both sources
and ``prefix=``, which resolves it, also for two plain ``ToolRegistry()``.
"""

from __future__ import annotations

import pytest

from fsm_agent import ToolRegistry


def _two_registries() -> tuple[ToolRegistry, ToolRegistry]:
    mine, other = ToolRegistry(), ToolRegistry()

    @mine.register
    def search(query: str) -> str:
        """Search here."""
        return query

    @other.register(name="search")
    def search_web(query: str) -> str:
        """Search the web."""
        return query

    return mine, other


def test_a_taken_name_is_a_value_error_and_a_prefix_resolves_it() -> None:
    mine, other = _two_registries()
    with pytest.raises(ValueError, match="search"):
        mine.include(other)
    mine.include(other, prefix="web_")
    assert list(mine) == ["search", "web_search"]


def test_the_clash_message_names_both_sources_and_the_prefix() -> None:
    mine, other = _two_registries()
    with pytest.raises(ValueError, match="prefix") as raised:
        mine.include(other)
    assert " from " in str(raised.value)
