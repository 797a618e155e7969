"""A store for the tests that an async run never calls a store's sync method: those raise, the async twins work."""

from __future__ import annotations

from typing import Any

from fsm_agent import SqliteStore

BLOCKING = "sync store call on the event loop"
"""What a sync method of ``AsyncOnly`` raises with (the method's name follows)."""
SYNC = ("save", "load", "create", "claim", "append", "renew", "keep", "decide", "list_runs", "delete")
"""The store methods with async twins (``aload``, ...)."""


class AsyncOnly:
    """A journaled store over ``inner``: its sync methods raise ``AssertionError``, its async twins are ``inner``'s.

    Every twin awaited is noted in ``awaited``, every sync call refused in
    ``refused`` (a call from a worker thread is caught too, whatever the
    caller does with the error).  ``noted(name)`` is called as a twin is
    awaited, for a test that waits on one.
    """

    def __init__(self, inner: SqliteStore) -> None:
        self.inner = inner
        self.lease, self.every = inner.lease, inner.every
        self.awaited: list[str] = []
        self.refused: list[str] = []

    def wants(self, state: Any, paused: bool) -> bool:
        return self.inner.wants(state, paused)  # no I/O: what a transition is written for

    def noted(self, name: str) -> None:
        """Called as the twin ``name`` is awaited (nothing here)."""

    def __getattr__(self, name: str) -> Any:
        if name in SYNC:

            def blocking(*args: Any, **kwargs: Any) -> Any:
                self.refused.append(name)
                raise AssertionError(f"{BLOCKING}: {name}")

            return blocking
        if name.startswith("a") and name[1:] in SYNC:
            twin = getattr(self.inner, name)

            async def delegated(*args: Any, **kwargs: Any) -> Any:
                self.awaited.append(name)
                self.noted(name)
                return await twin(*args, **kwargs)

            return delegated
        raise AttributeError(name)
