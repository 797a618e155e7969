"""User-defined stop conditions and the per-reason recovery policies (``on_stop``).

A ``StopCondition`` becomes one more guarded edge into ``Failed`` in its
agent's own table, so it is drawn, traced and tested like the built-in stops.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs

from fsm_agent.guards import FINALIZABLE, Guard
from fsm_agent.run import Run, RunView
from fsm_agent.states import TERMINAL, State

POLICIES = ("raise", "return", "finalize")
RESERVED_REASONS = frozenset({"done", "paused"})
"""Result reasons that are not stops, so no stop may use them."""


def _state(value: State | str) -> State:
    try:
        state = State(value)
    except ValueError:
        state = None
    if state is None or state in TERMINAL:
        allowed = ", ".join(s for s in State if s not in TERMINAL)
        msg = f"StopCondition at={value!r} is not a non-terminal state; use one of {allowed}"
        raise ValueError(msg)
    return state


def _reason(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if not isinstance(value, str) or not value.isidentifier():
        msg = f"StopCondition reason must be a non-empty identifier-like string, got {value!r}"
        raise ValueError(msg)


@attrs.frozen
class StopCondition:
    """Stop the run with ``reason`` when ``check(view)`` is true as the run leaves state ``at``.

    ``check`` receives a read-only ``RunView`` (messages, steps, counters, the
    last response) and returns a bool.  The edge is tried after the built-in
    stops of ``at`` and before its fallback: at ``AwaitModel`` once the model
    has replied, at ``Dispatch`` before every tool call, at ``ExecuteTool``
    after the last tool call of a turn (before the next model call).
    """

    reason: str = attrs.field(validator=_reason)
    at: State = attrs.field(converter=_state)
    check: Callable[[RunView], bool]
    description: str = ""
    guard: Guard = attrs.field(init=False, eq=False, repr=False)

    def __attrs_post_init__(self) -> None:
        check = self.check
        if not callable(check):
            msg = f"StopCondition check must be callable, got {type(check).__name__}"
            raise TypeError(msg)

        def guard(run: Run) -> bool:
            return bool(check(RunView(run)))

        name = getattr(check, "__name__", "")
        guard.__name__ = guard.__qualname__ = name if name.isidentifier() else f"check_{self.reason}"
        # The guard's docstring is what the rendered documentation says about the edge.
        guard.__doc__ = self.description or check.__doc__
        object.__setattr__(self, "guard", guard)

    def evidence(self, run: Run) -> dict[str, Any]:
        """What the stop's evidence says: which condition, and its description."""
        return {"condition": self.guard.__name__, "description": self.description}


def check_stop_conditions(stops: Collection[StopCondition], builtin: Collection[str]) -> None:
    """Reject reasons that collide with built-in stops, reserved results or each other."""
    seen: set[str] = set()
    for stop in stops:
        if not isinstance(stop, StopCondition):
            msg = f"stop_conditions must hold StopCondition objects, got {type(stop).__name__}"
            raise TypeError(msg)
        if stop.reason in builtin or stop.reason in RESERVED_REASONS:
            msg = f"StopCondition reason {stop.reason!r} collides with a built-in reason"
            raise ValueError(msg)
        if stop.reason in seen:
            msg = f"StopCondition reason {stop.reason!r} is used by two stop conditions"
            raise ValueError(msg)
        seen.add(stop.reason)


def check_policies(on_stop: Mapping[str, str] | None, reasons: Collection[str]) -> dict[str, str]:
    """Validate ``on_stop``: known reasons only, known policies only, finalize only where it makes sense."""
    policies = dict(on_stop or {})
    for reason, policy in policies.items():
        if reason not in reasons:
            msg = f"on_stop names unknown reason {reason!r}; known reasons: {', '.join(sorted(reasons))}"
            raise ValueError(msg)
        if policy not in POLICIES:
            msg = f"on_stop[{reason!r}] must be one of {', '.join(POLICIES)}, got {policy!r}"
            raise ValueError(msg)
        if policy == "finalize" and reason not in FINALIZABLE:
            msg = f"on_stop[{reason!r}]='finalize' is not allowed; finalize applies to {', '.join(FINALIZABLE)}"
            raise ValueError(msg)
    return policies
