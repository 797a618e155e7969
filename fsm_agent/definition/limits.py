"""Run limits: validated once, when an agent is built, so a run can never start already exceeded."""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import attrs


def _positive_int(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{attribute.name} must be an integer >= 1, got {value!r}"
        raise ValueError(msg)


def _optional_positive_int(instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is not None:
        _positive_int(instance, attribute, value)


def _timeout(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) or value <= 0:
        msg = f"timeout must be a finite number of seconds > 0, got {value!r}"
        raise ValueError(msg)


def as_dollars(value: Any) -> float | None:
    """A finite amount >= 0 of US dollars as a float, from an int, a float or a ``Decimal``; None if it is not one.

    A ``Decimal`` is told by its ``__float__`` rather than by type, so
    ``import fsm_agent`` need not load the ``decimal`` module.
    """
    if isinstance(value, bool | str | bytes) or not hasattr(type(value), "__float__"):
        return None
    try:
        amount = float(value)
    except (OverflowError, ValueError):  # an int past a float's range; a Decimal signalling NaN
        return None
    return amount if math.isfinite(amount) and amount >= 0 else None


def _dollars(value: Any) -> float | None:
    """``cost_budget`` as float US dollars: a finite amount > 0, or None."""
    if value is None:
        return None
    amount = as_dollars(value)
    if not amount:
        msg = f"cost_budget must be a finite number of US dollars > 0, got {value!r}"
        raise ValueError(msg)
    return amount


def _cap(name: str, value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        msg = f"{name} must be an integer >= 0, got {value!r}"
        raise ValueError(msg)


def _tool_caps(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    if value is None:
        return
    if isinstance(value, Mapping):
        for tool, cap in value.items():
            if not isinstance(tool, str):
                msg = f"max_tool_calls keys must be tool names (or '*'), got {tool!r}"
                raise ValueError(msg)  # noqa: TRY004 - every invalid limit is a ValueError, whatever its kind
            _cap(f"max_tool_calls[{tool!r}]", cap)
        return
    _cap("max_tool_calls", value)


def _cycle_window(_instance: Any, _attribute: attrs.Attribute[Any], value: Any) -> None:
    # A period-2 cycle needs four calls to be seen twice, so smaller windows could never fire.
    if isinstance(value, bool) or not isinstance(value, int) or not (value == 0 or value >= 4):
        msg = f"cycle_window must be 0 (off) or an integer >= 4, got {value!r}"
        raise ValueError(msg)


def _caps(value: int | Mapping[str, int] | None) -> int | dict[str, int] | None:
    return dict(value) if isinstance(value, Mapping) else value


@attrs.frozen
class Limits:
    """The ceilings the guards compare a run's counters against; ``None`` means no limit.

    ``max_steps`` counts model turns (the next model call is never made once
    that many were taken); ``max_consecutive_failures`` counts failed tool
    calls in a row (any success resets it); ``timeout`` is seconds for the
    whole run; ``token_budget`` caps input + output tokens reported by the
    model (responses without usage count as zero); ``max_tool_calls`` caps
    executed tool calls, as an int for the whole run or a dict per tool name
    with ``"*"`` for the total; ``cycle_window`` is how many recent tool calls
    the cycle guard looks back over (0 turns it off); ``cost_budget`` caps
    the US dollars the model calls cost (``Usage.cost``, a sub-agent's
    included), for an agent that can price its model (``Agent(prices=...)``).
    """

    max_steps: int = attrs.field(default=8, validator=_positive_int)
    max_consecutive_failures: int = attrs.field(default=3, validator=_positive_int)
    timeout: float | None = attrs.field(default=None, validator=_timeout)
    token_budget: int | None = attrs.field(default=None, validator=_optional_positive_int)
    max_tool_calls: int | dict[str, int] | None = attrs.field(default=None, converter=_caps, validator=_tool_caps)
    cycle_window: int = attrs.field(default=6, validator=_cycle_window)
    cost_budget: float | None = attrs.field(default=None, converter=_dollars)

    @property
    def total_tool_calls(self) -> int | None:
        """The cap on all tool calls of a run, if any (an int, or the ``"*"`` entry of a dict)."""
        caps = self.max_tool_calls
        return caps.get("*") if isinstance(caps, dict) else caps
