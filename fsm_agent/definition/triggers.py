"""The triggers a run is fired with: the events of the machine, named once, and what fires each.

A row of the table is ``(source, trigger, dest, guard, reason)``: the
trigger is the event that moves a run out of its state (the model replied,
a tool call finished, the deadline passed while a call was in flight).
They are declared here, apart from the table, because the engine, the
drivers, the checks of a table and the documentation all name them.
"""

from __future__ import annotations

START = "start"
MODEL_FAILED = "model_failed"
INTERRUPTED = "interrupted"
EXPIRED = "expired"
REPLIED = "replied"
CHECK = "check"
DISPATCH = "dispatch"
TOOL_DONE = "tool_done"
FINALIZE = "finalize"
RESUME = "resume"
TRIGGERS: dict[str, str] = {
    START: "the run is about to make its first model call",
    MODEL_FAILED: "the model call raised, or its reply was unusable",
    INTERRUPTED: "the task driving the run was cancelled while a call (or a typed answer's check) was in flight",
    EXPIRED: "the run's timeout passed while a call (or a typed answer's check) was in flight",
    REPLIED: "the model replied",
    CHECK: "the reply is checked before any tool call is looked at",
    DISPATCH: "the next tool call of the turn is about to run, or the turn has none",
    TOOL_DONE: "a tool call finished",
    FINALIZE: "a stop whose policy is finalize: one last model call, without tools",
    RESUME: "agent.resume() continues a stopped run whose stop the new limits lift",
}
"""What fires each trigger, for the documentation the table renders."""
GUARDED_ONLY = frozenset({START, FINALIZE, RESUME})
"""Triggers the driver fires only after checking one of their rows applies, so they need no fallback."""
