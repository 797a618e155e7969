"""``PostgresStore``: the same store on a PostgreSQL server, for apps that run on more than one machine.

It runs the very plans ``SqliteStore`` runs (``persist/plans.py``), through
the same methods (``PlannedStore``, ``persist/planned.py``), on ``psycopg`` 3:
a ``psycopg_pool`` pool of sync connections shared by every thread, and per
event loop a few async connections (``persist/loop_connections.py``), closed
when the loop shuts down, so the async driver awaits its checkpoints.
``psycopg`` is an optional extra (``pip install 'fsm-agent[postgres]'``),
imported only when a ``PostgresStore`` is made.  The tables
(``fsm_agent_runs``, ``fsm_agent_journal``) are created on first use and their
schema is versioned in ``fsm_agent_schema``, migrated under an advisory lock
so that many workers starting at once migrate it once.
"""

from __future__ import annotations

import asyncio
import re
import threading
from collections.abc import AsyncGenerator
from typing import TYPE_CHECKING, Any, Literal, TypeVar

from fsm_agent.persist import dropped_connections, plans
from fsm_agent.persist.checks import check_lease
from fsm_agent.persist.every import check_every
from fsm_agent.persist.loop_connections import LoopConnections
from fsm_agent.persist.planned import PlannedStore
from fsm_agent.persist.store import DEFAULT_LEASE, StoreError

if TYPE_CHECKING:
    from psycopg_pool import ConnectionPool

T = TypeVar("T")

SCHEMA_VERSION = 6
MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE TABLE fsm_agent_runs (run_id text PRIMARY KEY, state text NOT NULL, reason text,"
        " paused boolean NOT NULL, updated double precision NOT NULL, steps integer NOT NULL,"
        " tokens bigint NOT NULL, seq bigint NOT NULL, base_seq bigint NOT NULL, owner text,"
        " lease_until double precision, snapshot text NOT NULL)",
        "CREATE INDEX fsm_agent_runs_by_updated ON fsm_agent_runs (updated)",
        "CREATE TABLE fsm_agent_journal (run_id text NOT NULL, seq bigint NOT NULL, entry text NOT NULL,"
        " PRIMARY KEY (run_id, seq))",
    ),
    2: (
        "ALTER TABLE fsm_agent_runs ADD COLUMN session text",
        "CREATE INDEX fsm_agent_runs_by_session ON fsm_agent_runs (session, updated)",
    ),
    3: (
        "ALTER TABLE fsm_agent_runs ADD COLUMN forked_from text",
        "ALTER TABLE fsm_agent_runs ADD COLUMN forked_at bigint",
    ),
    4: (
        # A worker of an older version, still running, inserts no ``created``: the server's clock stands in
        # for it.  The runs already there get their last save, the closest to a creation time they keep.
        "ALTER TABLE fsm_agent_runs ADD COLUMN created double precision NOT NULL"
        " DEFAULT extract(epoch from clock_timestamp())",
        "UPDATE fsm_agent_runs SET created = updated",
        "CREATE INDEX fsm_agent_runs_by_created ON fsm_agent_runs (created, run_id)",
    ),
    5: (
        # A worker of an older version still running inserts no link: its sub-agent runs are not listed by parent
        # until a worker of this version writes them whole again (a claim, a save); the viewer loads those a
        # run's steps name, but cannot see one still in flight.
        "ALTER TABLE fsm_agent_runs ADD COLUMN parent text",
        "ALTER TABLE fsm_agent_runs ADD COLUMN parent_call text",
        # A run's link is written when it is created and never changes, so its base snapshot holds it.  A base
        # jsonb cannot read (not JSON, or a NUL escaped in it) is left unlinked rather than failing the upgrade.
        "CREATE FUNCTION pg_temp.fsm_agent_base(text) RETURNS jsonb LANGUAGE plpgsql AS"
        " $$ BEGIN RETURN $1::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$",
        "UPDATE fsm_agent_runs SET parent = base ->> 'parent_run_id', parent_call = base ->> 'parent_call_id'"
        " FROM (SELECT run_id AS linked, pg_temp.fsm_agent_base(snapshot) AS base FROM fsm_agent_runs"
        " WHERE strpos(snapshot, 'parent_run_id') > 0) AS bases WHERE run_id = linked"
        " AND jsonb_typeof(base -> 'parent_run_id') = 'string' AND jsonb_typeof(base -> 'parent_call_id') = 'string'"
        " AND base ->> 'parent_run_id' <> '' AND base ->> 'parent_call_id' <> ''",
        "DROP FUNCTION pg_temp.fsm_agent_base(text)",
        "CREATE INDEX fsm_agent_runs_by_parent ON fsm_agent_runs (parent, updated)",
    ),
    6: (
        # A worker of an older version still running inserts no start: a version it writes is checked as before,
        # by its number alone, until a worker of this version writes the run whole again.  A run's start is in its
        # base; a base jsonb cannot read is left without one rather than failing the upgrade.
        "ALTER TABLE fsm_agent_runs ADD COLUMN start_id text",
        "CREATE FUNCTION pg_temp.fsm_agent_base(text) RETURNS jsonb LANGUAGE plpgsql AS"
        " $$ BEGIN RETURN $1::jsonb; EXCEPTION WHEN others THEN RETURN NULL; END $$",
        "UPDATE fsm_agent_runs SET start_id = base ->> 'start_id'"
        " FROM (SELECT run_id AS started, pg_temp.fsm_agent_base(snapshot) AS base FROM fsm_agent_runs"
        " WHERE strpos(snapshot, 'start_id') > 0) AS bases WHERE run_id = started"
        " AND jsonb_typeof(base -> 'start_id') = 'string'",
        "DROP FUNCTION pg_temp.fsm_agent_base(text)",
    ),
}
"""Each schema version's statements; a store brings the database up to ``SCHEMA_VERSION`` on first use."""

RECONNECT_TIMEOUT = 10.0
"""How long the sync pool tries to open one connection before it gives that attempt up (psycopg_pool: 300 s).

Its tries back off, doubling from 1 s, so after an outage of a minute the
next try could come a minute after the server is back, past a write's 30 s
wait for a connection (``PoolTimeout``).  Given up after 10 s, a new attempt
starts at once if a write is waiting (``_tried_long``), else
with the next write: once the server is back, a write waits at most the
last back-off step, about 4 s.
"""

_LOCK_KEY = 0x46534D41  # "FSMA": the advisory lock that serialises migrations
_REPEATABLE = "SET TRANSACTION ISOLATION LEVEL REPEATABLE READ"  # a load sees its base and journal as of one moment


def redact(dsn: str) -> str:
    """The DSN without its password (after the user, or as a ``password=`` parameter), for messages and ``repr``."""
    if "://" in dsn:
        # By hand, not urlsplit: a malformed URL (a stray bracket) must be redacted too, not raise.
        scheme, _, rest = dsn.partition("://")
        netloc, slash, tail = rest.partition("/")
        if "@" in netloc:
            who, _, host = netloc.rpartition("@")
            if ":" in who:
                netloc = f"{who.partition(':')[0]}:[redacted]@{host}"
        tail = re.sub(r"((?:^|[?&])password=)[^&#]*", r"\1[redacted]", tail, flags=re.IGNORECASE)
        return f"{scheme}://{netloc}{slash}{tail}"
    return re.sub(r"(password\s*=\s*)('(?:[^'\\]|\\.)*'|\S+)", r"\1[redacted]", dsn)


def _psycopg() -> Any:
    try:
        import psycopg
        import psycopg_pool  # noqa: F401 - checked here so a missing pool package fails at once, by name
    except ImportError as exc:
        msg = f"PostgresStore needs psycopg 3 and psycopg_pool: pip install 'fsm-agent[postgres]' ({exc})"
        raise ImportError(msg) from None
    return psycopg


def _reply(cursor: Any) -> plans.Reply:
    return cursor.rowcount, (cursor.fetchall() if cursor.description is not None else [])


class PostgresStore(PlannedStore):
    """A checkpoint store in a PostgreSQL database: the same protocol, behaviour and tests as ``SqliteStore``.

    ``dsn`` is a libpq connection string or URL.  ``every`` is when a run is
    written, as for ``SqliteStore``: ``"call"`` (default, one transaction per
    I/O boundary: as each model or tool call returns, with the transitions
    since the last, and at the end or a pause; at most model calls + tool
    calls + 2 a run, same exactly-once guarantees, see ``every.EVERY``),
    ``"transition"`` (a transaction per transition) or ``"turn"``.  ``lease`` (default 12 s,
    ``DEFAULT_LEASE``) is how long a run stays owned without a renewal: the
    owner renews it at checkpoints and every third of a lease while a call is
    in flight, so a run whose owner died is free within ``lease`` seconds.
    ``max_size`` bounds each pool (a heartbeat renewal borrows a connection
    briefly).  ``synchronous_commit=True`` (default) leaves the server's own
    setting (``on`` unless the server was configured otherwise): a write is
    acknowledged once flushed to the WAL, so it survives the server being
    killed and its machine losing power.  ``synchronous_commit=False`` is the
    fast mode: it sets ``synchronous_commit=off`` on the store's sessions, and
    the server acknowledges a write before flushing it, so a crash of the
    *server* (its processes killed, or its machine) can lose the writes of the
    last few hundred milliseconds (up to three ``wal_writer_delay``), and a
    tool call whose outcome was lost runs again when the run is resumed; a
    crash of the client still loses nothing.
    """

    def __init__(
        self,
        dsn: str,
        every: Literal["transition", "call", "turn"] = "call",
        *,
        lease: float = DEFAULT_LEASE,
        max_size: int = 10,
        synchronous_commit: bool = True,
    ) -> None:
        if not isinstance(dsn, str):
            msg = f"dsn must be a postgresql:// URL or a libpq connection string, got {type(dsn).__name__}"
            raise TypeError(msg)
        self.every = check_every(every)
        self.lease = check_lease(lease)
        self.dsn = dsn
        self._psycopg = _psycopg()
        self._where = redact(dsn)
        self._plans = plans.Plans(
            "fsm_agent_runs", "fsm_agent_journal", placeholder="%s", no_limit="ALL", where=self._where, lease=lease
        )
        self._max_size = max_size
        self._connect: dict[str, Any] = {"autocommit": True}
        if not synchronous_commit:  # the fast mode, asked for by name: see the class docstring
            self._connect["options"] = "-c synchronous_commit=off"
        self._pool: ConnectionPool | None = None
        self._opening = threading.Lock()  # threads making their first call at once open one pool between them
        self._loops: dict[asyncio.AbstractEventLoop, LoopConnections] = {}
        # Per loop, an async generator the loop closes as it shuts down (asyncio.run does): it closes that loop's
        # connections, which would otherwise stay open after the loop is gone.
        self._watchers: dict[asyncio.AbstractEventLoop, AsyncGenerator[None, None]] = {}
        self._migrate()

    def __repr__(self) -> str:
        return f"PostgresStore({self._where!r})"

    def _migrate(self) -> None:
        """Create or upgrade the tables, once, whoever else is starting at the same moment."""
        psycopg = self._psycopg
        try:
            with psycopg.connect(self.dsn, autocommit=True) as conn, conn.transaction():
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (_LOCK_KEY,))
                conn.execute("CREATE TABLE IF NOT EXISTS fsm_agent_schema (version integer NOT NULL)")
                version = conn.execute("SELECT coalesce(max(version), 0) FROM fsm_agent_schema").fetchone()[0]
                if version > SCHEMA_VERSION:
                    msg = f"schema version {version} is newer than this fsm_agent reads ({SCHEMA_VERSION})"
                    raise StoreError(self._where, msg)
                for number in range(version + 1, SCHEMA_VERSION + 1):
                    for statement in MIGRATIONS[number]:
                        conn.execute(statement)
                    conn.execute("INSERT INTO fsm_agent_schema (version) VALUES (%s)", (number,))
        except psycopg.Error as exc:
            # psycopg quotes a connection string it cannot parse whole, password and all.
            raise StoreError(self._where, str(exc).replace(self.dsn, self._where)) from None

    def _sync_pool(self) -> ConnectionPool:
        pool = self._pool
        if pool is None:
            with self._opening:
                if self._pool is None:
                    from psycopg_pool import ConnectionPool

                    size = self._max_size
                    opened = ConnectionPool(
                        self.dsn,
                        min_size=1,
                        max_size=size,
                        kwargs=self._connect,
                        open=False,
                        check=self._check_idle,
                        reconnect_timeout=RECONNECT_TIMEOUT,
                        reconnect_failed=_tried_long,
                    )
                    opened.open()
                    self._pool = opened
                pool = self._pool
        return pool

    def _check_idle(self, conn: Any) -> None:
        """The pool's check before it hands a connection out: one the server dropped is swapped for a new one.

        A dropped connection means a restart or failover dropped its idle
        siblings too: they are checked at once (``ConnectionPool.check``), so
        the pool does not find them one by one, backing off between them.
        """
        try:
            dropped_connections.check(conn)
        except self._psycopg.Error:
            pool = self._pool
            if pool is not None:
                pool.check()
            raise

    def _run(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """Run a plan in one transaction, or (``atomic``: its one write is a single statement) without one."""
        with self._sync_pool().connection() as conn:
            if atomic:
                return plans.drive(plan, lambda sql, params: _reply(conn.execute(sql, params)))
            with conn.transaction():
                if not write:
                    conn.execute(_REPEATABLE)
                return plans.drive(plan, lambda sql, params: _reply(conn.execute(sql, params)))

    async def _connections(self) -> LoopConnections:
        loop = asyncio.get_running_loop()
        connections = self._loops.get(loop)
        if connections is None:
            psycopg = self._psycopg

            async def connect() -> Any:
                return await psycopg.AsyncConnection.connect(self.dsn, **self._connect)

            idle = psycopg.pq.TransactionStatus.IDLE
            connections = self._loops[loop] = LoopConnections(connect, self._max_size, idle, dropped_connections.acheck)
            watcher = self._watchers[loop] = self._closed_with(loop)
            await watcher.__anext__()  # started, so the loop finalises it when it shuts down
        return connections

    async def _closed_with(self, loop: asyncio.AbstractEventLoop) -> AsyncGenerator[None, None]:
        """Close ``loop``'s connections when the loop shuts down (``asyncio.run`` finalises async generators then)."""
        try:
            yield
        finally:
            await self._close_loop(loop)

    async def _close_loop(self, loop: asyncio.AbstractEventLoop) -> None:
        self._watchers.pop(loop, None)
        connections = self._loops.pop(loop, None)
        if connections is not None:
            await connections.close()

    async def _arun(self, plan: plans.Plan[T], *, write: bool = True, atomic: bool = False) -> T:
        """``_run`` on this event loop's async connections, so the async driver awaits its checkpoints."""
        connections = await self._connections()
        async with connections.connection() as conn:
            if atomic:
                return await _adrive(plan, conn)
            async with conn.transaction():
                if not write:
                    await conn.execute(_REPEATABLE)
                return await _adrive(plan, conn)

    def close(self) -> None:
        """Close the sync pool, and the connections of every loop that is not running (a running loop's: ``aclose``).

        A loop ``asyncio.run`` ran closed its connections as it shut down.
        """
        with self._opening:
            pool, self._pool = self._pool, None
        if pool is not None:
            pool.close()
        for loop in list(self._loops):
            if loop.is_closed():
                self._loops.pop(loop, None)  # closed without finalising its generators: nothing can await there
                self._watchers.pop(loop, None)
            elif not loop.is_running():
                loop.run_until_complete(self._close_loop(loop))

    async def aclose(self) -> None:
        """Close this event loop's connections before the loop ends (the store stays usable; more open if needed)."""
        await self._close_loop(asyncio.get_running_loop())

    async def __aenter__(self) -> PostgresStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()
        await asyncio.to_thread(self.close)  # the sync pool's connections close in a worker: the loop goes on


def _tried_long(pool: ConnectionPool) -> None:
    """After ``RECONNECT_TIMEOUT`` of failed tries: a new attempt, its back-off from 1 s, if a write is waiting.

    ``ConnectionPool.check`` grows a pool that has no connection to hand out;
    a pool nobody waits on tries again with the next write, and stays quiet
    (no try, no warning) while the server is down and nothing is written.
    """
    if pool.get_stats()["requests_waiting"]:
        pool.check()


async def _adrive(plan: plans.Plan[T], conn: Any) -> T:
    """``plans.drive`` on an async connection."""
    try:
        query = next(plan)
        while True:
            cursor = await conn.execute(query[0], query[1])
            rows = await cursor.fetchall() if cursor.description is not None else []
            query = plan.send((cursor.rowcount, rows))
    except StopIteration as done:
        return done.value  # type: ignore[no-any-return]
