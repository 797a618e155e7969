r"""The agent: a model, its tools and the limits that bound every run.

Its runs are ``AgentRun``\ s (``drivers.agent_run``: both drivers over one
stepper); ``Agent.start``, ``run``, ``arun``, ``stream`` and ``astream``
begin new ones here, and ``resume`` and ``fork`` (``drivers.agent_again``)
runs that begin where another was.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import AsyncGenerator, Callable, Collection, Generator, Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.history import History, opening
from fsm_agent.core.output import Validator
from fsm_agent.core.pricing import Price
from fsm_agent.core.settings import AgentSettings
from fsm_agent.definition.guards import Guard
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import Policy, Reason, State
from fsm_agent.definition.stops import StopCondition
from fsm_agent.definition.table import (
    Row,
)
from fsm_agent.drivers.agent_again import RunsAgain
from fsm_agent.drivers.agent_run import AgentRun as AgentRun  # also importable from here, as before
from fsm_agent.drivers.checks import NO_PARTS, Parts, agent_settings, check_sync_model, model_of, registry_of
from fsm_agent.drivers.child import OnChildStop, as_tool
from fsm_agent.drivers.model import Clock, Model
from fsm_agent.drivers.stored import astore_for, store_for
from fsm_agent.drivers.streaming import StreamEvent
from fsm_agent.drivers.watched import Observer
from fsm_agent.observe.events import Hooks, log_observers
from fsm_agent.records import Message, RunResult, ToolCall
from fsm_agent.tools import ToolRegistry

if TYPE_CHECKING:
    from fsm_agent.persist import StoreTarget


class Agent(RunsAgain):
    """A model, its tools and the limits that bound every run; serves any number of runs.

    An agent holds no per-run state, so one agent can run many conversations,
    also from several threads or tasks at once (the model and tools must then
    be thread-safe themselves).  Invalid limits, stop conditions or policies
    raise ``ValueError`` here, never in the middle of a run.

    ``output_type`` (a pydantic model, a dataclass, a ``TypedDict``, a JSON
    Schema dict, or ``str``) makes the final answer typed: it is checked at
    ``Dispatch``, then each of ``output_validators`` (``fn(output)``, sync or
    async) may change it or raise ``fsm_agent.Retry("why")``.  An answer not
    accepted goes back to the model with the errors, at most
    ``output_retries`` times in a run, and then stops the run with
    ``output_invalid``; ``RunResult.output`` holds the accepted value.  A
    model whose ``complete`` takes an ``output`` keyword is given the
    ``OutputSchema`` with every call (the adapters ask their provider for it).

    ``history_processors`` (``fn(messages) -> messages``, sync or async) run
    on a copy before every model call, in order; the run's recorded history
    does not change.  A model call that overflows the context window stops
    the run with ``context_overflow``; with ``on_stop={"context_overflow":
    "compact"}``, ``compact(messages)`` makes a shorter history instead (the
    edge ``AwaitModel->AwaitModel[compacts_history]``) and the call is made
    once more.

    ``prices`` (a ``Price``, or model names to ``Price``; else ``genai-prices``)
    prices each model call in US dollars; ``cost_budget`` needs a known price.

    What the agent derives from these arguments is one frozen record,
    ``agent.settings`` (an ``AgentSettings``), handed whole to each run;
    ``limits``, ``table``, ``on_stop``, ``stop_conditions`` and ``output``
    read it.
    """

    def __init__(
        self,
        model: Model | str,
        registry: ToolRegistry | Iterable[Callable[..., Any]],
        system: str = "",
        max_steps: int = 8,
        max_consecutive_failures: int = 3,
        *,
        timeout: float | None = None,
        token_budget: int | None = None,
        max_tool_calls: int | Mapping[str, int] | None = None,
        cycle_window: int = 6,
        clock: Clock = time.monotonic,
        stop_conditions: Iterable[StopCondition] = (),
        on_stop: Mapping[Reason, Policy] | None = None,
        strict_hooks: bool = False,
        max_concurrency: int | None = None,
        approve: Collection[str] | Callable[[ToolCall], bool] | None = None,
        tool_timeout: float | None = None,
        limits: Limits | None = None,
        output_type: Any = None,
        output_retries: int = 1,
        output_validators: Iterable[Validator] = (),
        history_processors: Iterable[Callable[[list[Message]], Any]] = (),
        compact: Callable[[list[Message]], Any] | None = None,
        cost_budget: float | None = None,
        prices: Price | Mapping[str, Price] | None = None,
    ) -> None:
        model, registry = model_of(model), registry_of(registry)
        self.settings: AgentSettings = agent_settings(
            model=model, registry=registry, system=system, clock=clock, strict_hooks=strict_hooks,
            max_concurrency=max_concurrency, tool_timeout=tool_timeout, limits=limits, max_steps=max_steps,
            max_consecutive_failures=max_consecutive_failures, timeout=timeout, token_budget=token_budget,
            max_tool_calls=max_tool_calls, cycle_window=cycle_window, output_type=output_type,
            output_validators=output_validators, output_retries=output_retries, approve=approve,
            stop_conditions=stop_conditions, on_stop=on_stop, history_processors=history_processors, compact=compact,
            cost_budget=cost_budget, prices=prices,
        )  # fmt: skip
        self.model = model
        self.registry = registry
        self.hooks = Hooks()
        self.run_parts: Parts = NO_PARTS
        self._fresh_rows: dict[tuple[bool, tuple[Guard, ...]], Mapping[tuple[State, str], tuple[Row, ...]]] = {}

    def as_tool(
        self, name: str, description: str, *, on_child_stop: OnChildStop = "error", deps: Any = None
    ) -> Callable[[str], Any]:
        """This agent as a tool for another agent: ``registry.register(agent.as_tool("research", "..."))``.

        The model fills one argument, ``input``; the child run is bounded by
        its parent and stored beside it (see ``fsm_agent.drivers.child_runs``).  A
        child that stops is a tool error, or with ``on_child_stop="raise"``
        stops the parent with ``child_stopped``.  Its runs get the parent run's ``deps``, or ``deps`` if given.
        """
        return as_tool(self, name, description, on_child_stop, deps)

    def start(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> AgentRun:
        """Begin a run in ``AwaitModel`` without calling anything yet; drive it with ``advance()`` or ``aadvance()``.

        With a ``store``, the run is stored under ``run_id`` (a fresh id by
        default) and leased to this run object until it finishes or pauses;
        each transition the store asks for appends to its journal.  An id
        already in the store is a ``RunExistsError`` unless ``overwrite=True``
        (and a ``RunLeasedError`` if another owner is advancing that run); an
        empty id is a ``ValueError``.  ``history`` (an earlier ``RunResult`` or
        messages) continues that conversation; see ``fsm_agent.core.history``.
        ``deps`` (a database, a client, ...) reach its code as ``RunContext.deps``, never stored or sent.
        """
        run = self._begin(user_input, cancel, observers, store, run_id, history, deps=deps)
        run._open_store(new=True, overwrite=overwrite)  # noqa: SLF001 - the agent opens its own runs' stores
        return run

    async def astart(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        observers: Sequence[Observer] = (),
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> AgentRun:
        """``start``, awaited: with a ``store``, the new run is written and leased without blocking the event loop.

        Drive the run it returns with ``afinish()`` or ``aadvance()``.
        """
        opened = await astore_for(store)  # a path opened for the first time is opened in a thread
        run = self._begin(user_input, cancel, observers, opened, run_id, history, deps=deps)
        await run._aopen_store(new=True, overwrite=overwrite)  # noqa: SLF001 - the agent opens its own runs' stores
        return run

    def _begin(
        self,
        user_input: str,
        cancel: CancelToken | None,
        observers: Sequence[Observer],
        store: StoreTarget | None,
        run_id: str | None,
        history: History | None = None,
        session: str | None = None,
        *,
        limits: Limits | None = None,
        parent: Mapping[str, str] | None = None,
        deps: Any = None,
        request: str | None = None,
        start_id: str | None = None,
    ) -> AgentRun:
        """A new run object, its store not written yet (``start`` writes it, ``arun`` awaits that).

        ``session`` names the conversation the run is a turn of (``fsm_agent.Session``), stored with it,
        and ``request`` the request that takes the turn (``Session.run``'s ``request_id``), stored too;
        ``parent`` links the run to the tool call it answers (``as_tool``: ``core.child_ids.LINK``); the
        parent's remaining ``limits`` are given as ``limits``, and the start it is (``child_runs``) as ``start_id``.
        """
        if not isinstance(user_input, str):
            msg = f"user_input must be a str, got {type(user_input).__name__}"
            raise TypeError(msg)
        if cancel is not None and not isinstance(cancel, CancelToken):
            msg = f"cancel must be a CancelToken, got {type(cancel).__name__}"
            raise TypeError(msg)
        settings = self.settings
        if history is None and not settings.system:  # opening(), for most runs: the input alone
            messages, prior = [Message("user", user_input)], 0
        else:  # checked before anything is written or called
            messages, prior = opening(settings.system, user_input, history)
        limits = limits or settings.limits
        position = Run(limits, messages, table=settings.table, policies=settings.on_stop, prior=prior)
        # None: the run makes its own id when first asked for one.
        if run_id is not None:
            from fsm_agent.persist.store import check_run_id

            run_id = check_run_id(run_id)
        return AgentRun(
            self,
            position,
            cancel=cancel,
            observers=observers,
            store=store_for(store),
            run_id=run_id,
            start_id=start_id,
            session=session,
            parent=parent,
            deps=deps,
            request=request,
        )

    def run(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        log: str | Path | None = None,
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Run to the end: the result on ``Done``; on a stop, what its ``on_stop`` policy says.

        ``log`` appends every transition to a JSON Lines file (see ``JsonlLog``);
        ``store`` checkpoints the run (see ``start`` for ``run_id``, ``overwrite``,
        ``deps``, and ``history`` to continue a conversation).  A run paused
        for approval returns a result with ``reason == "paused"`` and a snapshot.
        A model with ``acomplete`` alone is a ``TypeError`` here, before anything is stored: ``arun`` awaits it.
        """
        check_sync_model(self.model, "run", "await agent.arun(...)")
        if log is None:  # no log to close: skip the context manager, which costs as much as a transition
            # start(), without its keywords
            run = self._begin(user_input, cancel, (), store, run_id, history, deps=deps)
            if store is not None:  # only a stored run has a store to open
                run._open_store(new=True, overwrite=overwrite)  # noqa: SLF001 - the agent opens its own runs' stores
            return run.finish()
        with log_observers(log) as observers:
            run = self._begin(user_input, cancel, observers, store, run_id, history, deps=deps)
            run._open_store(new=True, overwrite=overwrite)  # noqa: SLF001 - the agent opens its own runs' stores
            return run.finish()

    async def arun(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        log: str | Path | None = None,
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> RunResult:
        """Await a run to the end, like ``run``; a turn's tool calls run concurrently, and checkpoints are awaited."""
        opened = await astore_for(store)  # a path opened for the first time is opened in a thread
        with log_observers(log) as observers:
            run = self._begin(user_input, cancel, observers, opened, run_id, history, deps=deps)
            await run._aopen_store(new=True, overwrite=overwrite)  # noqa: SLF001 - the agent opens its own runs' stores
            return await run.afinish()

    def stream(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> Generator[StreamEvent, None, None]:
        """Yield one ``TransitionEvent`` per transition; on a stop, raise like ``run`` after yielding it.

        A model that can stream (``complete_stream``) is called that way, and
        its reply's text arrives as ``TextDelta`` events before the
        transition that takes the reply in.  ``store``, ``run_id`` and
        ``overwrite`` are ``start``'s: the run is written when the first
        event is asked for.
        """
        check_sync_model(self.model, "stream", "agent.astream(...)", "complete_stream")  # before the store is written
        run = self.start(
            user_input, cancel=cancel, store=store, run_id=run_id, overwrite=overwrite, history=history, deps=deps
        )
        yield from run.stream()

    async def astream(
        self,
        user_input: str,
        *,
        cancel: CancelToken | None = None,
        store: StoreTarget | None = None,
        run_id: str | None = None,
        overwrite: bool = False,
        history: History | None = None,
        deps: Any = None,
    ) -> AsyncGenerator[StreamEvent, None]:
        """The async twin of ``stream`` (a model streams through ``acomplete_stream``); a store is written awaited."""
        run = await self.astart(
            user_input, cancel=cancel, store=store, run_id=run_id, overwrite=overwrite, history=history, deps=deps
        )
        # Closed with this generator (a reader that stops reading), as ``yield from`` closes the sync one's.
        async with contextlib.aclosing(run.astream()) as events:
            async for event in events:
                yield event
