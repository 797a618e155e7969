"""The viewer's routes around forks: re-run a run from one of its transitions, compare two runs, save a run as a test.

``POST /api/fork?id=RUN`` with ``{"at": N}`` forks the run at transition N
(``Agent.fork``) in the viewer's store and runs the fork in a thread of its
own, answering at once with the fork's id so the page opens the fork and
follows it live.  Only a viewer started with an agent (``ui --agent
MODULE:FUNCTION``) can: a fork calls that agent's model and tools.  A tool
call the source completed after N is not made again when the fork asks for
the same one (its recorded result is reused).  Like a decision, a re-run must come as JSON from the viewer's
own origin.  ``/api/compare?a=RUN&b=RUN`` gives two runs side by side
(``compare.py``); ``/api/test?id=RUN`` a zip of the run's recording and a
pytest file replaying it (``saved_test.py``).
"""

from __future__ import annotations

import logging
import threading
from typing import TYPE_CHECKING, Any, cast

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import Response
from starlette.routing import Route

from fsm_agent import SnapshotError, Table
from fsm_agent.errors import FsmAgentError
from fsm_agent.ui.answers import JSONText
from fsm_agent.ui.compare import compare
from fsm_agent.ui.replay import digest
from fsm_agent.ui.saved_test import zipped

if TYPE_CHECKING:
    from fsm_agent import Agent
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.persist.store import Store

logger = logging.getLogger("fsm_agent.ui")

NO_AGENT = "start the viewer with --agent MODULE:FUNCTION to re-run a run from one of its transitions"
"""Why a viewer without an agent cannot re-run: the page shows it as the disabled button's title."""


def refused_post(request: Request, what: str) -> JSONText | None:
    """Why a state-changing request is refused (not JSON, or from another origin), or None if it may go on.

    A web page can send a plain form anywhere, but not JSON to another
    origin without its consent: so a page elsewhere cannot forge one.
    """
    if request.headers.get("content-type", "").split(";")[0].strip() != "application/json":
        return JSONText({"error": f"{what} must be sent as application/json"}, status_code=415)
    origin = request.headers.get("origin")
    if origin is not None and origin != f"{request.url.scheme}://{request.url.netloc}":
        return JSONText({"error": f"{what} from origin {origin!r} is refused"}, status_code=403)
    return None


def _error(message: str, status: int) -> JSONText:
    return JSONText({"error": message}, status_code=status)


def _drive(run: AgentRun) -> None:
    """Run a fork to its end (or its pause) in its own thread; how it ended is in the store, a crash in the log."""
    try:
        run.finish()
    except FsmAgentError:
        pass  # a stop the agent's policy raises on: the stored run says why
    except Exception:
        logger.exception("the fork %r failed", run.run_id)


def fork_routes(store: Any, table: Table, agent: Agent | None, agent_spec: str | None) -> list[Route]:
    """The routes of re-running, comparing and saving as a test, over ``store``, with ``agent`` if given."""

    async def fork(request: Request) -> Response:
        if agent is None:
            return _error(NO_AGENT, 403)
        refusal = refused_post(request, "a re-run")
        if refusal is not None:
            return refusal
        run_id = request.query_params.get("id", "")
        try:
            at = (await request.json())["at"]
            if not isinstance(at, int) or isinstance(at, bool) or at < 0:
                raise TypeError("at must be a transition number, 0 or more")  # noqa: TRY301 - one answer for all
        except (ValueError, KeyError, TypeError) as exc:
            return _error(f"a re-run is {{at: N}}: {exc}", 400)
        try:
            run = await run_in_threadpool(lambda: agent.fork(run_id, at, store=store))
        except KeyError:
            return _error(f"no run {run_id!r} in this store", 404)
        except SnapshotError as exc:
            return _error(str(exc), 422)
        except (ValueError, IndexError, TypeError, FsmAgentError) as exc:
            return _error(f"run {run_id!r} cannot be re-run from transition {at}: {exc}", 409)
        threading.Thread(target=_drive, args=(run,), name=f"fsm_agent fork {run.run_id}", daemon=True).start()
        return JSONText({"run_id": run.run_id, "source": run_id, "at": at}, status_code=201)

    async def compared(request: Request) -> Response:
        pages = []
        for key in ("a", "b"):
            run_id = request.query_params.get(key, "")
            try:
                data = await run_in_threadpool(store.load, run_id)
                pages.append(await run_in_threadpool(digest, run_id, data, table))
            except KeyError:
                return _error(f"no run {run_id!r} in this store", 404)
            except SnapshotError as exc:
                return _error(str(exc), 422)
        return JSONText(compare(*pages))

    async def saved(request: Request) -> Response:
        from fsm_agent.persist.recording import export

        run_id = request.query_params.get("id", "")
        try:
            data = await run_in_threadpool(store.load, run_id)
            recording = await run_in_threadpool(export, cast("Store", store), run_id)
        except KeyError:
            return _error(f"no run {run_id!r} in this store", 404)
        except (SnapshotError, ValueError) as exc:  # corrupted, or a run stored before calls were kept
            return _error(f"run {run_id!r} cannot be saved as a test: {exc}", 422)
        name, body = zipped(run_id, data, recording, agent_spec)
        disposition = {"content-disposition": f'attachment; filename="{name}"'}
        return Response(body, media_type="application/zip", headers=disposition)

    return [
        Route("/api/fork", fork, methods=["POST"]),
        Route("/api/compare", compared),
        Route("/api/test", saved),
    ]
