"""Guards: small named predicates over a run; their names are the edge labels of the machine.

Each stop has an evidence function under its reason in ``EVIDENCE``, called
once when the run enters ``Failed`` to explain the stop with the counters that
made the guard true.  Guards of limits that are not set return at once, so an
unused stop costs one attribute check.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Callable, Sequence
from typing import Any

from fsm_agent.run import Run, Signature, signature

Guard = Callable[[Run], bool]

FINALIZABLE = ("max_steps", "max_tool_calls", "timeout", "token_budget", "cycle", "repeated_action")
"""Stops that may be answered by one last model call (``on_stop={reason: "finalize"}``)."""


def is_truncated(run: Run) -> bool:
    """The model's output hit its length limit (``stop_reason == "max_tokens"``), so the reply is incomplete."""
    return run.last_response is not None and run.last_response.stop_reason == "max_tokens"


def is_refusal(run: Run) -> bool:
    """The provider refused or filtered the reply (``stop_reason == "refusal"``), so it is not an answer."""
    return run.last_response is not None and run.last_response.stop_reason == "refusal"


def has_no_tool_calls(run: Run) -> bool:
    """The assistant message asks for no tool: its text is the final answer."""
    return run.last_response is not None and not run.last_response.message.tool_calls


def asks_tools_while_finalizing(run: Run) -> bool:
    """The last call was meant to answer without tools and asked for tools anyway."""
    return run.finalizing is not None


def is_cancelled(run: Run) -> bool:
    """Another thread called ``cancel()`` on the run's ``CancelToken``."""
    return run.cancel_requested()


def hook_raised(run: Run) -> bool:
    """A hook of a ``strict_hooks`` agent raised since the last transition."""
    return run.hook_error is not None


def deadline_passed(run: Run) -> bool:
    """The run has used up its ``timeout`` seconds."""
    return run.limits.timeout is not None and run.elapsed >= run.limits.timeout


def repeats_last_call(run: Run) -> bool:
    """The next tool call has the same name and arguments as the call executed just before it."""
    return run.last_signature is not None and signature(run.pending[0]) == run.last_signature


def _cap_reached(run: Run, name: str) -> tuple[str, int, int] | None:
    """``(scope, used, cap)`` of the first cap that one more call of ``name`` would exceed."""
    caps = run.limits.max_tool_calls
    if caps is None:
        return None
    if isinstance(caps, int):
        return ("*", run.tool_calls, caps) if run.tool_calls >= caps else None
    used = run.calls_by_tool.get(name, 0)
    if name in caps and used >= caps[name]:
        return name, used, caps[name]
    if "*" in caps and run.tool_calls >= caps["*"]:
        return "*", run.tool_calls, caps["*"]
    return None


def tool_calls_exhausted(run: Run) -> bool:
    """Making the next tool call would exceed ``max_tool_calls`` (for the run or for that tool)."""
    return (
        run.limits.max_tool_calls is not None
        and bool(run.pending)
        and _cap_reached(run, run.pending[0].name) is not None
    )


def failures_exhausted(run: Run) -> bool:
    """``max_consecutive_failures`` tool calls in a row failed."""
    return run.failures >= run.limits.max_consecutive_failures


def find_cycle(recent: Sequence[tuple[Signature, str]]) -> int:
    """The shortest period p >= 2 whose last p calls repeat the p before them, results included; 0 if none.

    Comparing results as well as calls is what "no progress" means here: a
    loop whose calls return the same results twice in a row learned nothing
    new, while calls whose results change (polling a job) are progress.
    """
    n = len(recent)
    for period in range(2, n // 2 + 1):
        block = [recent[n - period + i] for i in range(period)]
        if any(recent[n - 2 * period + i] != block[i] for i in range(period)):
            continue
        if any(item != block[0] for item in block):  # period 1 (A, A) is repeated_action's business
            return period
    return 0


def is_cycling(run: Run) -> bool:
    """The latest tool calls repeat a sequence of period 2 or more with identical results (see ``find_cycle``)."""
    return run.limits.cycle_window >= 4 and len(run.recent) >= 4 and find_cycle(run.recent) > 0


def has_pending_calls(run: Run) -> bool:
    """More tool calls of the current model turn wait to be dispatched."""
    return bool(run.pending)


def budget_spent(run: Run) -> bool:
    """The tokens reported so far have reached ``token_budget``, so no further model call is made."""
    return run.limits.token_budget is not None and run.tokens >= run.limits.token_budget


def steps_exhausted(run: Run) -> bool:
    """``max_steps`` model turns were taken, so the next model call must not be made."""
    return run.turns >= run.limits.max_steps


LIFTABLE: dict[str, Guard] = {
    "max_steps": steps_exhausted,
    "token_budget": budget_spent,
    "timeout": deadline_passed,
    "max_tool_calls": tool_calls_exhausted,
    "cancelled": is_cancelled,
}
"""Stops that new limits (or a fresh cancel token) can lift, by the guard that must no longer hold."""


def _lifted(run: Run) -> bool:
    check = LIFTABLE.get(run.reason or "")
    return check is not None and not check(run)


def _model_call_allowed(run: Run) -> bool:
    # Several stops can hold at once and only the first is recorded, so a resume checks them all again.
    return not (is_cancelled(run) or deadline_passed(run) or budget_spent(run) or steps_exhausted(run))


def resumes_before_tool(run: Run) -> bool:
    """The run stopped before a tool call that is still pending, and the resumed run's limits lift that stop."""
    return bool(run.pending) and _lifted(run)


def resumes_before_model(run: Run) -> bool:
    """The run stopped before a model call, and the resumed run's limits lift that stop and every other one."""
    return not run.pending and _lifted(run) and _model_call_allowed(run)


def retries_model_call(run: Run) -> bool:
    """The run stopped on a model error, was resumed with ``retry=True``, and no limit forbids another call."""
    return run.reason == "model_error" and run.retry_model and _model_call_allowed(run)


@functools.cache
def finalize_on(reason: str, trigger: str) -> Guard:
    """The guard of a ``finalize`` edge: the stop ``reason`` would fire now and its policy says finalize.

    It looks ahead at the row ``trigger`` would take, so the finalize edge
    fires exactly when that stop is the highest-priority row that holds, and
    only once per run.
    """

    def guard(run: Run) -> bool:
        if run.finalizing is not None or run.policies.get(reason) != "finalize":
            return False
        row = run.first_row(trigger)
        return row is not None and row.reason == reason

    guard.__name__ = guard.__qualname__ = f"finalize_on_{reason}"
    return guard


def _step(run: Run) -> int:
    return max(run.turns - 1, 0)


def _call(name: str, arguments: str) -> dict[str, Any]:
    try:
        decoded = json.loads(arguments)
    except ValueError:
        decoded = arguments
    return {"name": name, "arguments": decoded}


def _model_error(run: Run) -> dict[str, Any]:
    """`error`, `type`: the exception the model call raised (or why its reply was unusable)."""
    exc = run.model_exception
    return {"error": str(exc), "type": type(exc).__name__}


def _max_tokens(run: Run) -> dict[str, Any]:
    """`partial_chars`, `cut_tool_calls`: how much of the cut reply arrived; the text is `result.final`."""
    message = run.last_response.message if run.last_response is not None else None
    return {
        "stop_reason": "max_tokens",
        "partial_chars": len(message.content) if message else 0,
        "cut_tool_calls": len(message.tool_calls) if message else 0,
    }


def _refusal(run: Run) -> dict[str, Any]:
    """`content`: what the provider said instead of answering (also `result.final`)."""
    message = run.last_response.message if run.last_response is not None else None
    return {"stop_reason": "refusal", "content": message.content if message else ""}


def _finalize_failed(run: Run) -> dict[str, Any]:
    """`tool_calls`: the tools the finalize reply asked for anyway."""
    return {"tool_calls": [call.name for call in run.pending]}


def _cancelled(run: Run) -> dict[str, Any]:
    """`why` (the text given to `cancel()`), `state` the run was leaving."""
    why = (
        run.cancel.why if run.cancel is not None and run.cancel.cancelled else "the task running the run was cancelled"
    )
    return {"why": why, "state": str(run.trace[-1].source)}


def _hook_error(run: Run) -> dict[str, Any]:
    """`error`, `type`: the hook's exception (also the `AgentLoopError`'s `__cause__`)."""
    return {"error": str(run.hook_error), "type": type(run.hook_error).__name__}


def _timeout(run: Run) -> dict[str, Any]:
    """`elapsed` against `timeout`, in seconds."""
    return {"elapsed": round(run.elapsed, 6), "timeout": run.limits.timeout}


def _repeated_action(run: Run) -> dict[str, Any]:
    """`signature` (`name`, canonical `arguments`) and `tool_call_id` of the call not made."""
    call = run.pending[0]
    name, arguments = signature(call)
    return {"signature": {"name": name, "arguments": arguments}, "tool_call_id": call.id}


def _max_tool_calls(run: Run) -> dict[str, Any]:
    """`tool`, `scope` (the tool's own cap or `*`), `used` against `limit`."""
    name = run.pending[0].name
    scope, used, cap = _cap_reached(run, name) or ("*", run.tool_calls, 0)
    return {"tool": name, "scope": scope, "used": used, "limit": cap}


def _tool_failures(run: Run) -> dict[str, Any]:
    """`failures` against `limit`, and `last_error`."""
    return {"failures": run.failures, "limit": run.limits.max_consecutive_failures, "last_error": run.last_error}


def _cycle(run: Run) -> dict[str, Any]:
    """`period`, `calls` (one period of the cycle, name and arguments) and `window`."""
    period = find_cycle(run.recent)
    calls = [_call(*sig) for sig, _ in list(run.recent)[-period:]]
    return {"period": period, "calls": calls, "window": run.limits.cycle_window}


def _token_budget(run: Run) -> dict[str, Any]:
    """`tokens` against `budget`, split into `input_tokens` and `output_tokens`."""
    return {
        "tokens": run.tokens,
        "budget": run.limits.token_budget,
        "input_tokens": run.input_tokens,
        "output_tokens": run.output_tokens,
    }


def _max_steps(run: Run) -> dict[str, Any]:
    """`turns` against `limit`."""
    return {"turns": run.turns, "limit": run.limits.max_steps}


EVIDENCE: dict[str, Callable[[Run], dict[str, Any]]] = {
    "model_error": _model_error,
    "max_tokens": _max_tokens,
    "refusal": _refusal,
    "finalize_failed": _finalize_failed,
    "cancelled": _cancelled,
    "hook_error": _hook_error,
    "timeout": _timeout,
    "repeated_action": _repeated_action,
    "max_tool_calls": _max_tool_calls,
    "tool_failures": _tool_failures,
    "cycle": _cycle,
    "token_budget": _token_budget,
    "max_steps": _max_steps,
}


def evidence_for(run: Run, reason: str) -> dict[str, Any]:
    """The JSON-serialisable evidence of a stop: the reason's own facts plus the step index."""
    build = EVIDENCE.get(reason)
    facts = build(run) if build is not None else {}
    return {"step": _step(run), **facts, "counters": run.counters()}
