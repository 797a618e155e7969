"""Waiting for a condition another thread makes true: polled, bounded, and a plain answer for the test to assert."""

from __future__ import annotations

import time
from collections.abc import Callable


def held_within(condition: Callable[[], bool], seconds: float) -> bool:
    """Whether ``condition()`` held within ``seconds``, polled every 10 ms (the tests' work left is milliseconds)."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.01)
    return True
