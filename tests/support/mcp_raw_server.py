"""A hand-written MCP server over stdio (no SDK), for what the SDK would refuse to send: ``python mcp_raw_server.py``.

It answers ``initialize`` and lists two tools: ``fine`` (an object schema)
and ``odd``, whose ``inputSchema`` is ``{"type": "string"}``, which the
protocol forbids.  ``tools/call`` answers with the tool's name.
"""

from __future__ import annotations

import json
import sys

TOOLS = [
    {"name": "fine", "description": "Fine.", "inputSchema": {"type": "object", "properties": {}}},
    {"name": "odd", "description": "A bad schema.", "inputSchema": {"type": "string"}},
]


def main() -> None:
    for line in sys.stdin:
        request = json.loads(line)
        if "id" not in request:
            continue
        method = request["method"]
        if method == "initialize":
            result = {
                "protocolVersion": request["params"]["protocolVersion"],
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "raw", "version": "0"},
            }
        elif method == "tools/list":
            result = {"tools": TOOLS}
        elif method == "tools/call":
            result = {"content": [{"type": "text", "text": request["params"]["name"]}]}
        else:
            result = {}
        sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}) + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
