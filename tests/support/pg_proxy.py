"""A TCP proxy in front of the suite's PostgreSQL server that drops a connection at a chosen statement.

``Proxy(port)`` forwards ``127.0.0.1:<its port>`` to the server.  Its
``drop`` rule is asked of each chunk a client sends: ``"before"`` drops the
connection before the chunk reaches the server (the statement never ran),
``"after"`` forwards it and drops the connection before the server's answer
comes back (the statement ran, and committed if it was a commit), as a
failover or a network cut does.  The client gets psycopg's own errors.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Callable

Rule = Callable[[bytes], str | None]


def journal_appends(times: int, when: str, holding: bytes) -> Rule:
    """A rule: the next ``times`` journal appends holding ``holding`` are dropped ``when`` (before or after)."""
    left = [times]

    def rule(data: bytes) -> str | None:
        if left[0] > 0 and b"INSERT INTO fsm_agent_journal" in data and holding in data:
            left[0] -= 1
            return when
        return None

    return rule


class Proxy:
    """Forwards connections to the server on ``port``; ``drop`` decides which one to cut, and where."""

    def __init__(self, port: int) -> None:
        self.target = ("127.0.0.1", port)
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.drop: Rule | None = None
        self.dropped = 0
        self._closed = False
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, database: str) -> str:
        return f"postgresql://fsm@127.0.0.1:{self.port}/{database}"

    def _accept(self) -> None:
        while not self._closed:
            try:
                client, _ = self.listener.accept()
                server = socket.create_connection(self.target)
            except OSError:
                return
            threading.Thread(target=self._pump, args=(client, server), daemon=True).start()

    def _pump(self, client: socket.socket, server: socket.socket) -> None:
        answer_dropped = False
        try:
            while not self._closed:
                ready, _, _ = select.select([client, server], [], [], 0.2)
                for end in ready:
                    data = end.recv(65536)
                    if not data:
                        return
                    if end is client:
                        when = self.drop(data) if self.drop is not None else None
                        if when == "before":
                            self.dropped += 1
                            return
                        answer_dropped = answer_dropped or when == "after"
                        server.sendall(data)
                    elif answer_dropped:
                        time.sleep(0.2)  # the server finishes the statement (its commit) before the cut
                        self.dropped += 1
                        return
                    else:
                        client.sendall(data)
        except OSError:
            return
        finally:
            for end in (client, server):
                with contextlib.suppress(OSError):
                    end.shutdown(socket.SHUT_RDWR)
                end.close()

    def close(self) -> None:
        self._closed = True
        self.listener.close()
