"""A real MCP server for the tests, on the SDK: ``python tests/support/mcp_server.py [http PORT [json]|names]``.

Its tools cover what the client side must map: plain text, structured
content, an error result, an image, a tool with side effects (counted in the
file named by ``FSM_AGENT_TEST_COUNTS``, so a test can see how often it
really ran), a tool that kills the server mid-call and one whose answer is as
big as asked.  Without arguments it speaks over stdio; ``http PORT json``
answers each request with plain JSON instead of an event stream.
``names [reversed]`` is another server: tools with legal MCP names that meet
once made acceptable to providers, listed in either order.
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


@server.tool(structured_output=False)  # text only: the answer is ``size`` characters and its JSON-RPC envelope
def flood(size: int) -> str:
    """A text of ``size`` characters, to go over a cap on the size of a result."""
    return "x" * size


CLASHING_NAMES = ["a.b", "a_b", "t" * 64 + "_alpha", "t" * 64 + "_gamma", "ü", "ö"]
"""Legal MCP tool names that meet when made acceptable to providers (1-64 letters, digits, ``_``, ``-``)."""


def _says(name: str) -> Any:
    def say() -> str:
        return name

    return say


def name_server(names: list[str]) -> MCPServer:
    """A server whose tools are called ``names``; each answers with its own name, so a test sees which one ran."""
    named = MCPServer("fsm-agent-test-names")
    for name in names:
        named.add_tool(_says(name), name=name, description=f"Says {name!r}.")
    return named


if __name__ == "__main__":
    if sys.argv[1:2] == ["http"]:
        json_response = sys.argv[3:4] == ["json"]
        server.run("streamable-http", host="127.0.0.1", port=int(sys.argv[2]), json_response=json_response)
    elif sys.argv[1:2] == ["names"]:
        name_server(CLASHING_NAMES[::-1] if sys.argv[2:3] == ["reversed"] else CLASHING_NAMES).run("stdio")
    else:
        server.run("stdio")
