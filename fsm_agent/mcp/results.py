"""What an MCP ``CallToolResult`` becomes: the text of the tool message the model sees (see the package's doc)."""

from __future__ import annotations

import base64
import binascii
import json
from typing import Any

from fsm_agent.tools import ToolResult


def failure(message: str) -> ToolResult:
    """A failed call: ``{"error": message}``, as for a local tool's failure."""
    return ToolResult(json.dumps({"error": message}, ensure_ascii=False), message)


def too_large(source: str, name: str, cap: int, size: int | None = None) -> ToolResult:
    """The failure of a call whose result was over ``max_result_bytes``."""
    measured = "" if size is None else f" ({size} bytes)"
    return failure(f"{source}: the result of {name!r} is over max_result_bytes={cap}{measured}; it was discarded")


def result_bytes(result: Any) -> int:
    """About the bytes a result took on the wire: those of its texts, its base64 data and its structured content.

    For a transport that cannot stop reading at the cap (an HTTP server that
    answers with plain JSON): the result is checked once the SDK has it.
    """
    size = 0
    for block in result.content or ():
        for part in (block, getattr(block, "resource", None)):
            for field in ("text", "data", "blob"):
                value = getattr(part, field, None)
                if isinstance(value, str):
                    size += len(value.encode("utf-8", "surrogatepass"))
    if result.structured_content is not None:
        size += len(json.dumps(result.structured_content, ensure_ascii=False).encode("utf-8", "surrogatepass"))
    return size


def _byte_count(data: str) -> int:
    try:
        return len(base64.b64decode(data))
    except (binascii.Error, ValueError):
        return len(data)


def _block_text(block: Any) -> str:
    """The text one content block contributes to the tool message (see the package's doc)."""
    kind = getattr(block, "type", None)
    if kind == "text":
        return str(block.text)
    if kind in ("image", "audio"):
        return f"[{kind}: {block.mime_type}, {_byte_count(block.data)} bytes]"
    if kind == "resource_link":
        name = getattr(block, "name", None)
        return f"[resource link: {block.uri}" + (f" ({name})]" if name else "]")
    if kind == "resource":
        resource = block.resource
        text = getattr(resource, "text", None)
        if isinstance(text, str):
            return text
        mime = getattr(resource, "mime_type", None) or "binary"
        return f"[resource {resource.uri}: {mime}, {_byte_count(getattr(resource, 'blob', ''))} bytes]"
    return f"[{kind} content]"


def tool_message(result: Any) -> ToolResult:
    """The ``ToolResult`` of one MCP ``CallToolResult``: its text, and a failure when ``isError`` is set."""
    blocks = list(result.content or ())
    structured = result.structured_content
    if not blocks and structured is not None:
        text = json.dumps(structured, ensure_ascii=False, separators=(",", ":"))
    else:
        text = "\n".join(_block_text(block) for block in blocks)
    if result.is_error:
        return failure(text or "the MCP tool reported an error without a message")
    return ToolResult(text)
