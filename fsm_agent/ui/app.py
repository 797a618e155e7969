"""The run viewer as a Starlette app: a JSON API over a store, the machine drawing, and the page's static files.

Read-only unless built with ``allow_decisions``: then, and only then, a
paused run's pending calls can be approved or rejected, which records the
decision in the store (``store.decide``, one checked write) for whoever resumes the run.
Built with an agent, it can also re-run a run from one of its transitions
(a fork, stored beside its source and run with that agent: ``forks.py``).
Every model- or tool-produced string leaves here as JSON and is put on the
page as text; the page runs only its own script (a strict
``Content-Security-Policy``); a request whose ``Host`` is not one the viewer
was bound to is refused, so a web page cannot reach it by DNS rebinding, and
a decision must come as JSON from the viewer's own origin, so a web page
cannot forge one with a plain form.

A run's page links its sub-agent calls to the runs they were and a
sub-agent's run to its parent (``run_page.py``); the store is read for that
on the run's page only (one listing of the run's sub-agent runs,
``list_runs(parent=...)``, at each poll of a followed run), never for the
list, whose rows come from the store's index alone.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from starlette.applications import Starlette
from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import FileResponse, Response, StreamingResponse
from starlette.routing import Mount, Route
from starlette.staticfiles import StaticFiles
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from fsm_agent import TABLE, DecisionError, SnapshotError, Table
from fsm_agent.core.approval import check_decision_value
from fsm_agent.persist.cursor import Order, RunCursor
from fsm_agent.persist.store import filter_text
from fsm_agent.persist.summary import StoredRun
from fsm_agent.render.dot import INSTALL_HINT, dot_installed, render, to_dot
from fsm_agent.ui.answers import JSONText
from fsm_agent.ui.forks import NO_AGENT, fork_routes, refused_post
from fsm_agent.ui.listing import UNPAGED, page_answer, page_start
from fsm_agent.ui.live import follow
from fsm_agent.ui.replay import digest
from fsm_agent.ui.run_page import run_view, with_children

if TYPE_CHECKING:
    from fsm_agent import Agent

STATIC = Path(__file__).resolve().parent / "static"
PAGE_SIZE = 25
"""Runs per page of the list."""
FILTERS = ("state", "reason", "session")
"""The list's filters, query parameters of the page and of ``/api/runs``."""
LOOPBACK = ("127.0.0.1", "localhost", "::1")
"""The names a viewer bound to loopback answers to."""
HEADERS = {
    "content-security-policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; connect-src 'self'; "
        "base-uri 'none'; form-action 'self'; frame-ancestors 'none'"
    ),
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
"""Sent with every response: the page loads nothing but its own files, and no other site can frame it."""


class Runs(Protocol):
    """What the viewer needs of a store (``SqliteStore`` and ``PostgresStore`` have it)."""

    def load(self, run_id: str) -> dict[str, Any]:
        """The run's latest snapshot; ``KeyError`` if there is none."""
        ...

    def decide(self, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
        """Record one decision on a paused run's pending call atomically; the run as stored now."""
        ...

    def list_runs(
        self,
        *,
        state: str | None = None,
        reason: str | None = None,
        limit: int | None = None,
        offset: int = 0,
        session: str | None = None,
        order: Order = "updated",
        after: RunCursor | None = None,
        parent: str | None = None,
    ) -> Sequence[StoredRun]:
        """One page of stored runs, latest first (the viewer lists ``order="created"``, paged by ``after``).

        A run's page lists its sub-agent runs with ``parent`` (``run_page.with_children``).
        """
        ...


def _host_of(header: str) -> str:
    """The host name of a ``Host`` header, without its port (``[::1]:8000`` -> ``::1``)."""
    if header.startswith("["):
        return header[1 : header.find("]")] if "]" in header else header
    return header.rsplit(":", 1)[0] if header.count(":") == 1 else header


class Guard:
    """ASGI middleware: refuse a ``Host`` the viewer was not bound to, add the security headers to every answer."""

    def __init__(self, app: ASGIApp, hosts: Sequence[str] | None) -> None:
        self.app = app
        # Lower case on both sides: browsers send the name lower case, whatever case it was typed in.
        self.hosts = None if hosts is None else frozenset(host.lower() for host in hosts)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                extra = [(k.encode(), v.encode()) for k, v in HEADERS.items()]
                message["headers"] = [*message.get("headers", []), *extra]
            await send(message)

        host = dict(scope["headers"]).get(b"host", b"").decode("latin-1")
        if self.hosts is not None and _host_of(host).lower() not in self.hosts:
            refused = JSONText({"error": f"this viewer does not answer to host {host!r}"}, status_code=421)
            await refused(scope, receive, with_headers)  # a refusal carries the headers too
            return
        await self.app(scope, receive, with_headers)


def viewer_mode(allow_decisions: bool, can_fork: bool) -> str:
    """What the viewer lets its page change, as its header and the command's first line say it.

    ``read-only`` only while it neither decides calls nor re-runs runs: a viewer built with an agent
    stores forks, so calling it read-only would be untrue.
    """
    allowed = [what for what, on in (("decisions", allow_decisions), ("re-runs", can_fork)) if on]
    return " and ".join(allowed) + " allowed" if allowed else "read-only"


def _error(message: str, status: int) -> JSONText:
    return JSONText({"error": message}, status_code=status)


def create_app(
    store: Runs,
    *,
    table: Table = TABLE,
    allow_decisions: bool = False,
    hosts: Sequence[str] | None = LOOPBACK,
    store_name: str = "",
    poll: float = 0.5,
    agent: Agent | None = None,
    agent_spec: str | None = None,
    stopping: threading.Event | None = None,
) -> ASGIApp:
    """The viewer over ``store``: pages ``/`` (the runs), ``/run?id=`` (one run), ``/compare``; the API under ``/api``.

    ``table`` is the machine the runs are drawn over; ``hosts`` the names
    the viewer answers to (None: any, which only a read-only viewer may do:
    a decision's Origin check means something only while ``Host`` is checked);
    ``poll`` how often (seconds) a followed run is read again.  With
    ``agent``, a run can be re-run from any of its transitions (``forks.py``);
    ``agent_spec``, its ``MODULE:FUNCTION``, is what a run saved as a test imports.
    ``stopping``, set as the server stops, ends the runs followed live (``live.py``).
    """
    if (allow_decisions or agent is not None) and hosts is None:
        # A DNS-rebound page is its own origin on any Host: with every Host answered, it could decide or re-run.
        given = "allow_decisions" if allow_decisions else "agent"
        msg = f"{given} needs the host names the viewer answers to (hosts), not None (any host)"
        raise ValueError(msg)

    async def page(request: Request) -> Response:
        return FileResponse(STATIC / "index.html", media_type="text/html; charset=utf-8")

    routes = [
        Route("/", page),
        Route("/run", page),
        Route("/compare", page),
        *_read_routes(
            store,
            table,
            store_name,
            poll,
            stopping or threading.Event(),
            allow_decisions=allow_decisions,
            can_fork=agent is not None,
        ),
        *_decision_routes(store, table, allow_decisions),
        *fork_routes(store, table, agent, agent_spec),
        Mount("/static", StaticFiles(directory=STATIC), name="static"),
    ]
    return Guard(Starlette(routes=routes), hosts)


def _read_routes(
    store: Runs,
    table: Table,
    store_name: str,
    poll: float,
    stopping: threading.Event,
    *,
    allow_decisions: bool,
    can_fork: bool,
) -> list[Route]:
    """The API's reading routes: the viewer's settings, the machine's drawing, the list, one run, a run followed."""
    drawing: list[bytes] = []

    async def config(request: Request) -> Response:
        return JSONText(
            {
                "allow_decisions": allow_decisions,
                "mode": viewer_mode(allow_decisions, can_fork),
                "store": store_name,
                "states": [str(state) for state in table.states],
                "reasons": ["done", *table.reasons],
                "page_size": PAGE_SIZE,
                "can_fork": can_fork,
                "fork_refusal": None if can_fork else NO_AGENT,
            }
        )

    async def machine(request: Request) -> Response:
        if not drawing:
            if not dot_installed():
                return _error(f"the machine cannot be drawn: {INSTALL_HINT}", 503)
            drawing.append(await run_in_threadpool(render, to_dot(table), "svg"))
        return Response(drawing[0], media_type="image/svg+xml")

    async def runs(request: Request) -> Response:
        query = request.query_params
        where = page_start(query.get("after"), query.get("offset"))
        if isinstance(where, JSONText):
            return where
        after, offset = where
        filters: dict[str, str | None] = {}
        for name in FILTERS:
            value = query.get(name) or None
            try:
                filters[name] = filter_text(name, value)
            except ValueError:  # a NUL (PostgreSQL takes none in a query): no store can compare it
                return _error(f"filter {name} {value!r:.60} must be text without NUL or lone surrogates", 400)
        try:
            found = await run_in_threadpool(
                lambda: store.list_runs(**filters, limit=PAGE_SIZE + 1, offset=offset, order="created", after=after),
            )
        except ValueError as exc:  # whatever else a store refuses to list by, in its own words
            return _error(f"the runs cannot be listed so: {exc}", 400)
        except TypeError as exc:  # a store written before list_runs took order and after (FullStore has them)
            return _error(f"{UNPAGED}: {exc}", 501)
        return page_answer(found, PAGE_SIZE, after, offset)

    async def one_run(request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        try:
            data = await run_in_threadpool(store.load, run_id)
        except KeyError:
            return _error(f"no run {run_id!r} in this store", 404)
        except SnapshotError as exc:  # the run is there, but its stored row is not what a store writes
            return _error(str(exc), 422)
        try:
            page = await run_in_threadpool(run_view, store, run_id, data, table)
        except SnapshotError as exc:  # the rows add up to a snapshot that is no run's (an older version's, by hand)
            return _error(str(exc), 422)
        return JSONText(page)

    async def events(request: Request) -> Response:
        run_id = request.query_params.get("id", "")
        try:
            await run_in_threadpool(store.load, run_id)
        except KeyError:  # never in the store: unknown, as /api/run says; one deleted while followed ends with gone
            return _error(f"no run {run_id!r} in this store", 404)
        except SnapshotError:
            pass  # the run is there: its stream says it is corrupted, as when it turns so while followed
        return StreamingResponse(
            follow(
                store.load,
                run_id,
                table,
                poll,
                request.is_disconnected,
                stopping,
                lambda data: digest(run_id, data, table),
                lambda data, page: with_children(store, run_id, data, page, table),
            ),
            media_type="text/event-stream",
            headers={"x-accel-buffering": "no"},
        )

    return [
        Route("/api/config", config),
        Route("/api/machine.svg", machine),
        Route("/api/runs", runs),
        Route("/api/run", one_run),
        Route("/api/events", events),
    ]


def _decision_routes(store: Runs, table: Table, allow_decisions: bool) -> list[Route]:
    """The route of a person's decision on a paused run's pending call (refused unless ``allow_decisions``)."""

    async def decide(request: Request) -> Response:
        if not allow_decisions:
            return _error("this viewer is read-only: start it with --allow-decisions to approve or reject calls", 403)
        refusal = refused_post(request, "a decision")
        if refusal is not None:
            return refusal
        run_id = request.query_params.get("id", "")
        try:
            call_id, decision = _decision(await request.json())
        except NoteRefused as exc:  # a decision, but one whose text the store has no place for
            return _error(str(exc), 400)
        except (ValueError, KeyError, TypeError) as exc:
            return _error(f"a decision is {{call_id, approve: true|false, why}}: {exc}", 400)
        try:
            data = await run_in_threadpool(_record, store, run_id, call_id, decision)
        except KeyError:
            return _error(f"no run {run_id!r} in this store", 404)
        except SnapshotError as exc:
            return _error(str(exc), 422)
        except ValueError as exc:
            return _error(str(exc), 409)
        return JSONText(await run_in_threadpool(run_view, store, run_id, data, table))

    return [Route("/api/decide", decide, methods=["POST"])]


class NoteRefused(ValueError):
    """An approval posted with a reason: refused (400), since the store keeps an approval as ``True``, with no text.

    Why: a decision is True, False or a rejection's reason, so taken, the text would be dropped without a word.
    """

    def __init__(self, why: str) -> None:
        super().__init__(
            f"an approval carries no reason: the store keeps an approval with no text, so {why!r:.80} would be lost; "
            "clear the reason to approve, or reject the call with it"
        )


def _decision(body: Any) -> tuple[str, bool | str]:
    """The call id and decision a request's JSON body holds; ``TypeError`` or ``ValueError`` saying what is wrong.

    Checked whole before the store is asked, so a body that is not a
    decision is a 400 and changes nothing: a reason that is not text is not
    turned into one, nor a call id that is not text into a call's name.
    """
    call_id, approve, why = body["call_id"], body["approve"], body.get("why")
    for name, value, kind in (("call_id", call_id, str), ("approve", approve, bool), ("why", why, str | None)):
        if not isinstance(value, kind):
            wanted = "true or false" if kind is bool else "text"
            raise TypeError(f"{name} must be {wanted}, got {type(value).__name__}")
    if approve and (why or "").strip():
        raise NoteRefused(why)
    decision = True if approve else (why or False)  # a rejection's reason as typed, spaces and all
    check_decision_value(decision)  # a reason that reads as an approval: the person meant the other button
    return call_id, decision


def _record(store: Runs, run_id: str, call_id: str, decision: bool | str) -> dict[str, Any]:
    """Record a person's decision with the store's own check-and-write; ``ValueError`` saying why it was not taken.

    The store checks the decision against the run as stored and writes it in
    one transaction, so two people deciding at once both have theirs kept,
    or the second is told whose decision stands; none is lost.
    """
    try:
        return store.decide(run_id, call_id, decision)
    except (KeyError, DecisionError, SnapshotError):
        raise
    except Exception as exc:  # whichever store failed (a live lease, a locked file, a lost server), say so
        msg = f"the decision could not be saved: {type(exc).__name__}: {exc}"
        raise ValueError(msg) from exc
