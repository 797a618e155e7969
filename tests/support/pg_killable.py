"""A throwaway PostgreSQL cluster a test can kill outright or shut down, and start again on the same data.

The suite's shared server (``postgres_cluster``) must outlive every test;
this one belongs to one test (the ``killable`` fixture), which may end its
server as a crash does (every process SIGKILLed) or as an administrator
does (a fast shutdown, each session told), and start it again.  Its WAL
writer waits 10 s between rounds and its background writer writes no pages,
so the durability tests can lose a commit the server acknowledged unflushed.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import time
from pathlib import Path

from support.pg_cluster import Cluster

WAL_WRITER_DELAY_MS = 10_000
"""The longest ``wal_writer_delay`` PostgreSQL takes: an unflushed commit waits that long for the WAL writer."""


class KillableCluster(Cluster):
    """A throwaway cluster that can be killed outright (every server process, SIGKILL) and started again."""

    running = False

    def options(self) -> str:
        """The server's settings: loopback only, a slow WAL writer, fsync as the class says."""
        return (
            f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.root}"
            f" -c fsync={'on' if self.fsync else 'off'} -c autovacuum=off"
            f" -c wal_writer_delay={WAL_WRITER_DELAY_MS}ms -c bgwriter_lru_maxpages=0"
        )

    def start(self) -> KillableCluster:
        """initdb and start the server with ``options()``."""
        self._run(
            str(self.bindir / "initdb"), "-D", str(self.data), "-U", "fsm", "-A", "trust", "--no-sync", "-E", "UTF8"
        )
        return self.restart()

    def restart(self) -> KillableCluster:
        """Start the server on the existing data directory (it recovers from its WAL after a kill)."""
        log = self.root / "server.log"
        try:
            self._run(
                str(self.bindir / "pg_ctl"), "-D", str(self.data), "-o", self.options(), "-l", str(log), "-w", "start"
            )
        except RuntimeError as exc:
            msg = f"{exc}: {log.read_text(errors='replace')[-1500:]}"
            raise RuntimeError(msg) from None
        self.running = True
        return self

    def kill(self) -> None:
        """SIGKILL the postmaster and every process it started, all frozen first so none goes on alone."""
        postmaster = int((self.data / "postmaster.pid").read_text().split()[0])
        os.kill(postmaster, signal.SIGSTOP)  # a stopped postmaster starts nothing new
        children = [pid for pid in _pids() if _parent(pid) == postmaster]
        for pid in children:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGSTOP)
        for pid in [postmaster, *children]:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while any(_alive(pid) for pid in [postmaster, *children]):
            assert time.monotonic() < deadline, "the killed server's processes did not go away"
            time.sleep(0.02)
        # A killed postmaster nobody reaped stays a zombie, which the next start would take for a live server.
        (self.data / "postmaster.pid").unlink()
        (self.root / f".s.PGSQL.{self.port}.lock").unlink()
        self.running = False

    def shut_down(self) -> None:
        """Stop the server as an administrator does (``pg_ctl -m fast``): it tells each session it is ending."""
        self._run(str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "stop")
        self.running = False

    def stop(self) -> None:
        """Stop the server if it runs, and remove its directory."""
        if self.running:
            super().stop()
        else:
            shutil.rmtree(self.root, ignore_errors=True)


def _pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat(pid: int) -> list[str] | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()  # after "pid (command) ": state, ppid, ...


def _parent(pid: int) -> int | None:
    fields = _stat(pid)
    return None if fields is None else int(fields[1])


def _alive(pid: int) -> bool:
    return process_state(pid) not in (None, "Z")


def process_state(pid: int) -> str | None:
    """The process's state letter (``R``, ``S``, ``T`` stopped, ``Z`` zombie), or None once it is gone."""
    fields = _stat(pid)
    return None if fields is None else fields[0]
