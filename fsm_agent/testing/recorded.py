"""The doubles a replay runs with: a model that answers from a recording, tools that return its results, its outside.

``RecordedModel`` compares each request with the recorded one by its
canonical JSON and answers with the recorded reply while they match; the
first that differs is kept (``departure``) for the divergence's diff, and
is answered by the live model if there is one, else refused (the run stops
with ``model_error`` there).  ``RecordedTools`` returns each call's
recorded result by call id, tool name and arguments (compared as canonical
JSON) and is the agent's own registry in all else.  ``RecordedHolds`` is
the agent's ``approve=`` rule, asked as in any run and compared with what
the recording says of each call it asks about.  ``RecordedOutside`` is
what the recorded run met from outside the machine, met again where it met
it: its clock, its cancel token, and (``RecordedCuts``) the cuts of its task
with a call due; both live in ``drivers.recorded_outside``, where a fork's
rebuild meets them too, and are named here for the replay.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.exchanges import response_from
from fsm_agent.core.hand_down import canonical_arguments
from fsm_agent.drivers.fork_spend import counted_result
from fsm_agent.drivers.recorded_outside import RecordedOutside as Outside
from fsm_agent.drivers.recorded_outside import recorded_decisions
from fsm_agent.errors import ContextOverflowError
from fsm_agent.persist.recording import canonical
from fsm_agent.records import Message, ModelResponse, OutputSchema, ToolCall, child_outcome, plain
from fsm_agent.tools import JSONSchema, ToolResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from fsm_agent.drivers.model import Model


class _Departed(RuntimeError):
    """Raised by a ``RecordedModel`` for a request the recording does not hold: the run stops with model_error."""


class RecordedModelError(RuntimeError):
    """A model call the recording says raised (its text ``Type: message``), raised again: ``model_error`` again."""


def _recorded_error(text: str) -> Exception:
    """The recorded error raised again: a context overflow as one (its run compacts or stops on it), else as text."""
    kind, _, message = text.partition(": ")
    if kind == "ContextOverflowError":
        return ContextOverflowError(message)
    return RecordedModelError(text)


@attrs.define
class Departure:
    """The first model request that was not the recorded one: its index, the recorded request (None: past the end)."""

    call: int
    expected: dict[str, Any] | None
    actual: dict[str, Any]


class RecordedModel:
    """Answers each model call with the recorded reply while the request matches the recorded one.

    The first request that differs is kept as ``departure``; it and every
    later call go to the ``live`` model if there is one, else are refused.
    A recorded error is raised again (a context overflow as one).
    """

    def __init__(self, recording: dict[str, Any], output: OutputSchema | None, live: Model | None = None) -> None:
        self.recorded: list[dict[str, Any]] = recording["model_calls"]
        self.output = None if output is None else plain(output)
        self.live = live
        self.index = 0
        self.departure: Departure | None = None

    def _answer(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse | None:
        """The recorded reply if the request matches (a recorded error is raised again), else None."""
        index = self.index
        self.index += 1
        request = {"messages": [plain(m) for m in messages], "tools": tools, "output": self.output}
        actual = json.loads(canonical(request))
        if self.departure is None and index < len(self.recorded):
            recorded = self.recorded[index]
            if canonical(recorded["request"]) == canonical(actual):
                if recorded["reply"] is None:
                    raise _recorded_error(recorded["error"] or "the recorded model call gave no reply")
                return response_from(recorded["reply"])
            expected: dict[str, Any] | None = recorded["request"]
        else:
            expected = None
        if self.departure is None:
            self.departure = Departure(index, expected, actual)
        if self.live is None:
            held = len(self.recorded)
            msg = f"model call {index + 1} is not the recorded one (the recording holds {held} call(s))"
            raise _Departed(msg)
        return None

    def _live_keywords(self, output: OutputSchema | None) -> dict[str, Any]:
        return {} if output is None else {"output": output}

    def complete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> ModelResponse:
        """The recorded reply; past a divergence, the live model's."""
        answer = self._answer(messages, tools)
        if answer is not None:
            return answer
        assert self.live is not None  # _answer raised otherwise
        live: Any = self.live
        return live.complete(messages, tools, **self._live_keywords(output))  # type: ignore[no-any-return]

    async def acomplete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> ModelResponse:
        """``complete``, with a live model's ``acomplete`` awaited when it has one."""
        answer = self._answer(messages, tools)
        if answer is not None:
            return answer
        live: Any = self.live
        if hasattr(live, "acomplete"):
            return await live.acomplete(messages, tools, **self._live_keywords(output))  # type: ignore[no-any-return]
        return live.complete(messages, tools, **self._live_keywords(output))  # type: ignore[no-any-return]


class RecordedTools:
    """A registry whose calls return the recorded results; all else is the agent's own registry's.

    A call takes the recorded result of the call with its id, tool name and
    arguments (compared as canonical JSON: a provider's ids such as
    ``call_1`` repeat from run to run, so an id alone names no call).  A
    call the recording lacks goes to the agent's registry when ``live``
    (past a divergence), else fails with an error saying so.
    """

    def __init__(self, registry: Any, recording: dict[str, Any], live: bool) -> None:
        self.registry = registry
        self.results = {c["id"]: c for c in recording["tool_calls"]}
        self.live = live
        # Whether the replay counts each cut's share where the recorded run did (RecordedCuts): answers bring no cut.
        self.cuts_counted = "cut_shares" in recording

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)

    def _recorded(self, call: ToolCall) -> ToolResult | None:
        kept = self.results.get(call.id)
        if kept is None or kept["name"] != call.name:
            return None
        if canonical_arguments(kept["arguments"]) != canonical_arguments(call.arguments):
            return None  # the same id asked for something the recording does not hold
        result = kept["result"] if self.cuts_counted else counted_result(kept)  # or the cuts count it themselves
        return ToolResult(**{**result, "child": child_outcome(result.get("child"))})

    def execute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """The recorded result of ``call``."""
        found = self._recorded(call)
        if found is not None:
            return found
        if self.live:
            return self.registry.execute(call) if timeout is None else self.registry.execute(call, timeout=timeout)  # type: ignore[no-any-return]
        return _unrecorded(call)

    async def aexecute(self, call: ToolCall, timeout: float | None = None) -> ToolResult:
        """``execute``, awaited."""
        found = self._recorded(call)
        if found is not None:
            return found
        if self.live:
            if timeout is None:
                return await self.registry.aexecute(call)  # type: ignore[no-any-return]
            return await self.registry.aexecute(call, timeout=timeout)  # type: ignore[no-any-return]
        return _unrecorded(call)


def _unrecorded(call: ToolCall) -> ToolResult:
    why = f"tool call {call.id!r} ({call.name}) with these arguments is not in the recording"
    return ToolResult(why, why)


@attrs.define
class HoldDeparture:
    """The first call the replayed agent's ``approve=`` held otherwise than the recorded run did.

    ``recorded`` is what became of it there (None: it ran without waiting;
    True: a person approved it; False or a reason: a person rejected it),
    ``held`` whether the replayed agent holds it, and ``index`` the
    transition the replay stopped before (it pauses there, making no call).
    """

    call: ToolCall
    recorded: bool | str | None
    held: bool
    index: int | None = None

    def diff(self) -> str:
        """The recorded and the replayed approval of the call, as a unified diff."""
        what = f"approval of tool call {self.call.id!r} ({self.call.name})"
        if self.recorded is None:
            recorded = "not held: it ran without a person's decision"
        elif self.recorded is True:
            recorded = "held for a person's decision: approved"
        else:
            recorded = f"held for a person's decision: rejected ({self.recorded or 'no reason given'})"
        replayed = "held for a person's decision" if self.held else "not held: approve= lets it run undecided"
        return f"--- recorded {what}\n+++ replayed {what}\n-{recorded}\n+{replayed}"


class RecordedHolds:
    """A replayed agent's ``approve=`` rule, held to what the recording says of each call it is asked about.

    The rule decides, as in any run; a call whose hold the recording knows
    (``recorded_outside.recorded_decisions``: whether each call it ran waited, and
    every rejected call) and that the rule decides otherwise is kept as
    ``departure`` (the first such call) and held either way, so the replay
    pauses there and makes no call.  A call the recording says nothing of (one
    recorded before holds were kept) is the rule's alone.
    """

    def __init__(self, rule: Callable[[ToolCall], bool] | None, recording: dict[str, Any]) -> None:
        self.rule = rule
        self.recorded = recorded_decisions(recording)
        self.departure: HoldDeparture | None = None

    @property
    def needed(self) -> bool:
        """Whether a run can be held at all: the agent has a rule, or the recorded run held a call."""
        return self.rule is not None or any(decision is not None for _, decision in self.recorded.values())

    def __call__(self, call: ToolCall) -> bool:
        held = self.rule is not None and bool(self.rule(call))
        known = self.recorded.get(call.id)
        if known is None or known[0] != call.name:
            return held
        waited = known[1] is not None
        if waited != held and self.departure is None:
            self.departure = HoldDeparture(call, known[1], held)
        return held or waited


class RecordedOutside(Outside):
    """``drivers.recorded_outside.RecordedOutside``, with what a replay alone judges: a person's recorded decisions.

    ``holds`` is the replayed agent's ``approve=`` held to the recording
    (``RecordedHolds``) where the replay checks it, else None.
    """

    def __init__(self, recording: dict[str, Any], model: RecordedModel) -> None:
        super().__init__(recording, model)
        self.holds: RecordedHolds | None = None
