"""A second real MCP server for the audit tests, on the SDK: ``python tests/support/mcp_audit_server.py [MODE]``.

Every tool counts its calls by label in the JSON file named by
``FSM_AGENT_TEST_COUNTS`` (``<label>`` when it completes, ``<label>:started``
as it starts), so a test sees on the server's side how often each really ran.
``hang`` and ``bump`` also list, by label, the run and call ids each request's
``_meta`` named (``"<run_id> <call_id> <start_id>"``) in ``<counts stem>.keys.json``
beside it.

- ``hang(label)`` counts its start; its first call under a label then
  waits until its request is cancelled or the server exits (a call a run's
  timeout or cancel cuts), a later one completes and counts ``<label>``.
- ``bump(label)`` counts one completed side effect.
- ``once(label)`` makes its effect (counts ``label``) once per run, start
  and call its request names, and counts every request as ``label:sent``;
  ``once_then_hang(label)`` then waits, on its first request, as ``hang``.
- ``retire(name)`` removes the tool ``name`` from the server: the tool list
  changes under a client that listed it earlier.
- ``mixed()`` returns text, an image, an embedded text resource, an embedded
  binary resource and a resource link, in that order.
- ``shaped()`` returns structured content only (no content blocks).
- ``fail_empty()`` is an error result without any text.

MODE ``badschema`` adds a tool whose input schema is not an object schema;
MODE ``contextarg`` one with an argument named as the client's context
parameter (``_fsm_agent_context``).
"""

from __future__ import annotations

import base64
import json
import os
import sys
import threading
from pathlib import Path
from typing import Any

import anyio
import mcp_types
from mcp.server.mcpserver import Context, MCPServer

server = MCPServer("fsm-agent-audit")

PIXEL = bytes.fromhex(
    "89504e470d0a1a0a0000000d4948445200000001000000010806000000"
    "1f15c4890000000d49444154789c63000100000500010d0a2db40000000049454e44ae426082"
)


_COUNTING = threading.Lock()
"""Sync tools run in worker threads beside the async ones on the loop: one count at a time."""


def _count(key: str) -> int:
    with _COUNTING:
        return _count_locked(key)


def _count_locked(key: str) -> int:
    path = Path(os.environ["FSM_AGENT_TEST_COUNTS"])
    counts = json.loads(path.read_text()) if path.exists() else {}
    counts[key] = counts.get(key, 0) + 1
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(counts))
    tmp.replace(path)  # a reader never sees half a file
    return int(counts[key])


def _keyed(label: str, ctx: Context) -> None:
    """List the run, call and start ids the request's ``_meta`` named, under ``label``."""
    meta = ctx.request_context.meta or {}
    with _COUNTING:
        path = Path(os.environ["FSM_AGENT_TEST_COUNTS"])
        path = path.with_name(f"{path.stem}.keys.json")
        keys = json.loads(path.read_text()) if path.exists() else {}
        named = (meta.get(f"fsm-agent/{key}") for key in ("run_id", "call_id", "start_id"))
        keys.setdefault(label, []).append(" ".join(map(str, named)))
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(keys))
        tmp.replace(path)


@server.tool()
async def hang(label: str, ctx: Context) -> str:
    """Count the start; the first call under ``label`` then waits until cancelled, a later one completes."""
    _keyed(label, ctx)
    if _count(f"{label}:started") == 1:
        await anyio.sleep_forever()
    return f"{label} finished after {_count(label)}"


@server.tool()
def bump(label: str, ctx: Context) -> int:
    """Count one side effect under ``label``."""
    _keyed(label, ctx)
    return _count(label)


def _made_once(label: str, ctx: Context) -> bool:
    """Count ``label:sent``; make the effect (count ``label``) unless a request with the same keys made it."""
    meta = ctx.request_context.meta or {}
    key = " ".join(str(meta.get(f"fsm-agent/{name}")) for name in ("run_id", "start_id", "call_id"))
    with _COUNTING:
        _count_locked(f"{label}:sent")
        path = Path(os.environ["FSM_AGENT_TEST_COUNTS"])
        path = path.with_name(f"{path.stem}.once.json")
        made = json.loads(path.read_text()) if path.exists() else []
        if key in made:
            return False
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps([*made, key]))
        tmp.replace(path)
        _count_locked(label)
        return True


@server.tool()
def once(label: str, ctx: Context) -> str:
    """A server that makes its effect once per run, start and call (``docs/how-to/mcp.md``)."""
    return "made" if _made_once(label, ctx) else "made before"


@server.tool()
async def once_then_hang(label: str, ctx: Context) -> str:
    """As ``once``; the first request under ``label`` then waits until cancelled (its answer never arrives)."""
    made = _made_once(label, ctx)
    if _count(f"{label}:started") == 1:
        await anyio.sleep_forever()
    return "made" if made else "made before"


@server.tool()
def retire(name: str) -> str:
    """Remove the tool ``name`` from this server."""
    server.remove_tool(name)
    return f"retired {name}"


@server.tool()
def mixed() -> list[Any]:
    """Text, an image, embedded resources (text and binary) and a resource link."""
    return [
        mcp_types.TextContent(type="text", text="intro"),
        mcp_types.ImageContent(type="image", data=base64.b64encode(PIXEL).decode(), mime_type="image/png"),
        mcp_types.EmbeddedResource(
            type="resource",
            resource=mcp_types.TextResourceContents(uri="file:///notes.txt", text="note text", mime_type="text/plain"),
        ),
        mcp_types.EmbeddedResource(
            type="resource",
            resource=mcp_types.BlobResourceContents(
                uri="file:///blob.bin", blob=base64.b64encode(b"\x00\x01\x02").decode(), mime_type="application/x"
            ),
        ),
        mcp_types.ResourceLink(type="resource_link", uri="file:///big.csv", name="big.csv"),
    ]


@server.tool()
def shaped() -> mcp_types.CallToolResult:
    """Structured content only."""
    return mcp_types.CallToolResult(content=[], structured_content={"n": 1, "s": "é"})


@server.tool()
def fail_empty() -> mcp_types.CallToolResult:
    """An error result with no text at all."""
    return mcp_types.CallToolResult(content=[], is_error=True)


def _listing_also(schema: dict[str, Any]) -> None:
    """List one more tool, ``odd``, with ``schema`` (listed only: never called)."""
    original = server.list_tools

    async def listed() -> list[mcp_types.Tool]:
        tools = await original()
        tools.append(mcp_types.Tool(name="odd", description="An odd schema.", input_schema=schema))
        return tools

    server.list_tools = listed  # type: ignore[method-assign]


if __name__ == "__main__":
    if sys.argv[1:2] == ["badschema"]:
        _listing_also({"type": "string"})
    if sys.argv[1:2] == ["contextarg"]:
        _listing_also({"type": "object", "properties": {"_fsm_agent_context": {"type": "string"}}})
    server.run("stdio")
