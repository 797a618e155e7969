"""Runs whose replies and tool results carry every kind of content, and readers of what a path kept of them.

``rich_agent()`` builds an agent over a scripted model whose first reply asks
for five calls at once (a huge output cut by the registry, a tool that raises,
an empty output, text with a lone surrogate, a sub-agent) with text, provider
data and a full ``Usage``; its second reply is an empty answer carrying only
provider data.  The texts hold astral characters and a lone surrogate, which
the documentation says are kept exactly.  The readers rebuild, from a
snapshot's ``io``, the replies and tool results a path kept, so a test
compares them field by field with what went in.
"""

from __future__ import annotations

import json
from typing import Any

from fsm_agent import Agent, ToolRegistry
from fsm_agent.core.exchanges import ModelExchange, ToolExchange, exchange_of
from fsm_agent.records import Message, ModelResponse, ProviderData, ToolCall, Usage
from fsm_agent.testing import FakeModel, reply
from fsm_agent.tools import ToolResult

ASTRAL = "clef \U0001d11e grin \U0001f600 last \U0010ffff"
"""Characters outside the Basic Multilingual Plane (two UTF-16 units each)."""
LONE = "half an emoji \ud83d here"
"""A lone surrogate, which providers do send; kept exactly (docs/concepts/snapshots.md, Exact text)."""
CAP = 60
"""The rich registry's ``max_output_chars``."""

THINKING = ProviderData(
    "anthropic",
    # Not what json.dumps would write (spacing, escapes, a trailing space): it must come back byte for byte.
    '[ {"type":"thinking", "thinking":"weigh \\u00e9 \U0001d11e", "signature":"c2ln+/=="},'
    ' {"type":"redacted_thinking","data":"\\ud83d"} ] ',
    "weigh \u00e9 \U0001d11e " + LONE,
)
REASONING = ProviderData("openai-responses", '[{"type":"reasoning","encrypted_content":"gAAA\\n=="}]', "")
ASKS = Usage(1200, 340, cache_read_tokens=800, cache_write_tokens=100, reasoning_tokens=120, cost=0.0125)
ANSWERS = Usage(1500, 60, cache_read_tokens=1100, cache_write_tokens=0, reasoning_tokens=40, cost=0.0031)
CHILD_USAGE = Usage(30, 7, reasoning_tokens=3, cost=0.001)


def calls(lone: str = LONE) -> tuple[ToolCall, ...]:
    """The five calls of the first reply; ``lone`` is the lone surrogate text they carry ("" for none)."""
    return (
        ToolCall("c1", "huge", {"n": 5000}),
        ToolCall("c2", "boom", {"why": "bad " + ASTRAL}),
        ToolCall("c3", "empty", {}),
        ToolCall("c4", "echo", {"text": lone + " " + ASTRAL}),
        ToolCall("c5", "helper", {"input": "look up " + ASTRAL}),
    )


CALLS = calls()


def script(lone: str = LONE) -> list[ModelResponse]:
    """The parent's replies: five calls at once with text, thinking and usage; then an empty answer with reasoning."""
    return [
        ModelResponse(
            Message("assistant", "Let me look. " + ASTRAL + lone, calls(lone), provider_data=THINKING), "tool_use", ASKS
        ),
        ModelResponse(Message("assistant", "", provider_data=REASONING), "end_turn", ANSWERS),
    ]


def child_answer(lone: str = LONE) -> str:
    """The sub-agent's answer."""
    return "child says " + ASTRAL + lone


CHILD_ANSWER = child_answer()


def child_script(lone: str = LONE) -> list[ModelResponse]:
    """The sub-agent's one reply."""
    return [reply(child_answer(lone), usage=CHILD_USAGE)]


def rich_tools(child: Agent | None = None) -> ToolRegistry:
    """Tools whose results are cut, failed, empty and odd unicode; ``helper`` is a sub-agent."""
    tools = ToolRegistry(max_output_chars=CAP)

    @tools.register
    def huge(n: int) -> str:
        """A very large output, cut by the registry."""
        return "\U0001f600" * n

    @tools.register
    def boom(why: str) -> str:
        """Always fails."""
        raise RuntimeError(why)

    @tools.register
    def empty() -> str:
        """An empty output."""
        return ""

    @tools.register
    def echo(text: str) -> str:
        """Its input."""
        return text

    helper = child if child is not None else Agent(FakeModel(child_script()), ToolRegistry())
    tools.register(helper.as_tool("helper", "A sub-agent answering one question."))
    return tools


def rich_agent(replies: list[ModelResponse] | None = None, *, lone: str = LONE) -> Agent:
    """The rich agent over ``replies`` (the whole script by default); ``lone`` as in ``script``."""
    helper = Agent(FakeModel(child_script(lone)), ToolRegistry())
    model = FakeModel(script(lone) if replies is None else replies)
    return Agent(model, rich_tools(helper), system="sys " + ASTRAL, max_consecutive_failures=5)


QUESTION = "question " + LONE + " " + ASTRAL


def replies_kept(snapshot: dict[str, Any]) -> list[ModelResponse | None]:
    """The model replies a snapshot (or stored run) kept in its ``io``, as records."""
    return [e.reply for e in map(exchange_of, snapshot["io"]) if isinstance(e, ModelExchange)]


def results_kept(snapshot: dict[str, Any]) -> dict[str, ToolResult]:
    """The tool results a snapshot (or stored run) kept in its ``io``, by call id."""
    return {e.id: e.result for e in map(exchange_of, snapshot["io"]) if isinstance(e, ToolExchange)}


def comparable(result: ToolResult) -> tuple[Any, ...]:
    """A tool result's fields but ``reused_from`` (which a fork sets) and the child's id (a fork's differs)."""
    child = result.child
    shown = (
        None if child is None else (child.input_tokens, child.output_tokens, child.stop, child.tool_calls, child.cost)
    )
    return (result.content, result.error, result.truncated, shown)


def same_json_bytes(a: object, b: object) -> bool:
    """Whether two JSON-ready values are the same, compared as their canonical text (so 1 and 1.0 differ)."""
    return json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)
