"""Replay a recorded run against an agent: a model that answers from the recording, tools that return its results.

``replay(agent, recording)`` starts the recorded question on a copy of the
agent whose model is a ``RecordedModel`` and whose tools are the recorded
results (a sub-agent's call too: its recorded outcome comes back, its run is
not made again).  Each model request is compared with the recorded one by
its canonical JSON; a request that differs is answered by nobody, so the run
stops there with ``model_error``.  Then the trace is compared transition by
transition, and the first that differs raises ``ReplayDivergence``, with
the two requests' diff when a request differed and the two limits' when
they differ.  With ``strict=False`` the run goes on past a divergence with a
live ``model=`` (and the live tools for calls the recording lacks), and
the new recording is returned instead.  A run that paused for a person's
decision is decided as the recorded run was (approved where the call's
result was recorded, else rejected with the recorded reason).

The replay runs under the agent's own limits, since they are part of the
agent under test: a changed limit departs where it first acts.  A run that
was stopped by a limit and resumed under a lifted one (``Agent.resume``)
kept the limits before each resume (``earlier_limits``); the replay that
stops where the recorded run stopped is resumed there as it was: the
limits that resume changed are set as it set them, the rest stay the
agent's.  So an unchanged agent replays past the resume (``strict=False``
too, up to the divergence), and the limits a divergence is diffed against
are those the recorded run ran under at that transition.  A recording from
before those limits were kept departs at its resume edge.  (A fork, which continues the recorded
run rather than tests an agent, rebuilds under the recorded limits.)

A request that departs is a divergence at the transition of its model call,
even where the recorded call failed too and the run ends on the very edge
the recording holds.  The replay's clock stands still, and its cancel token
is never cancelled, except where the recorded run met them: just before each
transition where it stopped with ``timeout`` (or finalized on it) the clock
passes the run's ``timeout``, and just before each where it stopped with
``cancelled`` the token is cancelled (``RecordedOutside``), so such a stop
replays as one.  Where the recorded run's task was cancelled with a call due
(a ``cancelled`` stop on an ``interrupted`` edge: a bare ``task.cancel()``
mid-call, a stream's reader gone), the replay is taken there a transition at
a time and cut as it was (``RecordedCuts``), the call unmade, so it replays
past the resume to the recorded end.  Both live in
``drivers.recorded_outside``, where a fork's rebuild meets them too.
"""

from __future__ import annotations

import copy
import difflib
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, overload

import attrs

from fsm_agent.core.exchanges import message_from
from fsm_agent.drivers.rebuild import decisions, resumed_as_recorded
from fsm_agent.errors import AgentLoopError, FsmAgentError, SnapshotError
from fsm_agent.persist.recording import recording_of
from fsm_agent.persist.recording_format import read_recording
from fsm_agent.records import RunResult, Transition
from fsm_agent.testing.recorded import Departure, RecordedHolds, RecordedModel, RecordedOutside, RecordedTools

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.drivers.agent_run import AgentRun
    from fsm_agent.drivers.model import Model

Recording = dict[str, Any] | str | Path
"""A recording as its dict, its JSON text, or the ``Path`` of its file."""


class ReplayDivergence(FsmAgentError, AssertionError):
    """A replayed run departed from its recording at transition ``index``: ``expected`` was recorded, ``actual`` taken.

    Either is None where that run had no transition left.  ``diff`` is a
    unified diff of the recorded and the replayed model request when one
    differed (the prompt, a tool schema, the output schema, a history
    processor's work), else of the two runs' limits when those differ, else
    empty.  An ``AssertionError``, so pytest reports it as a failed test.
    """

    def __init__(self, index: int, expected: Transition | None, actual: Transition | None, diff: str = "") -> None:
        super().__init__(index, expected, actual, diff)
        self.index = index
        self.expected = expected
        self.actual = actual
        self.diff = diff

    def __str__(self) -> str:
        text = f"the replay departed from the recording at transition {self.index}:\n"
        text += f"  recorded {_edge(self.expected)}\n  replayed {_edge(self.actual)}"
        return text + (f"\n{self.diff}" if self.diff else "")


def _edge(entry: Transition | None) -> str:
    if entry is None:
        return "(no transition)"
    label = entry.reason or entry.guard
    return f"{entry.source}->{entry.dest}" + (f"[{label}]" if label else "")


@overload
def replay(
    agent: Agent,
    recording: Recording,
    *,
    strict: Literal[True] = True,
    model: Model | None = None,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> RunResult: ...
@overload
def replay(
    agent: Agent,
    recording: Recording,
    *,
    strict: Literal[False],
    model: Model,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> dict[str, Any]: ...
def replay(
    agent: Agent,
    recording: Recording,
    *,
    strict: bool = True,
    model: Model | None = None,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> RunResult | dict[str, Any]:
    """Run ``agent`` on the recorded question with the recorded replies and tool results; see the module.

    Returns the run's result (a stopped run's too: a recorded stop is
    replayed as one), or raises ``ReplayDivergence`` at the first transition
    that departs from the recording.  ``tools="live"`` calls the agent's
    tools (and sub-agents) instead of returning the recorded results, with
    ``deps`` as their ``RunContext.deps`` (no recording holds them; a run
    resumed in the recording gets them again).  With ``strict=False``, model
    calls past a divergence go to ``model`` and the new recording is returned.
    """
    data, handle, player, outside = _prepare(agent, recording, strict, model, tools, deps)
    onward: AgentRun | None = handle
    while onward is not None:
        handle = outside.run = onward
        try:
            while outside.cuts.ahead(handle):
                if outside.cuts.take(handle) is None:
                    handle.advance()
            result = handle.finish()
        except AgentLoopError as stop:
            result = stop.result
        onward = _onward(handle, result, data, player, outside)
    return _judged(data, handle, result, player, strict, outside.holds)


@overload
async def areplay(
    agent: Agent,
    recording: Recording,
    *,
    strict: Literal[True] = True,
    model: Model | None = None,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> RunResult: ...
@overload
async def areplay(
    agent: Agent,
    recording: Recording,
    *,
    strict: Literal[False],
    model: Model,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> dict[str, Any]: ...
async def areplay(
    agent: Agent,
    recording: Recording,
    *,
    strict: bool = True,
    model: Model | None = None,
    tools: Literal["recorded", "live"] = "recorded",
    deps: Any = None,
) -> RunResult | dict[str, Any]:
    """``replay`` on the async driver."""
    data, handle, player, outside = _prepare(agent, recording, strict, model, tools, deps)
    onward: AgentRun | None = handle
    while onward is not None:
        handle = outside.run = onward
        try:
            while outside.cuts.ahead(handle):
                if await outside.cuts.atake(handle) is None:
                    await handle.aadvance()
            result = await handle.afinish()
        except AgentLoopError as stop:
            result = stop.result
        onward = _onward(handle, result, data, player, outside)
    return _judged(data, handle, result, player, strict, outside.holds)


def _onward(
    handle: AgentRun, result: RunResult, data: dict[str, Any], player: RecordedModel, outside: RecordedOutside
) -> AgentRun | None:
    """The replay taken on as the recorded run was: decided where it paused, resumed where it stopped; else None.

    None where the recorded run ended here too, and where it was not resumed
    from this stop (or the replay has departed from it, a request too): the
    replay ends.
    """
    index = len(handle.trace)
    if index >= len(data["trace"]):
        return None  # the recorded run ended here: so does the replay
    if player.departure is not None and player.live is None:
        return None  # a request departed: _judged says where
    if result.reason == "paused":
        departed = None if outside.holds is None else outside.holds.departure
        if departed is not None:  # held by one side only: the replay departs here, the call not made
            departed.index = index
            return None
        handle.decide(decisions(handle, data))
        return handle
    if handle.trace != [Transition(**t) for t in data["trace"][:index]]:
        return None  # departed: _judged says where
    try:
        resumed = resumed_as_recorded(handle, data, cancel=outside.token())
    except SnapshotError:
        raise  # the recording's earlier_limits are malformed
    except ValueError:
        return None  # these limits keep the stop: the replay departs at the resume edge
    return None if resumed is None else resumed[0]


def _prepare(
    agent: Agent, recording: Recording, strict: bool, model: Model | None, tools: str, deps: Any
) -> tuple[dict[str, Any], AgentRun, RecordedModel, RecordedOutside]:
    """The recording read, and the recorded run started again on a copy of ``agent`` that answers from it."""
    if not strict and model is None:
        msg = "replay(strict=False) needs model=, the live model that answers past a divergence"
        raise TypeError(msg)
    if tools not in ("recorded", "live"):
        msg = f"replay's tools= is 'recorded' or 'live', got {tools!r}"
        raise ValueError(msg)
    data = read_recording(recording)
    output = None if agent.output is None else agent.output.request
    player = RecordedModel(data, output, None if strict else model)
    outside = RecordedOutside(data, player)
    double = copy.copy(agent)
    double.model = player
    double.settings = attrs.evolve(agent.settings, clock=outside.clock)
    holds = RecordedHolds(agent.settings.approve, data)
    if strict and holds.needed:  # re-recording (strict=False) takes the agent's rule as the new truth
        outside.holds = holds
        double.settings = attrs.evolve(double.settings, approve=holds)
    if tools == "recorded":
        parts = agent.run_parts if agent.run_parts[0] == agent.registry.version else agent.refresh_parts()
        double.registry = RecordedTools(agent.registry, data, live=not strict)  # type: ignore[assignment]
        double.run_parts = (parts[0], {}, parts[2], parts[3])  # a sub-agent's call returns its recorded outcome
    messages, prior = data["messages"], data["prior"]
    history = [message_from(m) for m in messages[:prior] if m["role"] != "system"]
    handle = double.start(messages[prior]["content"], history=history or None, cancel=outside.token(), deps=deps)
    return data, handle, player, outside


def _judged(
    data: dict[str, Any],
    handle: AgentRun,
    result: RunResult,
    player: RecordedModel,
    strict: bool,
    holds: RecordedHolds | None = None,
) -> RunResult | dict[str, Any]:
    """``result`` if the run took the recorded transitions, the new recording if not ``strict``, else the divergence.

    A departed request is a divergence at its model call's transition even
    where the trace goes on as recorded (a recorded failed call, refused).
    The diff is the request's where the replay departed with it, else the
    limits' (a replay that goes past a recorded stop then asks the model
    for more than the recording holds: it is the limit that differs).
    """
    expected = [Transition(**t) for t in data["trace"]]
    actual = list(result.trace)
    index = next((i for i, (e, a) in enumerate(zip(expected, actual, strict=False)) if e != a), None)
    if index is None and len(expected) != len(actual):
        index = min(len(expected), len(actual))
    snapshot = handle.snapshot()
    if not strict:
        ids = {item["id"] for item in snapshot["io"] if "result" in item}
        children = {call: kept for call, kept in (data.get("children") or {}).items() if call in ids}
        return recording_of(snapshot, children)
    departed = None if player.departure is None else _transition_of_call(actual, player.departure.call)
    if departed is not None and (index is None or departed < index):
        index = departed
    held = None if holds is None or holds.departure is None else holds.departure
    held_at = None if held is None else len(actual) if held.index is None else held.index
    if held_at is not None and (index is None or held_at <= index):
        index = held_at
    if index is None:
        return result
    limits = _diff(_limits_at(data, index), snapshot["limits"], "limits")
    diff = (_request_diff(player.departure) or limits) if departed == index else limits
    if held is not None and held_at == index:
        diff = held.diff()
    at = expected[index] if index < len(expected) else None
    raise ReplayDivergence(index, at, actual[index] if index < len(actual) else None, diff)


def _transition_of_call(trace: list[Transition], call: int) -> int:
    """The index of the transition that took the outcome of model call ``call`` (from 0); the trace's end if none."""
    made = -1
    for index, entry in enumerate(trace):
        if entry.source == "AwaitModel" and entry.trigger in ("replied", "model_failed"):
            made += 1
            if made == call:
                return index
    return len(trace)


def _limits_at(data: dict[str, Any], index: int) -> Any:
    """The limits the recorded run ran under at transition ``index``: those before the next resume, else its last."""
    return next((was for at, was in data.get("earlier_limits") or () if index < at), data["limits"])


def _request_diff(departure: Departure | None) -> str:
    if departure is None:
        return ""
    if departure.expected is None:
        return f"model call {departure.call + 1} is past the recording's model calls"
    return _diff(departure.expected, departure.actual, f"request of model call {departure.call + 1}")


def _diff(expected: Any, actual: Any, what: str) -> str:
    """A unified diff of two JSON values as indented text ("" when equal)."""
    lines = difflib.unified_diff(_lines(expected), _lines(actual), f"recorded {what}", f"replayed {what}", lineterm="")
    return "\n".join(lines)


def _lines(value: Any) -> list[str]:
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False).splitlines()


class RecordingFile:
    """What the ``fsm_recording`` pytest fixture gives a test: the recording at ``path``, to replay an agent against.

    ``fsm_recording(agent)`` replays it (keywords as ``replay``'s) and
    returns the run's result; ``await fsm_recording.areplay(agent)`` on the
    async driver; ``data`` is the recording itself, read when first asked.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        self._data: dict[str, Any] | None = None

    @property
    def data(self) -> dict[str, Any]:
        """The recording, read from ``path`` once (a missing file is a ``FileNotFoundError`` naming it)."""
        if self._data is None:
            if not self.path.is_file():
                msg = (
                    f"no recording at {self.path}: export one with "
                    "`python -m fsm_agent runs export RUN --store FILE|URL --out ...`"
                )
                raise FileNotFoundError(msg)
            self._data = read_recording(self.path)
        return self._data

    def __call__(self, agent: Agent, **keywords: Any) -> Any:
        return replay(agent, self.data, **keywords)

    async def areplay(self, agent: Agent, **keywords: Any) -> Any:
        """``areplay(agent, recording)``, awaited."""
        return await areplay(agent, self.data, **keywords)
