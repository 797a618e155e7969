"""Snapshots: a run's whole position as a plain JSON-ready dict, and the checks that make resuming it safe.

A run is a state name plus data, so it can be saved between any two
transitions and continued elsewhere exactly.  No pickle: a snapshot is JSON,
readable and diffable, and a corrupted or contradictory one is rejected with
a message naming what is wrong instead of becoming a silently wrong run.
"""

from __future__ import annotations

import json
from collections import deque
from typing import Any

from fsm_agent.limits import Limits
from fsm_agent.records import Message, ModelResponse, Step, ToolCall, Transition, Usage, plain
from fsm_agent.run import Run
from fsm_agent.states import State

SNAPSHOT_FORMAT = "fsm_agent.Snapshot"
SNAPSHOT_VERSION = 1


class SnapshotError(ValueError):
    """A snapshot that cannot be resumed: wrong version, broken JSON, unknown state or contradictory counters."""


def _call(data: dict[str, Any]) -> ToolCall:
    return ToolCall(**data)


def _message(data: dict[str, Any]) -> Message:
    return Message(data["role"], data["content"], tuple(_call(c) for c in data["tool_calls"]), data["tool_call_id"])


def _response(data: dict[str, Any] | None) -> ModelResponse | None:
    if data is None:
        return None
    usage = None if data["usage"] is None else Usage(**data["usage"])
    return ModelResponse(_message(data["message"]), data["stop_reason"], usage)


def dump(run: Run) -> dict[str, Any]:
    """The run's position, counters, conversation and limits as a JSON-ready dict."""
    return {
        "format": SNAPSHOT_FORMAT,
        "version": SNAPSHOT_VERSION,
        "state": str(run.state),
        "messages": [plain(m) for m in run.messages],
        "steps": [plain(s) for s in run.steps],
        "trace": [plain(t) for t in run.trace],
        "pending": [plain(c) for c in run.pending],
        "last_response": None if run.last_response is None else plain(run.last_response),
        "counters": {
            "turns": run.turns,
            "failures": run.failures,
            "tool_calls": run.tool_calls,
            "calls_by_tool": dict(run.calls_by_tool),
            "last_signature": None if run.last_signature is None else list(run.last_signature),
            "last_error": run.last_error,
            "recent": [[name, arguments, result] for (name, arguments), result in run.recent],
            "input_tokens": run.input_tokens,
            "output_tokens": run.output_tokens,
            "elapsed": run.elapsed,
        },
        "limits": plain(run.limits),
        "finalizing": run.finalizing,
        "reason": run.reason,
        "final": run.final,
        "evidence": run.evidence,
        "error": None
        if run.model_exception is None
        else f"{type(run.model_exception).__name__}: {run.model_exception}",
    }


def parse(snapshot: dict[str, Any] | str) -> dict[str, Any]:
    """Accept a snapshot dict or its JSON text; check format and version first."""
    if isinstance(snapshot, str):
        try:
            snapshot = json.loads(snapshot)
        except ValueError as exc:
            msg = f"snapshot is not valid JSON: {exc}"
            raise SnapshotError(msg) from exc
    if not isinstance(snapshot, dict):
        msg = f"snapshot must be a JSON object, got {type(snapshot).__name__}"
        raise SnapshotError(msg)
    found = (snapshot.get("format"), snapshot.get("version"))
    if found != (SNAPSHOT_FORMAT, SNAPSHOT_VERSION):
        msg = f"unsupported snapshot {found}; this version reads ({SNAPSHOT_FORMAT!r}, {SNAPSHOT_VERSION})"
        raise SnapshotError(msg)
    return snapshot


def limits_of(data: dict[str, Any], **overrides: Any) -> Limits:
    """The snapshot's limits with any given overrides (``None`` overrides are ignored)."""
    try:
        values = {**data["limits"], **{k: v for k, v in overrides.items() if v is not None}}
        return Limits(**values)
    except (KeyError, TypeError) as exc:
        msg = f"snapshot limits are malformed: {exc}"
        raise SnapshotError(msg) from exc


def load(run: Run, data: dict[str, Any], states: tuple[State, ...]) -> None:
    """Put a fresh run where the snapshot says, after checking that the snapshot agrees with itself."""
    state = data.get("state")
    if state not in states:
        msg = f"snapshot state {state!r} is not a state of this agent's table ({', '.join(states)})"
        raise SnapshotError(msg)
    try:
        counters = data["counters"]
        run.state = State(state)
        run.messages[:] = [_message(m) for m in data["messages"]]
        run.steps[:] = [Step(**s) for s in data["steps"]]
        run.trace[:] = [Transition(**t) for t in data["trace"]]
        run.pending = deque(_call(c) for c in data["pending"])
        run.last_response = _response(data["last_response"])
        run.turns = counters["turns"]
        run.failures = counters["failures"]
        run.tool_calls = counters["tool_calls"]
        run.calls_by_tool = dict(counters["calls_by_tool"])
        signature = counters["last_signature"]
        run.last_signature = None if signature is None else (signature[0], signature[1])
        run.last_error = counters["last_error"]
        run.recent.clear()
        run.recent.extend(((name, arguments), result) for name, arguments, result in counters["recent"])
        run.input_tokens = counters["input_tokens"]
        run.output_tokens = counters["output_tokens"]
        run.started = run.clock() - float(counters["elapsed"])
        run.finalizing = data["finalizing"]
        run.reason = data["reason"]
        run.final = data["final"]
        run.evidence = dict(data["evidence"])
    except (KeyError, TypeError, ValueError, IndexError) as exc:
        msg = f"snapshot is malformed: {type(exc).__name__}: {exc}"
        raise SnapshotError(msg) from exc
    _check_consistent(run)


def _check_consistent(run: Run) -> None:
    """Counters must agree with the messages, steps and trace they summarise."""
    problems = []
    executed = sum(1 for s in run.steps if s.kind == "tool_call")
    if executed != run.tool_calls:
        problems.append(f"tool_calls is {run.tool_calls} but {executed} tool steps are recorded")
    if sum(run.calls_by_tool.values()) != run.tool_calls:
        problems.append(f"calls_by_tool adds up to {sum(run.calls_by_tool.values())}, not tool_calls={run.tool_calls}")
    replies = sum(1 for m in run.messages if m.role == "assistant")
    if replies > run.turns:
        problems.append(f"turns is {run.turns} but {replies} assistant messages are recorded")
    tool_messages = sum(1 for m in run.messages if m.role == "tool")
    if tool_messages < executed:
        problems.append(f"{executed} tool calls ran but only {tool_messages} tool messages are recorded")
    if run.trace and run.trace[-1].dest != run.state:
        problems.append(f"the trace ends in {run.trace[-1].dest} but the state is {run.state}")
    for before, after in zip(run.trace, run.trace[1:], strict=False):
        if before.dest != after.source:
            problems.append(f"the trace breaks between {before.dest} and {after.source}")
            break
    if run.state is State.ExecuteTool and not run.pending:
        problems.append("the state is ExecuteTool but no tool call is pending")
    if problems:
        msg = "snapshot contradicts itself: " + "; ".join(problems)
        raise SnapshotError(msg)
