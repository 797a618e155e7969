"""The oracle: the seed chapter's plain-loop ``run()``, written out again, for differential tests of the engine.

It follows the chapter's loop line by line (section 3.2.7), and departs from
it only where the engine documents a different rule on purpose:

- a tool call failed when ``ToolRegistry.execute(...).error`` is set (the
  chapter searched the result text for ``"error"``, which misreads a result
  that merely mentions the word);
- a model that raises, returns something other than a well-formed
  ``ModelResponse``, or gives a ``stop_reason`` outside ``STOP_REASONS`` ends
  the run with ``model_error`` (the chapter let the exception escape, or
  guessed); a reply with an unknown ``stop_reason`` is kept in the messages;
- ``stop_reason == "refusal"`` ends the run with ``refusal``, keeping the text;
- with ``cycle_window`` set, a repeating sequence of calls with identical
  results ends the run with ``cycle`` (the chapter's "longer cycles",
  deferred to its chapter 14);
- a step's detail shows the arguments as JSON, and calls asked for but never
  executed are reported as ``pending``.

With ``cycle_window=0`` and well-behaved models only the chapter's five paths
remain: done, max_steps, max_tokens, tool_failures and repeated_action.
"""

from __future__ import annotations

import json
from collections import deque
from collections.abc import Sequence
from typing import Any

import attrs

from fsm_agent import Message, ModelResponse, ToolCall, ToolRegistry, Usage
from fsm_agent.records import STOP_REASONS


@attrs.frozen
class Outcome:
    """What the plain loop ended with: the reason, and what a ``RunResult`` would hold."""

    reason: str
    messages: tuple[Message, ...]
    steps: tuple[tuple[int, str, str], ...]
    final: str
    pending: tuple[ToolCall, ...]
    stop_step: int
    """The model turn (0-based) the run stopped in."""


def _usable(resp: Any) -> bool:
    # Documented rule: a reply that is not a ModelResponse, or has insides of the wrong types, is a model_error.
    return (
        isinstance(resp, ModelResponse)
        and isinstance(resp.message, Message)
        and isinstance(resp.message.content, str)
        and all(isinstance(tc, ToolCall) for tc in resp.message.tool_calls)
    )


def _countable(usage: Any) -> bool:
    # Documented rule: usage that is not whole numbers from 0 to 2**53 - 1 is a model_error, and the reply is kept.
    return usage is None or (
        isinstance(usage, Usage)
        and all(
            isinstance(count, int) and not isinstance(count, bool) and 0 <= count < 2**53
            for count in (usage.input_tokens, usage.output_tokens)
        )
    )


def _signature(tc: ToolCall) -> tuple[str, str]:
    # The chapter's signature; undecodable or non-JSON arguments get the engine's documented stand-ins.
    if tc.raw_arguments is not None:
        return tc.name, "raw:" + tc.raw_arguments
    try:
        return tc.name, json.dumps(tc.arguments, sort_keys=True)
    except (TypeError, ValueError):
        return tc.name, repr(tc.arguments)


def _repeats(recent: Sequence[Any]) -> bool:
    """The last p entries equal the p before them, for some p >= 2, and are not all the same entry."""
    items = list(recent)
    for period in range(2, len(items) // 2 + 1):
        tail = items[-period:]
        if items[-2 * period : -period] == tail and any(item != tail[0] for item in tail):
            return True
    return False


def reference_run(
    model: Any,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
    cycle_window: int = 0,
) -> Outcome:
    """Run the plain loop to its end; a stop is returned as an ``Outcome`` with its reason, not raised."""
    messages: list[Message] = []
    if system:
        messages.append(Message(role="system", content=system))
    messages.append(Message(role="user", content=user_input))

    steps: list[tuple[int, str, str]] = []
    last_sig: tuple[str, str] | None = None
    failures = 0
    recent: deque[tuple[tuple[str, str], str]] = deque(maxlen=max(cycle_window, 1))

    # Where the chapter raises AgentLoopError(reason, RunResult(...)), the oracle returns the same facts.
    def stop(reason: str, final: str = "", pending: Sequence[ToolCall] = ()) -> Outcome:
        return Outcome(reason, tuple(messages), tuple(steps), final, tuple(pending), i)

    i = 0
    for i in range(max_steps):
        try:
            resp = model.complete(tuple(messages), registry.schemas())
        except Exception:  # noqa: BLE001 - documented rule: any model failure is model_error
            return stop("model_error")
        if not _usable(resp):
            return stop("model_error")
        msg = resp.message
        messages.append(msg)

        if not _countable(resp.usage) or resp.stop_reason not in STOP_REASONS:
            return stop("model_error", pending=msg.tool_calls)
        if resp.stop_reason == "max_tokens":
            return stop("max_tokens", msg.content, msg.tool_calls)
        if resp.stop_reason == "refusal":
            return stop("refusal", msg.content, msg.tool_calls)

        if not msg.tool_calls:
            steps.append((i, "final", msg.content))
            return stop("done", msg.content)

        for k, tc in enumerate(msg.tool_calls):
            sig = _signature(tc)
            if sig == last_sig:
                return stop("repeated_action", pending=msg.tool_calls[k:])
            last_sig = sig

            outcome = registry.execute(tc)
            result = outcome.content
            messages.append(Message(role="tool", content=result, tool_call_id=tc.id))
            arguments = json.dumps(tc.arguments, ensure_ascii=False, default=repr)
            steps.append((i, "tool_call", f"{tc.name}({arguments}) -> {result}"))

            failures = failures + 1 if outcome.error is not None else 0
            if failures >= max_consecutive_failures:
                return stop("tool_failures", pending=msg.tool_calls[k + 1 :])
            if cycle_window:
                recent.append((sig, result))
                if len(recent) >= 4 and _repeats(recent):
                    return stop("cycle", pending=msg.tool_calls[k + 1 :])

    return stop("max_steps")
