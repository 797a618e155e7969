"""Anthropic structured outputs: a typed agent's schema as Claude's ``output_config.format`` accepts it.

Claude requires every object to close (``additionalProperties: false``) and
refuses numeric, length and most format constraints, so the schema sent is an
adapted copy; the agent still checks the answer against the full schema.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from fsm_agent.records import OutputSchema

_UNSUPPORTED = frozenset(
    {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf", "minLength", "maxLength"}
    | {"maxItems", "uniqueItems"}
)
"""Keywords refused in any schema; ``minItems`` is refused above 1, ``format`` outside ``_FORMATS``."""
_FORMATS = frozenset({"date-time", "time", "date", "duration", "email", "hostname", "uri", "ipv4", "ipv6", "uuid"})
_NAMED_SUBSCHEMAS = ("properties", "patternProperties", "$defs", "definitions", "dependentSchemas")
_SUBSCHEMA_LISTS = ("anyOf", "allOf", "oneOf", "prefixItems")
_SUBSCHEMAS = ("items", "additionalProperties", "not", "contains", "if", "then", "else")


def to_claude_schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A copy of ``schema`` that Claude's structured outputs accept; ``schema`` itself is left as it was.

    The documented rules, and what is done to meet them:

    - Every object must set ``additionalProperties`` to ``false``: an object
      with ``properties`` that leaves it out gets it (JSON Schema's default
      would allow other keys).  An object that allows other keys on purpose
      (a ``dict[str, int]`` field), or lists no properties, is left as it
      is, and the API's 400 names it: closing it would allow only ``{}``.
    - Numeric and string limits (``minimum``, ``maxLength``, ...), array
      limits past ``minItems`` 0 or 1, and string formats outside Claude's
      list are refused: each is taken out and written into the
      description instead, as the ``anthropic`` SDK's ``transform_schema``
      does.  The agent still checks the answer against the whole schema,
      and asks again when a limit is missed.

    Recursive schemas are refused too; nothing here can mend that.
    """
    adapted: dict[str, Any] = copy.deepcopy(schema)
    _adapt(adapted)
    return adapted


def _adapt(node: Any) -> None:
    if not isinstance(node, dict):
        return  # true and false are schemas too, with nothing in them to adapt
    for key in _NAMED_SUBSCHEMAS:
        if isinstance(node.get(key), dict):
            for subschema in node[key].values():
                _adapt(subschema)
    for key in _SUBSCHEMA_LISTS:
        if isinstance(node.get(key), list):
            for subschema in node[key]:
                _adapt(subschema)
    for key in _SUBSCHEMAS:
        _adapt(node.get(key))
    if isinstance(node.get("properties"), dict):
        node.setdefault("additionalProperties", False)
    moved = [key for key in node if _unsupported(key, node[key])]
    if moved:
        limits = ", ".join(f"{key}: {json.dumps(node.pop(key), ensure_ascii=False)}" for key in moved)
        description = node.get("description")
        node["description"] = f"{description}\n\n{{{limits}}}" if isinstance(description, str) else f"{{{limits}}}"


def _unsupported(key: str, value: Any) -> bool:
    if key == "minItems":
        return value not in (0, 1)
    if key == "format":
        return not isinstance(value, str) or value not in _FORMATS
    return key in _UNSUPPORTED


def to_anthropic_output(output: OutputSchema) -> dict[str, Any]:
    """``output`` as the Messages API's ``output_config.format``: a JSON output in Claude's schema subset.

    The format holds only the type and the schema: Claude's JSON outputs
    have no name, description or strict flag (decoding is always
    constrained); a description inside the schema goes along.
    """
    return {"type": "json_schema", "schema": to_claude_schema(output.schema)}
