"""A throwaway PostgreSQL cluster for the store tests and benchmark: a temporary directory, a loopback port.

Debian's ``postgresql`` package puts ``initdb`` and ``pg_ctl`` under
``/usr/lib/postgresql/<version>/bin`` (not on ``PATH``), so both places are
searched.  The server refuses to run as root, and CI runs as root: then the
cluster is created and started as an unprivileged system user (``nobody``),
which owns the temporary directory.  Nothing outside that directory is
touched, and ``stop()`` removes it.

The suite's cluster keeps its directory in memory (``/dev/shm``) where there
is room (``memory_folder``): a ``CREATE DATABASE``, one per PostgreSQL test,
took 0.2 s on this machine's busy disk and 0.015 s there (300 in a row), and
the 487 PostgreSQL tests took 18 s less in all on an idle machine.  It is the
same server with the same settings (``fsync`` is off either way); the
benchmark and the tests that kill a server keep theirs on disk.
"""

from __future__ import annotations

import glob
import os
import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path

HOW_TO_GET = "apt-get install postgresql (Debian/Ubuntu) or put initdb and pg_ctl on PATH"

UNPRIVILEGED = "nobody"
"""The user the server runs as when we are root: it exists on every Debian system."""

MEMORY = Path("/dev/shm")
ROOM = 1 << 30
"""Free bytes ``memory_folder`` asks of ``/dev/shm``: a container's default of 64 MB is far too little.  The suite's
cluster took at most 222 MB there in a whole ``make test``: its databases are dropped after their tests
(``drop_database``); all kept, they came to about 3 GB."""


def memory_folder() -> str | None:
    """``/dev/shm`` when it is a writable folder with ``ROOM`` free, else None (the system's temporary folder)."""
    try:
        free = shutil.disk_usage(MEMORY).free
    except OSError:
        return None
    return str(MEMORY) if free >= ROOM and os.access(MEMORY, os.W_OK | os.X_OK) else None


def find_bindir() -> Path | None:
    """The directory holding ``initdb`` and ``pg_ctl``: ``PATH`` first, then the newest Debian install."""
    on_path = shutil.which("initdb")
    if on_path is not None and shutil.which("pg_ctl") is not None:
        return Path(on_path).parent
    versions = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[-3]))
    return Path(versions[-1]).parent if versions else None


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


class Cluster:
    """One PostgreSQL server in its own temporary directory, with a ``dsn`` for the superuser ``fsm``."""

    def __init__(self, bindir: Path, *, fsync: bool = False, folder: str | None = None) -> None:
        self.bindir = bindir
        self.fsync = fsync
        self.root = Path(tempfile.mkdtemp(prefix="fsm-agent-pg-", dir=folder))  # folder None: the temporary one
        self.data = self.root / "data"
        self.port = _free_port()
        self.dsn = f"postgresql://fsm@127.0.0.1:{self.port}/postgres"
        self._as_user: list[str] = []
        self._to_drop: list[str] = []
        if os.geteuid() == 0:
            # The server will not run as root: hand the directory to an unprivileged user and run as it.
            shutil.chown(self.root, UNPRIVILEGED)
            self._as_user = ["runuser", "-u", UNPRIVILEGED, "--"]

    def _run(self, *command: str) -> None:
        done = subprocess.run([*self._as_user, *command], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            msg = f"{Path(command[0]).name} failed ({done.returncode}): {done.stderr.strip() or done.stdout.strip()}"
            raise RuntimeError(msg)

    def start(self) -> Cluster:
        """initdb (trust authentication on loopback only) and start the server; wait until it accepts connections."""
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "fsm", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        # No autovacuum: its analyze of a busy test table commits transactions of its own in that database, which
        # the counts of pg_stat_database.xact_commit (test_store_transactions, bench_store) would take for the store's.
        options = (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
            f" -c max_connections=200 -c fsync={'on' if self.fsync else 'off'} -c autovacuum=off"
        )
        log = self.root / "server.log"
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", options, "-l", str(log), "-w", "start")
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", self.port)) == 0:
                    return self
            time.sleep(0.05)
        msg = f"PostgreSQL did not start on port {self.port}: {log.read_text(errors='replace')[-500:]}"
        raise RuntimeError(msg)

    def stop(self) -> None:
        """Stop the server at once and remove its directory."""
        try:
            self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "immediate", "-w", "stop")
        finally:
            shutil.rmtree(self.root, ignore_errors=True)

    def new_database(self, name: str) -> str:
        """Create an empty database and return its DSN (each test module gets a fresh one)."""
        import psycopg

        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')  # a fixed test name, not user input
        return self.dsn.rsplit("/", 1)[0] + f"/{name}"

    def drop_database(self, name: str) -> None:
        """Drop a test's database, once its test is over, if no session is connected to it any more.

        Never cuts a connection: a database someone is still connected to (a
        store a test left open, a connection whose server process has not
        quite exited yet) is left, and dropped by a later call once it is
        free, or stays until ``stop()``.
        """
        import psycopg

        self._to_drop.append(name)
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            busy = {row[0] for row in conn.execute("SELECT DISTINCT datname FROM pg_stat_activity")}
            for each in [n for n in self._to_drop if n not in busy]:
                try:
                    conn.execute(f'DROP DATABASE IF EXISTS "{each}"')  # a fixed test name, not user input
                except psycopg.errors.ObjectInUse:  # connected to since the look: leave it for a later call
                    continue
                self._to_drop.remove(each)
