"""A tiny MCP server for the README's example: two text tools, spoken to over stdio.

Run by ``examples/mcp_agent.py`` (``python examples/mcp_agent.py``); written
with the official SDK, as any MCP server would be.
"""

from __future__ import annotations

from mcp.server.mcpserver import MCPServer

server = MCPServer("fsm-agent-example")


@server.tool()
def word_count(text: str) -> int:
    """Count the words of a text."""
    return len(text.split())


@server.tool()
def shout(text: str) -> str:
    """The text in capitals."""
    return text.upper()


if __name__ == "__main__":
    server.run("stdio")
