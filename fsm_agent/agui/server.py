"""The AG-UI run endpoint: ``POST /`` takes a ``RunAgentInput`` and answers with the turn's events as they happen.

Each request is one turn of the thread's ``Session`` (the thread id is the
session id, its conversation kept in the store), or, with ``resume``, the
continuation of its paused turn with the person's decisions.  The request's
``runId`` is stored with its turn, so the same request sent again (a proxy's
retry, a client that lost the answer) takes no second turn: it is answered
from the turn it took, with nothing called again.  The turn runs
in a task of its own and hands its events to the response through a queue,
so a client that goes away (the AG-UI client's ``abortRun``, a closed tab)
cancels it: the run records the call it was in as cut off, with reason
``cancelled``, and the thread's next turn is an ordinary new one.
"""

from __future__ import annotations

import asyncio
import inspect
import json
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from ag_ui.core import (
    PROTOCOL_VERSION,
    BaseEvent,
    RunAgentInput,
    RunErrorEvent,
    RunFinishedCancelledOutcome,
    RunFinishedEvent,
    RunStartedEvent,
)
from ag_ui.encoder import EventEncoder
from pydantic import ValidationError
from pydantic_core import PydanticSerializationError
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route
from starlette.types import Receive, Scope, Send

from fsm_agent import Agent, AgentLoopError, CancelToken, RunResult, Session, Usage
from fsm_agent.agui.protocol import decisions, finished, less, stopped, user_text
from fsm_agent.agui.relay import Relay
from fsm_agent.drivers.read_back import stored_result
from fsm_agent.drivers.stored import awaited, store_for
from fsm_agent.persist import SqliteStore

if TYPE_CHECKING:
    from fsm_agent.persist import Store, StoreTarget

AgentFactory = Callable[[RunAgentInput], Agent]
"""Builds the agent for one request, from the request (its ``context`` and ``forwardedProps`` are the app's to read)."""
DepsFactory = Callable[[RunAgentInput], Any]
"""Builds one request's deps (``RunContext.deps`` of its tools), from the request; may be ``async``."""
Push = Callable[[BaseEvent | None], None]

NOTHING_SPENT = Usage(cost=0.0)
"""What a turn had spent before it began: nothing, at a known cost, so the turn's own cost is sent where known."""
"""Hands an event to the response (None: the stream ends)."""


def app(
    agent_factory: AgentFactory, *, store: StoreTarget | None = None, deps_factory: DepsFactory | None = None
) -> AgUiApp:
    """The AG-UI endpoint as an ASGI app: serve it with any ASGI server (``uvicorn.run(app(make_agent))``).

    ``agent_factory(run_input)`` builds a fresh ``Agent`` (and fresh
    sub-agents) for each request.  ``store`` keeps the threads'
    conversations and their paused turns (a store, a SQLite path or a
    ``postgresql://`` URL); by default a SQLite database in memory, which
    lives as long as the app.  ``deps_factory(run_input)``, if given,
    builds the request's deps (a function or a coroutine function): the
    turn the request takes, or the paused turn it resumes, is given them
    (``Session.arun(..., deps=...)``), and its tools read them as
    ``ctx.deps``.  Without it a turn has none (``NoDepsError``).
    """
    return AgUiApp(agent_factory, store, deps_factory)


class AgUiApp:
    """The ASGI app ``app()`` returns; ``cancel(thread_id)`` stops a thread's turn from the server's side."""

    def __init__(
        self, agent_factory: AgentFactory, store: StoreTarget | None, deps_factory: DepsFactory | None = None
    ) -> None:
        if not callable(agent_factory):
            msg = f"agent_factory must be callable (run_input -> Agent), got {type(agent_factory).__name__}"
            raise TypeError(msg)
        if deps_factory is not None and not callable(deps_factory):
            msg = f"deps_factory must be callable (run_input -> deps) or None, got {type(deps_factory).__name__}"
            raise TypeError(msg)
        self.agent_factory = agent_factory
        self.deps_factory = deps_factory
        self.store: Store = store_for(store) or SqliteStore(":memory:")
        # The tokens of the requests going on now, by thread id: the turn's, and any other request's for the same
        # thread (refused while the turn is taken), so cancelling the thread reaches the turn whichever ends first.
        self._turns: dict[str, set[CancelToken]] = {}
        self._left: set[asyncio.Task[None]] = set()  # turns whose client went away, kept until they end
        self._encoder = EventEncoder()
        self._app = Starlette(routes=[Route("/", self._endpoint, methods=["POST"])])

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        await self._app(scope, receive, send)

    def cancel(self, thread_id: str, why: str = "") -> bool:
        """Cancel the turn thread ``thread_id`` is taking (from any thread); False if it is taking none.

        The run stops at its next check (a call in flight finishes first, as
        with any ``CancelToken``) and the stream ends with ``RUN_FINISHED``
        whose outcome is ``cancelled``.
        """
        tokens = self._turns.get(thread_id)
        if not tokens:
            return False
        for token in list(tokens):
            token.cancel(why or "cancelled by the application")
        return True

    async def _endpoint(self, request: Request) -> Response:
        try:
            run_input = RunAgentInput.model_validate(await request.json())
        except ValueError as exc:  # not JSON, or JSON that is no RunAgentInput (pydantic's error is a ValueError)
            what = "is not JSON" if not isinstance(exc, ValidationError) else f"is not an AG-UI RunAgentInput: {exc}"
            return JSONResponse({"error": f"the request body {what}"}, status_code=422)
        empty = [name for name, value in (("threadId", run_input.thread_id), ("runId", run_input.run_id)) if not value]
        if empty:  # as malformed as a missing one: the thread is the conversation, the run the request's own turn
            said = f"{' and '.join(empty)} must not be empty: threadId names the conversation, runId this request"
            return JSONResponse({"error": f"the request body's {said}"}, status_code=422)
        headers = {"cache-control": "no-cache"}
        return StreamingResponse(self._stream(run_input), media_type=self._encoder.get_content_type(), headers=headers)

    async def _stream(self, run_input: RunAgentInput) -> AsyncIterator[str]:
        """The turn's events as server-sent events; if the client leaves first, the turn is cancelled."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue[BaseEvent | None] = asyncio.Queue()

        def push(event: BaseEvent | None) -> None:
            # A model may hand its streamed text on from a thread of its own; the queue belongs to the loop.
            loop.call_soon_threadsafe(queue.put_nowait, event)

        token = CancelToken()
        thread = run_input.thread_id
        self._turns.setdefault(thread, set()).add(token)
        turn = loop.create_task(self._turn(run_input, push, token))
        try:
            while (event := await queue.get()) is not None:
                yield self._sse(event)
        finally:
            going = self._turns.get(thread, set())
            going.discard(token)
            if not going:
                self._turns.pop(thread, None)
            if not turn.done():  # the client went away: nobody reads on, so the run stops now
                token.cancel("the client closed the stream")
                turn.cancel()
                self._left.add(turn)
                turn.add_done_callback(self._left.discard)

    def _sse(self, event: BaseEvent) -> str:
        """The event as a server-sent event; a lone surrogate in its text (half an emoji, which models send) as its
        JSON escape, which UTF-8 cannot carry raw, so the event is sent, not dropped with the rest of the stream."""
        try:
            return self._encoder.encode(event)
        except PydanticSerializationError:
            return f"data: {json.dumps(event.model_dump(mode='json', by_alias=True), separators=(',', ':'))}\n\n"

    async def _turn(self, run_input: RunAgentInput, push: Push, token: CancelToken) -> None:
        """Take the turn (or resume the paused one), pushing its events; always ends with its terminal event."""
        thread, run_id = run_input.thread_id, run_input.run_id
        relay = Relay(run_id, push)
        push(RunStartedEvent(thread_id=thread, run_id=run_id, protocol_version=PROTOCOL_VERSION))
        agent: Agent | None = None
        before = NOTHING_SPENT
        try:
            # Read first: a request the agent cannot take (an image part) is refused before anything is built.
            text = "" if run_input.resume else user_text(run_input)
            agent = self._agent_for(run_input)
            relay.watch(agent)
            deps = await self._deps_for(run_input)
            session = await Session.aopen(agent, self.store, thread)
            if run_input.resume:
                approvals = decisions(run_input.resume)
                before = await self._paused_usage(session, agent)
                result = await session.aresume(approvals, cancel=token, deps=deps)
            else:
                # The runId is kept with the turn: the same request again is answered from it (Session.run).
                result = await session.arun(text, cancel=token, request_id=run_id, deps=deps)
            ending = finished(thread, run_id, result, less(result.usage, before), _policy(agent, result))
        except AgentLoopError as stop:
            relay.close()
            push(stopped(thread, run_id, stop, less(stop.result.usage, before)))
        except asyncio.CancelledError:  # the client left: the run recorded its stop; the ending reaches nobody
            relay.close()
            push(RunFinishedEvent(thread_id=thread, run_id=run_id, outcome=RunFinishedCancelledOutcome()))
        except Exception as exc:  # noqa: BLE001 - any failure to serve the request ends the stream as RUN_ERROR
            relay.close()
            push(RunErrorEvent(message=str(exc) or type(exc).__name__, code=type(exc).__name__))
        else:
            relay.close()
            push(ending)
        finally:
            push(None)

    def _agent_for(self, run_input: RunAgentInput) -> Agent:
        """The request's agent, from ``agent_factory``; a ``TypeError`` if it returned something else."""
        agent = self.agent_factory(run_input)
        if not isinstance(agent, Agent):
            msg = f"agent_factory must return an Agent, got {type(agent).__name__}"
            raise TypeError(msg)
        return agent

    async def _deps_for(self, run_input: RunAgentInput) -> Any:
        """The request's deps, from ``deps_factory`` (awaited if it returned an awaitable); None without one."""
        if self.deps_factory is None:
            return None
        deps = self.deps_factory(run_input)
        return await deps if inspect.isawaitable(deps) else deps

    async def _paused_usage(self, session: Session, agent: Agent) -> Usage:
        """What the thread's paused turn had spent, so the resumed run reports only its own calls."""
        if session.turns == 0:
            return NOTHING_SPENT
        data = await awaited(self.store, "load", session.turn_id(session.turns))
        return stored_result(agent, data).usage if data.get("paused") else NOTHING_SPENT


def _policy(agent: Agent | None, result: RunResult) -> str | None:
    """The ``on_stop`` policy a stopped run returned under (None for a run that did not stop)."""
    if agent is None or result.ok or result.reason == "paused":
        return None
    return str(agent.on_stop.get(result.reason, "raise"))
