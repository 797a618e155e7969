"""The machine's states; ``str(state)`` is the bare name, so states read well in traces and diagrams."""

from __future__ import annotations

from enum import StrEnum


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
