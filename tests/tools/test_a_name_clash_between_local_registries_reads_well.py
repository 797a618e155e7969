"""Including a registry whose tool name is taken: the message reads well when both registries are local tools.

Before, it said "tool 'x' from local tools clashes with 'x' from local
tools", naming one source twice as if it were two.
"""

from __future__ import annotations

import re

import pytest

from fsm_agent import ToolRegistry


def one_tool(source: str = "local tools") -> ToolRegistry:
    tools = ToolRegistry(source=source)
    tools.register(lambda: "x", name="search")
    return tools


def test_two_local_registries_clash_with_the_tool_already_registered_here() -> None:
    """One source, named once; the fix, ``prefix=``, still named."""
    message = re.escape(
        "tool 'search' from local tools clashes with the 'search' already registered here; include one with prefix=..."
    )
    with pytest.raises(ValueError, match=f"^{message}$"):
        one_tool().include(one_tool())


def test_two_sources_are_both_named() -> None:
    """Registries of different sources still name both."""
    with pytest.raises(ValueError, match="'search' from web tools clashes with 'search' from local tools"):
        one_tool().include(one_tool("web tools"))
