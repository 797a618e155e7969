"""Cancelling a run from outside: a thread-safe flag the guards read at each check."""

from __future__ import annotations

import threading


class CancelToken:
    """Set once by any thread with ``cancel()``; a run holding it stops at its next check with reason ``cancelled``.

    Checks happen before each model call and before each tool call (the last
    one just before the call, after its hooks), so a call already in flight
    finishes first and its result is kept, and one not yet started is not
    made.  One token may be shared by several runs to cancel them together.
    """

    __slots__ = ("_event", "_why")

    def __init__(self) -> None:
        self._event = threading.Event()
        self._why = ""

    def cancel(self, why: str = "") -> None:
        """Ask every run holding this token to stop; ``why`` appears in the stop's evidence."""
        self._why = why
        self._event.set()

    @property
    def cancelled(self) -> bool:
        """True once ``cancel()`` was called."""
        return self._event.is_set()

    @property
    def why(self) -> str:
        """The text given to ``cancel()``, if any."""
        return self._why
