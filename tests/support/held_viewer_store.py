"""Stores that hold one of the viewer's answers on an event, so a test sets the order a poll and a write meet in.

The viewer's live stream reads the store every ``poll`` seconds on its own,
and the tab that decides hears back only after the viewer built its answer:
which of the two a person sees first is the machine's.  These wrap a real
store (``served(..., wrap=...)``) and hold one side until the other has
happened, so each order is met every time instead of once in a while.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from support.app_owners import JOIN


class Wrapped:
    """A store that answers as ``store`` does; subclasses hold one method's answer."""

    def __init__(self, store: Any) -> None:
        self.store = store

    def __getattr__(self, name: str) -> Any:
        return getattr(self.store, name)


class AnswerAfterShown(Wrapped):
    """The decision written at once, its answer to the deciding tab held until a follower was shown it.

    ``shown(approvals)`` waits (up to ``JOIN``) for a follower's page
    showing those approvals: the follower is ahead of the tab that decided,
    as when that tab's answer comes late.
    """

    def __init__(self, store: Any, shown: Callable[[dict[str, Any]], object]) -> None:
        super().__init__(store)
        self.shown = shown
        self.decided = 0

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        data: dict[str, Any] = self.store.decide(run_id, call_id, decision)
        self.decided += 1
        self.shown(dict(data.get("approvals") or {}))
        return data


class PollHeld(Wrapped):
    """Once ``hold()`` is called, the next read of ``run_id`` waits at a gate until ``release()``.

    The viewer's stream reads the run one read at a time, so once
    ``at_gate`` is set no read of it is under way: whatever is written
    before ``release()`` lands between two of its polls, all of it.
    """

    def __init__(self, store: Any, run_id: str) -> None:
        super().__init__(store)
        self.run_id = run_id
        self._held = threading.Event()
        self.at_gate = threading.Event()
        self._open = threading.Event()

    def hold(self) -> None:
        """Make the next read of ``run_id`` wait at the gate."""
        self._held.set()

    def release(self) -> None:
        """Let the read at the gate (and every later one) go on."""
        self._open.set()

    def load(self, run_id: str) -> dict[str, Any]:
        if run_id == self.run_id and self._held.is_set() and not self._open.is_set():
            self.at_gate.set()
            assert self._open.wait(JOIN), "the test never released the viewer's poll"
        data: dict[str, Any] = self.store.load(run_id)
        return data
