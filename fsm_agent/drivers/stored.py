"""What the drivers ask of a store beside the journal's writes: opening it, and reading a run, called or awaited.

The store's modules (``fsm_agent.persist``: ``sqlite3``, the SQL plans)
are imported here on first use, so ``import fsm_agent`` and a run without a
store (most) load none of them.  The async paths read through ``awaited``,
the store's async twin of each method, so the event loop never waits on the
store; the journal does the same for its writes.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from fsm_agent.persist import StoreTarget
    from fsm_agent.persist.journal import Journal
    from fsm_agent.persist.store import Store


def store_for(target: StoreTarget | None) -> Store | None:
    """``persist.store_for``: the store a ``store=`` argument names (None: the run has none)."""
    if target is None:
        return None
    from fsm_agent.persist import store_for as opened

    return opened(target)


async def astore_for(target: StoreTarget | None) -> Store | None:
    """``store_for``, awaited: a path or URL opened for the first time (a file, a pool, a migration) in a thread."""
    if target is None or not isinstance(target, str | os.PathLike):
        return store_for(target)  # a store object is checked, not opened: nothing to wait for
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    return await asyncio.to_thread(store_for, target)


def journal_for(
    store: Store,
    run_id: str,
    start_id: str,
    session: str | None,
    parent: Mapping[str, str] | None,
    forked_from: tuple[str | None, int] | None = None,
    request: str | None = None,
) -> Journal:
    """The journal through which a run owns and writes its stored run."""
    from fsm_agent.persist.journal import Journal

    return Journal(
        store, run_id, start_id=start_id, session=session, parent=parent, forked_from=forked_from, request=request
    )


async def awaited(store: Any, name: str, *args: Any, **kwargs: Any) -> Any:
    """Store method ``name`` called from the async driver: its async twin (``aload`` for ``load``), else in a thread.

    The twins are ``persist.store.AsyncStore``'s, each optional on its own;
    either way the event loop never waits on the store.
    """
    twin = getattr(store, f"a{name}", None)
    if callable(twin):
        return await twin(*args, **kwargs)
    import asyncio  # as in drivers.aio: import fsm_agent loads no asyncio

    return await asyncio.to_thread(getattr(store, name), *args, **kwargs)


def stored(store: Any, run_id: str) -> dict[str, Any] | None:
    """The run ``run_id`` as ``store`` holds it; None if it holds none."""
    try:
        return dict(store.load(run_id))
    except KeyError:
        return None


async def astored(store: Any, run_id: str) -> dict[str, Any] | None:
    """``stored``, awaited."""
    try:
        return dict(await awaited(store, "load", run_id))
    except KeyError:
        return None
