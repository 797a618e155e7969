"""The process-wide watchers of taken rows: empty unless stop-path coverage (the pytest plugin) is on.

Wherever a run takes a row (``core.firing.take`` and ``Walker.take``) it
appends the row's entry to its trace and then, only if this list is not
empty, hands the entry to every watcher.  With coverage off an engine turn
pays one truthiness check of a module-level list; nothing else in the engine
knows coverage exists.  Only this process's runs are seen: a run in a
subprocess or a Ray worker tells the watchers of its own process.
"""

from __future__ import annotations

from collections.abc import Callable

from fsm_agent.records import Transition

WATCHERS: list[Callable[[Transition], None]] = []
"""Called with the entry of every row any run in this process takes; empty unless a recorder is on."""


def notify(entry: Transition) -> None:
    """Tell every watcher that a run took the row ``entry`` names."""
    for watch in tuple(WATCHERS):  # a copy: a recorder may stop on another thread meanwhile
        watch(entry)
