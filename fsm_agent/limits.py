"""Run limits: validated once, when an agent is built, so a run can never start already exceeded."""

from __future__ import annotations

from typing import Any

import attrs


def _positive_int(_instance: Any, attribute: attrs.Attribute[Any], value: Any) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        msg = f"{attribute.name} must be an integer >= 1, got {value!r}"
        raise ValueError(msg)


@attrs.frozen
class Limits:
    """The ceilings the guards compare a run's counters against.

    ``max_steps`` counts model turns (the next model call is never made once
    that many were taken); ``max_consecutive_failures`` counts failed tool
    calls in a row, and any success resets the count.
    """

    max_steps: int = attrs.field(default=8, validator=_positive_int)
    max_consecutive_failures: int = attrs.field(default=3, validator=_positive_int)
