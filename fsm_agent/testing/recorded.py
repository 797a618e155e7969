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
with a call due.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.exchanges import response_from
from fsm_agent.core.ledger import canonical_arguments
from fsm_agent.definition.states import AwaitModel
from fsm_agent.definition.table import INTERRUPTED
from fsm_agent.drivers.rebuild import recorded_decisions
from fsm_agent.errors import ContextOverflowError
from fsm_agent.persist.recording import canonical
from fsm_agent.records import Message, ModelResponse, OutputSchema, ToolCall, Transition, child_outcome, plain
from fsm_agent.tools import JSONSchema, ToolResult

if TYPE_CHECKING:
    from collections.abc import Callable

    from fsm_agent.drivers.agent_run import AgentRun
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

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)

    def _recorded(self, call: ToolCall) -> ToolResult | None:
        kept = self.results.get(call.id)
        if kept is None or kept["name"] != call.name:
            return None
        if canonical_arguments(kept["arguments"]) != canonical_arguments(call.arguments):
            return None  # the same id asked for something the recording does not hold
        result = kept["result"]
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
    (``rebuild.recorded_decisions``: whether each call it ran waited, and
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


class RecordedCuts:
    """Where the recorded run was cut with a call due: its ``interrupted`` edges, each taken again in the replay.

    Why a replay needs them: its calls come back at once and nobody cancels
    its task, so the call the recorded run's task was cancelled in would be
    made and the replay depart there.  At a cut the replay makes no call:
    a model call in flight counted as a turn (it may be billed) and left no
    reply, so the recording's next model call is of a later turn (one cut
    before it started left the turn uncounted); a tool batch's leading calls
    that came back before the cut are kept by its stop, so the replay takes
    their outcomes first (as many as the resume did not make again; the
    recording's last stop names its cut calls, ``unfinished``).
    """

    def __init__(self, recording: dict[str, Any], model: RecordedModel) -> None:
        self.model = model  # a replay whose request departed is a new run past there (re-recording): never cut
        self.trace: list[dict[str, Any]] = recording["trace"]
        self.at = [i for i, entry in enumerate(self.trace) if entry["trigger"] == "interrupted"]
        self.turns = [call.get("turn") for call in recording["model_calls"]]
        self.last = (len(self.trace) - 1, recording.get("unfinished"))

    def ahead(self, run: AgentRun) -> bool:
        """Whether ``run`` has transitions to take, one at a time, before its next cut (else ``finish()`` it)."""
        index = len(run.trace)
        return index < next((at for at in self.at if at >= index), -1) and not run.done and not run.paused

    def take(self, run: AgentRun) -> None:
        """Cut ``run`` as the recorded run was if it is about to take a recorded cut, the calls that came back first."""
        back = self._due(run)
        if back is not None:
            for call in back:
                run.stepper.accept_tool(call, run._registry.execute(call))  # noqa: SLF001 - the call the driver made
            self._cut(run)

    async def atake(self, run: AgentRun) -> None:
        """``take``, the calls that came back first awaited."""
        back = self._due(run)
        if back is not None:
            for call in back:
                run.stepper.accept_tool(call, await run._registry.aexecute(call))  # noqa: SLF001 - as in take
            self._cut(run)

    def _due(self, run: AgentRun) -> list[ToolCall] | None:
        """None if ``run`` is not about to take a recorded cut; else the calls of its batch that came back before it."""
        index, position = len(run.trace), run.position
        if index not in self.at or run.done or run.paused or position.at.state != self.trace[index]["source"]:
            return None
        if self.model.departure is not None or list(run.trace) != [Transition(**e) for e in self.trace[:index]]:
            return None  # departed before (re-recording goes on live): the recorded cut is not this run's
        if position.at.state is AwaitModel:
            return []
        pending = list(position.calls.pending)
        if index == self.last[0]:  # its stop named the calls it cut, those before the first came back (none: none)
            cut = set(str(self.last[1]).split(", ")) if self.last[1] is not None else {c.id for c in pending}
            return pending[: next((n for n, call in enumerate(pending) if call.id in cut), len(pending))]
        made = 0  # the calls of the batch the resume made (or took in) one transition each, up to the turn's end
        for entry in self.trace[index + 1 :]:
            if entry["source"] == "ExecuteTool":
                made += 1
                if entry["dest"] != "Dispatch":
                    break
        return pending[: max(len(pending) - made, 0)]

    def _cut(self, run: AgentRun) -> None:
        """The driver's stop for the call its task's cancel cut: the stepper takes the ``interrupted`` edge."""
        index, position = len(run.trace), run.position
        if index == self.last[0]:  # the recording ends on this stop: it names what it cut (none: cut before a call)
            named = str(self.last[1] or "")
        elif position.at.state is AwaitModel:
            turn = position.counts.turns + 1
            made = turn not in self.turns and any(isinstance(t, int) and t > turn for t in self.turns)
            named = f"model call of turn {turn}" if made else ""
        else:
            ran = position.calls.ran
            named = ", ".join(call.id for call in position.calls.pending if call.id not in ran)
        run._interrupt(INTERRUPTED, named or None)  # noqa: SLF001 - the driver's own stop, as it took it


_AFTER_CALL = ("tool_done", "finalize")
"""The triggers of a stop from ``ExecuteTool`` that the recorded run saw once the call it closes had come back."""


class RecordedOutside:
    """What the recorded run met from outside the machine, met again by its replay just before the same transitions.

    A replay's calls come back at once, so its clock would never reach a
    recorded deadline, nor would anybody cancel its token.  ``clock`` stands
    still but for passing the run's ``timeout`` at each transition where the
    recorded run stopped on it (or finalized on it), and ``token()`` (a
    recording that stopped with ``cancelled`` only) is cancelled at each where
    it stopped with ``cancelled``.  "Just before" that transition: once the
    call it closes came back, for a stop after a tool call; at once for any
    other, so a stop before a call (``expired``) is taken without making it.
    The transition comes next when the run being replayed (``run``) holds as
    many transitions as its index.  ``cuts`` are where its task was cancelled
    with a call due (``interrupted`` edges, see ``RecordedCuts``).
    """

    def __init__(self, recording: dict[str, Any], model: RecordedModel) -> None:
        trace = recording["trace"]
        self.cuts = RecordedCuts(recording, model)
        self.stops: dict[int, tuple[str, bool]] = {}  # index: (reason, whether the call before it must be back)
        for index, entry in enumerate(trace):
            dest, trigger, reason = entry["dest"], entry["trigger"], entry.get("reason")
            if trigger == "finalize" and entry.get("guard") == "finalize_on_timeout":
                reason = "timeout"
            elif dest != "Failed" or trigger == "interrupted":
                continue
            if reason in ("timeout", "cancelled"):
                self.stops[index] = (reason, entry["source"] == "ExecuteTool" and trigger in _AFTER_CALL)
        self.run: AgentRun | None = None
        self.holds: RecordedHolds | None = None  # a person's decisions: the agent's approve= against the recorded
        self.now = 0.0
        self._met: set[int] = set()
        self._token: CancelToken | None = None

    def token(self) -> CancelToken | None:
        """A fresh cancel token for the next run of the replay (a resumed one too); None if no cancel was recorded."""
        if not any(reason == "cancelled" for reason, _ in self.stops.values()):
            return None
        self._token = CancelToken()
        return self._token

    def clock(self) -> float:
        """The replay's time, in seconds since it started: still, but past the deadline where the recorded run was."""
        run = self.run
        if run is None:
            return self.now
        index = len(run.trace)
        stop = self.stops.get(index)
        if stop is None or index in self._met:
            return self.now
        reason, after_call = stop
        if after_call:
            pending, ran = run.position.calls.pending, run.position.calls.ran
            if not pending or pending[0].id not in ran:
                return self.now  # the tool call this transition closes has not come back yet
        self._met.add(index)
        if reason == "timeout":
            timeout = run.limits.timeout
            if timeout is not None:
                self.now = max(self.now, timeout)
        elif self._token is not None:
            self._token.cancel("the recorded run was cancelled here")
        return self.now
