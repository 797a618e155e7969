"""The driver: it does the I/O (model calls, tool calls) between triggers and lets the machine decide.

Each ``advance()`` performs at most one model or tool call and fires exactly
one trigger, so a run can be walked transition by transition.  ``finish()``
advances until ``Done`` or ``Failed`` and turns a stop into
``AgentLoopError``; ``Agent.run`` and the module-level ``run`` are that.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from fsm_agent.errors import AgentLoopError, RunStateError
from fsm_agent.guards import evidence_for
from fsm_agent.limits import Limits
from fsm_agent.machine import TableMachine, machine_for
from fsm_agent.records import Message, ModelResponse, RunResult, Step, Transition, Usage
from fsm_agent.run import MessagesView, Run, signature
from fsm_agent.states import TERMINAL, State
from fsm_agent.table import CHECK, DISPATCH, MODEL_FAILED, REPLIED, TABLE, TOOL_DONE, Table
from fsm_agent.tools import JSONSchema, ToolRegistry


@runtime_checkable
class Model(Protocol):
    """Anything with ``complete(messages, tools) -> ModelResponse``.

    ``messages`` is a read-only live view of the conversation so far and
    ``tools`` is ``ToolRegistry.schemas()``.  Raising any ``Exception`` ends
    the run with reason ``model_error`` and the exception as ``__cause__``.
    """

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Return the model's next message."""
        ...


class AgentRun(Run):
    """One run of an agent, driven by ``advance()`` (one transition) or ``finish()`` (to the end)."""

    def __init__(self, agent: Agent, messages: list[Message]) -> None:
        super().__init__(agent.limits, messages)
        self._machine: TableMachine = agent.machine
        self._model = agent.model
        self._registry = agent.registry
        self._result: RunResult | None = None

    @property
    def done(self) -> bool:
        """True once the run is in ``Done`` or ``Failed``."""
        return self.state in TERMINAL

    @property
    def result(self) -> RunResult:
        """The run's result; only available once the run is in ``Done`` or ``Failed``."""
        if self._result is None:
            msg = f"the run is in {self.state}, not finished; advance() it to Done or Failed first"
            raise RunStateError(msg)
        return self._result

    def advance(self) -> Transition:
        """Do this state's I/O, if any, fire exactly one transition and return the edge taken."""
        handler = _HANDLERS.get(self.state)
        if handler is None:
            msg = f"the run already finished in {self.state} (reason {self.reason!r}); start a new run"
            raise RunStateError(msg)
        handler(self)
        if self.state in TERMINAL:
            self._conclude()
        return self.trace[-1]

    def finish(self) -> RunResult:
        """Advance to the end; return the result, or raise ``AgentLoopError`` if the run stopped."""
        while self._result is None:
            self.advance()
        if self.state is State.Failed:
            raise AgentLoopError(self._result.reason, self._result) from self.model_exception
        return self._result

    def _await_model(self) -> None:
        try:
            response = self._model.complete(MessagesView(self.messages), self._registry.schemas())
            if not isinstance(response, ModelResponse):
                msg = f"model returned {type(response).__name__}, expected ModelResponse"
                raise TypeError(msg)  # noqa: TRY301 - handled below like any other model failure
        except Exception as exc:  # noqa: BLE001 - any model failure is a model_error stop
            self.turns += 1
            self.model_exception = exc
            self._machine.fire(self, MODEL_FAILED)
            return
        self.turns += 1
        self.messages.append(response.message)
        self.last_response = response
        self.pending.extend(response.message.tool_calls)
        if response.usage is not None:
            self.input_tokens += response.usage.input_tokens
            self.output_tokens += response.usage.output_tokens
        self._machine.fire(self, REPLIED)

    def _check(self) -> None:
        self._machine.fire(self, CHECK)

    def _dispatch(self) -> None:
        self._machine.fire(self, DISPATCH)

    def _execute_tool(self) -> None:
        call = self.pending[0]
        outcome = self._registry.execute(call)
        self.pending.popleft()
        self.messages.append(Message("tool", outcome.content, tool_call_id=call.id))
        arguments = json.dumps(call.arguments, ensure_ascii=False, default=repr)
        self.steps.append(Step(self.turns - 1, "tool_call", f"{call.name}({arguments}) -> {outcome.content}"))
        if outcome.error is None:
            self.failures = 0
        else:
            self.failures += 1
            self.last_error = outcome.error
        self.last_signature = signature(call)
        self._machine.fire(self, TOOL_DONE)

    def _conclude(self) -> None:
        last = self.trace[-1]
        if self.state is State.Done:
            self.reason = "done"
            self.final = self.last_response.message.content if self.last_response is not None else ""
            self.steps.append(Step(self.turns - 1, "final", self.final))
        else:
            self.reason = last.reason or "unknown"
            if self.reason in ("max_tokens", "refusal") and self.last_response is not None:
                # The cut-off (or refusing) text is kept so the caller can see what the model said.
                self.final = self.last_response.message.content
            self.evidence = evidence_for(self, self.reason)
        self._result = RunResult(
            messages=self.messages,
            steps=self.steps,
            final=self.final,
            reason=self.reason,
            trace=self.trace,
            evidence=self.evidence,
            usage=Usage(self.input_tokens, self.output_tokens),
            pending=self.pending,
        )


_HANDLERS: dict[State, Callable[[AgentRun], None]] = {
    State.AwaitModel: AgentRun._await_model,  # noqa: SLF001 - dispatch table of the class's own steps
    State.CheckTruncation: AgentRun._check,  # noqa: SLF001
    State.Dispatch: AgentRun._dispatch,  # noqa: SLF001
    State.ExecuteTool: AgentRun._execute_tool,  # noqa: SLF001
}


class Agent:
    """A model, its tools and the limits that bound every run; serves any number of runs.

    An agent holds no per-run state, so one agent can run many conversations,
    also from several threads at once (the model and tools must then be
    thread-safe themselves).  Invalid limits raise ``ValueError`` here, never
    in the middle of a run.
    """

    def __init__(
        self,
        model: Model,
        registry: ToolRegistry,
        system: str = "",
        max_steps: int = 8,
        max_consecutive_failures: int = 3,
    ) -> None:
        if not callable(getattr(model, "complete", None)):
            msg = f"model must have a complete(messages, tools) method, got {type(model).__name__}"
            raise TypeError(msg)
        if not isinstance(registry, ToolRegistry):
            msg = f"registry must be a ToolRegistry, got {type(registry).__name__}"
            raise TypeError(msg)
        if not isinstance(system, str):
            msg = f"system must be a str, got {type(system).__name__}"
            raise TypeError(msg)
        self.model = model
        self.registry = registry
        self.system = system
        self.limits = Limits(max_steps=max_steps, max_consecutive_failures=max_consecutive_failures)
        self.table: Table = TABLE
        self.machine = machine_for(self.table)

    def start(self, user_input: str) -> AgentRun:
        """Begin a run in ``AwaitModel`` without calling anything yet; drive it with ``advance()``."""
        if not isinstance(user_input, str):
            msg = f"user_input must be a str, got {type(user_input).__name__}"
            raise TypeError(msg)
        messages = [Message("system", self.system)] if self.system else []
        messages.append(Message("user", user_input))
        return AgentRun(self, messages)

    def run(self, user_input: str) -> RunResult:
        """Run to the end: the result on ``Done``, ``AgentLoopError`` on every stop."""
        return self.start(user_input).finish()


def run(
    model: Model,
    registry: ToolRegistry,
    user_input: str,
    system: str = "",
    max_steps: int = 8,
    max_consecutive_failures: int = 3,
) -> RunResult:
    """Run one conversation to the end with a throwaway ``Agent``; raises ``AgentLoopError`` on every stop."""
    agent = Agent(model, registry, system, max_steps=max_steps, max_consecutive_failures=max_consecutive_failures)
    return agent.run(user_input)
