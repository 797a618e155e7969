"""The machine's states and the names the type checker holds callers to: triggers, reasons, policies.

``str(state)`` is the bare name, so states read well in traces and diagrams.
The ``Literal`` types exist for ``mypy --strict`` users (``on_stop={"max_step":
...}`` is caught before it runs); the catalogue in ``definition.stops`` is the
source of truth and a test checks that the two agree.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Literal


class State(StrEnum):
    """Where a run is: waiting for the model, checking its reply, dispatching or running a tool, or finished."""

    AwaitModel = "AwaitModel"
    CheckTruncation = "CheckTruncation"
    Dispatch = "Dispatch"
    ExecuteTool = "ExecuteTool"
    Done = "Done"
    Failed = "Failed"


STATES: tuple[State, ...] = tuple(State)
TERMINAL: frozenset[State] = frozenset({State.Done, State.Failed})
# The members again as module names, for the hot loop: on Python 3.11 every ``State.X`` goes through the
# enum metaclass's ``__getattr__`` and costs about ten global reads.
AwaitModel, CheckTruncation, Dispatch, ExecuteTool, Done, Failed = STATES

Trigger = Literal[
    "start", "model_failed", "interrupted", "expired", "replied", "check", "dispatch", "tool_done", "finalize", "resume"
]
Reason = Literal[
    "child_stopped",
    "context_overflow",
    "model_error",
    "cancelled",
    "timeout",
    "hook_error",
    "max_tokens",
    "refusal",
    "output_invalid",
    "finalize_failed",
    "repeated_action",
    "max_tool_calls",
    "tool_failures",
    "cycle",
    "token_budget",
    "cost_budget",
    "max_steps",
    "stop_condition_error",
]
"""Every built-in stop reason; user-defined ``StopCondition`` reasons come on top."""
Policy = Literal["raise", "return", "finalize", "compact"]
"""What a run does when a stop fires: raise ``AgentLoopError``, return the result, make one last model call, or
(``context_overflow`` only) compact the history and make the call again."""
POLICIES: tuple[Policy, ...] = ("raise", "return", "finalize", "compact")
