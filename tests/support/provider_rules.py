"""The providers' rules about opaque reasoning content, enforced by the loopback server as the real APIs do.

Each rule looks at a request and at every body the server has answered
with, and returns the provider's own 400 when content it issued (a thinking
block's signature, a reasoning item's encrypted content, a thought
signature) is missing, out of place or altered.  The error bodies and
messages follow each provider's API reference and the errors the real
services return, so a test that passes here would not fail there for this
reason.  An adapter that drops the content fails these rules, which is how
the tests show the rule is real.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from support.provider_server import Received, Reply

_ANTHROPIC_THINKING = ("thinking", "redacted_thinking")


def _anthropic_error(message: str) -> Reply:
    return Reply({"type": "error", "error": {"type": "invalid_request_error", "message": message}}, 400)


def anthropic_thinking(received: Received, served: list[dict[str, Any]]) -> Reply | None:
    """Extended thinking: thinking blocks come back unaltered, and the last assistant turn starts with one.

    Signatures are checked against what the server issued, so a changed
    thinking text or signature is refused ("Invalid `signature` in
    `thinking` block"); with ``thinking`` enabled, the assistant turn before
    the latest tool results must start with a thinking block, which a
    dropped or moved block breaks.
    """
    issued = {
        (block.get("thinking"), block.get("signature"), block.get("data"))
        for body in served
        for block in body.get("content", [])
        if block.get("type") in _ANTHROPIC_THINKING
    }
    messages = received.json.get("messages", [])
    for i, message in enumerate(messages):
        if message["role"] != "assistant" or not isinstance(message["content"], list):
            continue
        for j, block in enumerate(message["content"]):
            if block.get("type") not in _ANTHROPIC_THINKING:
                continue
            if (block.get("thinking"), block.get("signature"), block.get("data")) not in issued:
                field = "signature" if block["type"] == "thinking" else "data"
                return _anthropic_error(f"messages.{i}.content.{j}: Invalid `{field}` in `{block['type']}` block")
    if received.json.get("thinking", {}).get("type") != "enabled":
        return None
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=None)
    if last is None:
        return None
    first = messages[last]["content"][0]["type"]
    if first in _ANTHROPIC_THINKING:
        return None
    return _anthropic_error(
        f"messages.{last}.content.0.type: Expected `thinking` or `redacted_thinking`, but found `{first}`. "
        "When `thinking` is enabled, a final `assistant` message must start with a thinking block (preceeding "
        "the lastmost set of `tool_use` and `tool_result` blocks). We recommend you include thinking blocks from "
        "previous turns. To avoid this requirement, disable `thinking`. Please consult our documentation at "
        "https://docs.claude.com/en/docs/build-with-claude/extended-thinking"
    )


def _openai_error(message: str, code: str | None = None) -> Reply:
    error = {"message": message, "type": "invalid_request_error", "param": "input", "code": code}
    return Reply({"error": error}, 400)


def openai_reasoning(received: Received, served: list[dict[str, Any]]) -> Reply | None:
    """Reasoning items come back with their encrypted content unaltered, before the calls they led to."""
    reasoning: dict[str, Any] = {}
    needs: dict[str, str] = {}
    for body in served:
        current = None
        # A streamed answer's last event carries the whole response.
        for item in body.get("output") or body.get("response", {}).get("output", []):
            if item["type"] == "reasoning":
                reasoning[item["id"]] = item.get("encrypted_content")
                current = item["id"]
            elif item["type"] == "function_call" and current is not None:
                needs[item["call_id"]] = current
    items = received.json.get("input", [])
    seen: set[str] = set()
    for index, item in enumerate(items):
        kind = item.get("type")
        if kind == "reasoning":
            if item.get("id") not in reasoning or item.get("encrypted_content") != reasoning[item["id"]]:
                message = f"The encrypted content for item {item.get('id')} could not be verified."
                return _openai_error(message, "invalid_encrypted_content")
            if index + 1 == len(items) or items[index + 1].get("type") == "reasoning":
                return _openai_error(
                    f"Item '{item['id']}' of type 'reasoning' was provided without its required following item."
                )
            seen.add(item["id"])
        elif kind == "function_call" and item.get("call_id") in needs and needs[item["call_id"]] not in seen:
            name = item.get("id", item["call_id"])
            required = needs[item["call_id"]]
            return _openai_error(
                f"Item '{name}' of type 'function_call' was provided without its required 'reasoning' item: "
                f"'{required}'."
            )
    return None


def _signature_bytes(text: str) -> bytes | None:
    # Protocol buffers' JSON reads standard and URL-safe base64 alike, so the bytes are what is compared.
    try:
        return base64.urlsafe_b64decode(text.replace("+", "-").replace("/", "_") + "=" * (-len(text) % 4))
    except (binascii.Error, ValueError):
        return None


def _gemini_error(message: str) -> Reply:
    return Reply({"error": {"code": 400, "message": message, "status": "INVALID_ARGUMENT"}}, 400)


def gemini_thought_signatures(received: Received, served: list[dict[str, Any]]) -> Reply | None:
    """The first function call of each model turn carries the thought signature issued with it, unaltered."""
    signed: set[str] = set()
    issued: set[bytes] = set()
    for body in served:
        for candidate in body.get("candidates", []):
            for part in candidate.get("content", {}).get("parts", []):
                signature = _signature_bytes(part.get("thoughtSignature", ""))
                if "functionCall" in part and signature:
                    signed.add(part["functionCall"]["name"])
                    issued.add(signature)
    for position, content in enumerate(received.json.get("contents", [])):
        if content.get("role") != "model":
            continue
        calls = [part for part in content.get("parts", []) if "functionCall" in part]
        if not calls or calls[0]["functionCall"]["name"] not in signed:
            continue
        first = calls[0]
        name = first["functionCall"]["name"]
        if "thoughtSignature" not in first:
            return _gemini_error(
                "Function call is missing a thought_signature in functionCall parts. This is required for tools "
                "to work correctly, and missing thought_signature may lead to degraded model performance. "
                f"Additional data, function call `default_api:{name}` , position {position + 1}. Please refer to "
                "https://ai.google.dev/gemini-api/docs/thought-signatures for more details."
            )
        if _signature_bytes(first["thoughtSignature"]) not in issued:
            return _gemini_error(f"Corrupted thought signature for function call `default_api:{name}`.")
    return None
