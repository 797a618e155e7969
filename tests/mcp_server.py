"""A real MCP server for the tests, written with the SDK: ``python tests/mcp_server.py [stdio | http PORT]``.

Its tools cover what the client side must map: plain text, structured
content, an error result, an image, a tool with side effects (counted in the
file named by ``FSM_AGENT_TEST_COUNTS``, so a test can see how often it
really ran) and a tool that kills the server mid-call.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

from mcp.server.mcpserver import Image, MCPServer
from mcp.server.mcpserver.exceptions import ToolError

server = MCPServer("fsm-agent-test")

# A 1x1 transparent PNG: the smallest real image a tool can return.
PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
)


@server.tool()
def echo(text: str) -> str:
    """Say the text back."""
    return text


@server.tool()
def add(a: int, b: int) -> int:
    """Add two integers."""
    return a + b


@server.tool()
def forecast(city: str, days: int = 1) -> dict[str, Any]:
    """A made-up forecast, as structured content."""
    return {"city": city, "days": days, "sky": "clear"}


@server.tool()
def refuse(why: str) -> str:
    """Always fails, with the reason given."""
    raise ToolError(why)


@server.tool()
def picture() -> Image:
    """A one-pixel PNG."""
    return Image(data=PIXEL, format="png")


@server.tool()
def bump(key: str) -> int:
    """Count one side effect under ``key`` and return the new count."""
    path = Path(os.environ["FSM_AGENT_TEST_COUNTS"])
    counts = json.loads(path.read_text()) if path.exists() else {}
    counts[key] = counts.get(key, 0) + 1
    path.write_text(json.dumps(counts))
    return int(counts[key])


@server.tool()
def crash() -> str:
    """Kill the server in the middle of the call, as a crashed server would."""
    os._exit(3)


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]))
    else:
        server.run("stdio")
