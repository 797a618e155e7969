"""An ``async def`` check in a ``StopCondition`` is a TypeError when the condition is built.

Why: the stepper calls a check and never awaits it, and the coroutine it
gets back is truthy: the stop would trip on every run, whatever the check
says.
"""

from __future__ import annotations

import functools

import pytest

from fsm_agent import RunView, StopCondition


async def never(view: RunView) -> bool:
    """Never trips (if it were awaited)."""
    return False


async def over(view: RunView, limit: int) -> bool:
    """Trips past ``limit`` steps (if it were awaited)."""
    return False


def test_an_async_def_check_is_refused_naming_the_fix() -> None:
    """The message says a check is called, not awaited, and to make it a plain def."""
    message = r"'never' is an async def; a check is called, not awaited: make it a plain def"
    with pytest.raises(TypeError, match=message):
        StopCondition("never", "Dispatch", never, "never trips")


def test_a_partial_of_an_async_def_check_is_refused_too() -> None:
    """A partial has no ``__name__``: the message names the condition's fallback name instead."""
    with pytest.raises(TypeError, match=r"'check_too_many' is an async def"):
        StopCondition("too_many", "AwaitModel", functools.partial(over, limit=3))


def test_a_plain_def_check_is_still_taken() -> None:
    """The refusal is for coroutine functions only."""

    def quiet(view: RunView) -> bool:
        return False

    assert StopCondition("quiet", "Dispatch", quiet).check is quiet
