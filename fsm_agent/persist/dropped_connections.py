"""PostgreSQL connections the server dropped while they sat idle, found before a write is sent on one.

A server that restarts, fails over or ends an idle session tells each open
connection so (a last message, then its end of the socket closes), but the
client hears it only when it next uses the connection.  Without a check, a
pool held open across a server restart fails one write per idle connection
right after the server is back, and a run whose write failed stops there.

Asking every connection before use (an empty query, one round trip per
checkpoint) would find them, at a cost paid on every write.  An idle
connection, though, has been asked nothing, so a healthy one has nothing to
read: a zero-timeout poll of its socket (one system call, about a
microsecond) tells the doubtful ones apart, and only they are asked.  A
server that vanished without a word (a cut cable) is not found this way;
the write fails, and the run owes it (``persist/cut_writes.py``).
"""

from __future__ import annotations

import select
import sys
from typing import Any


def doubtful(conn: Any) -> bool:
    """Whether an idle connection has something to read, or has no socket left: the server may have dropped it."""
    try:
        fd = conn.fileno()
    except Exception:  # noqa: BLE001 - psycopg raises its OperationalError for a connection it knows is lost
        return True
    if sys.platform == "win32":
        return bool(select.select([fd], [], [], 0)[0])  # no poll() there, and no limit on a socket's number
    poller = select.poll()  # not select(): a process with many files open hands out descriptors past its limit
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))


def check(conn: Any) -> None:
    """Raise if an idle sync connection was dropped: a doubtful one is asked an empty query, a healthy one nothing."""
    if doubtful(conn):
        conn.execute("")  # the store's connections are in autocommit: no transaction is left open


async def acheck(conn: Any) -> None:
    """``check`` for an async connection."""
    if doubtful(conn):
        await conn.execute("")
