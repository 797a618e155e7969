"""An event loop's PostgreSQL connections: an idle one is checked before it is reused, and a doubtful one closed.

``LoopConnections`` is handed how to connect and how to check, so these
tests hand it connections of their own and decide what each check says:
a passed one is reused, a failed one closed and the next one tried, and one
whose check a cancel cut is closed too (its state is unknown), never
handed to the next plan.  The real server's side is in
``test_a_postgres_server_that_dropped_idle_connections_fails_no_write.py``.
"""

from __future__ import annotations

import asyncio

import attrs
import pytest

from fsm_agent.persist.loop_connections import LoopConnections

IDLE = "idle"


@attrs.define
class Info:
    transaction_status: str = IDLE


@attrs.define(eq=False)
class Conn:
    """A connection whose check passes, fails, or waits until cancelled, as the test says."""

    name: str
    check: str = "passes"
    closed: bool = False
    info: Info = attrs.field(factory=Info)

    async def close(self) -> None:
        self.closed = True


class ServerDropped(Exception):
    """What psycopg raises for a connection the server dropped."""


async def _check(conn: Conn) -> None:
    if conn.check == "fails":
        raise ServerDropped(conn.name)
    if conn.check == "hangs":
        await asyncio.Event().wait()


def _connections(*idle: Conn) -> tuple[LoopConnections, list[Conn]]:
    """Connections holding ``idle`` (the last is reused first), and the list of the new ones it opened."""
    opened: list[Conn] = []

    async def connect() -> Conn:
        opened.append(Conn(f"new{len(opened)}"))
        return opened[-1]

    connections = LoopConnections(connect, 4, IDLE, _check)
    connections._idle.extend(idle)
    return connections, opened


async def _used(connections: LoopConnections) -> str:
    async with connections.connection() as conn:
        return str(conn.name)


def test_an_idle_connection_whose_check_passes_is_reused() -> None:
    connections, opened = _connections(Conn("a"), Conn("b"))
    assert asyncio.run(_used(connections)) == "b"
    assert (opened, [c.name for c in connections._idle]) == ([], ["a", "b"])


def test_a_dropped_idle_connection_is_closed_and_the_next_one_tried() -> None:
    a, b, c = Conn("a", "fails"), Conn("b"), Conn("c", "fails")
    connections, opened = _connections(a, b, c)
    assert asyncio.run(_used(connections)) == "b"
    assert (c.closed, b.closed, a.closed, opened) == (True, False, False, [])


def test_when_every_idle_connection_was_dropped_a_new_one_is_opened() -> None:
    a, b = Conn("a", "fails"), Conn("b", "fails")
    connections, opened = _connections(a, b)
    assert asyncio.run(_used(connections)) == "new0"
    assert (a.closed, b.closed, connections._idle) == (True, True, opened)


def test_a_connection_whose_check_a_cancel_cut_is_closed_not_reused() -> None:
    hanging = Conn("h", "hangs")
    connections, opened = _connections(Conn("a"), hanging)

    async def main() -> str:
        task = asyncio.create_task(_used(connections))
        await asyncio.sleep(0)  # the task is in the check now
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        return await _used(connections)

    assert asyncio.run(main()) == "a"
    assert (hanging.closed, hanging in connections._idle, opened) == (True, False, [])
