"""A run rebuilt up to one of its transitions from its recording, nothing called: the first half of a fork.

The source (a ``RunResult``, a snapshot, a recording, or a stored run's id)
becomes a recording; the agent runs again on a copy whose model answers the
source's replies in order (``_Replies``) and whose tools return the source's
results by call id (``_Results``), and each rebuilt transition is checked
against the source's.  A call the rebuilt run pauses on is decided as the
source's person decided it (``decisions``), and a stop the source was
resumed from is resumed as it was (``resumed_as_recorded``); a replay uses
both too.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Collection, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from fsm_agent.core import snapshot
from fsm_agent.core.approval import rejection_in
from fsm_agent.core.exchanges import message_from, response_from
from fsm_agent.definition.limits import Limits
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.stored import awaited
from fsm_agent.errors import ContextOverflowError, ForkError
from fsm_agent.records import Message, ModelResponse, OutputSchema, RunResult, ToolCall, Transition, plain
from fsm_agent.tools import JSONSchema, ToolResult

if TYPE_CHECKING:
    from fsm_agent.core.cancellation import CancelToken
    from fsm_agent.definition.stops import Stop
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.persist.store import AsyncStore, Store

ForkSource = RunResult | dict[str, Any] | str
"""What a fork is taken from: a ``RunResult``, a snapshot or recording (dict or JSON text), or a stored run's id."""
Rerun = Collection[str] | Literal["all"] | None
"""The source's call ids a fork makes again although the source completed them (``"all"``: every one)."""


def recording_of_source(source: ForkSource, store: Store | None) -> dict[str, Any]:
    """The source as a recording (a stored run's id is exported from ``store``).

    A text is a stored run's id or the JSON text of a snapshot or recording;
    which one, is decided in this order: with ``store`` given, a text that is
    the id of a run the store holds is that run (any id a store takes, ``{``
    first too); else a text that is a JSON object is a snapshot or recording;
    else it is a stored run's id (a ``KeyError`` if ``store`` lacks it, a
    ``ForkError`` without ``store``).
    """
    from fsm_agent.persist.recording import export

    if isinstance(source, str):
        data = _json_object(source)
        if data is None or (store is not None and _holds(store, source)):
            return export(_store_of(source, store), source)
        source = data
    return _recording_of_data(source)


async def arecording_of_source(source: ForkSource, store: AsyncStore | None) -> dict[str, Any]:
    """``recording_of_source``, a stored run read with the store's async methods."""
    from fsm_agent.persist.recording import aexport

    if isinstance(source, str) and store is not None:
        data = _json_object(source)
        if data is None or await _aholds(store, source):

            async def load(run_id: str) -> dict[str, Any]:
                return dict(await awaited(store, "load", run_id))

            return await aexport(store, source, load=load)
        return _recording_of_data(data)
    return recording_of_source(source, None)


def _json_object(text: str) -> dict[str, Any] | None:
    """``text`` as the JSON object it is, or None: a text that is no JSON object can only be a run id."""
    if not text.lstrip().startswith("{"):
        return None
    try:
        data = json.loads(text)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


def _holds(store: Store, run_id: str) -> bool:
    try:
        store.load(run_id)
    except KeyError:
        return False
    return True


async def _aholds(store: AsyncStore, run_id: str) -> bool:
    """``_holds``, awaited: the store's ``aload`` twin if it has one, else its ``load`` in a worker thread."""
    try:
        await awaited(store, "load", run_id)
    except KeyError:
        return False
    return True


def _store_of(run_id: str, store: Store | None) -> Store:
    """The store a text that is no JSON object names a run of; a ``ForkError`` without one."""
    if store is None:
        shown = run_id if len(run_id) <= 60 else f"{run_id[:57]}..."
        msg = f"fork of the stored run {shown!r} needs store=, the store that holds it"
        if run_id.lstrip().startswith("{"):
            msg += " (the text is no JSON object, so no snapshot or recording)"
        raise ForkError(msg)
    return store


def _recording_of_data(source: RunResult | dict[str, Any]) -> dict[str, Any]:
    """A source given as data (a ``RunResult``, a snapshot or a recording) as a recording."""
    from fsm_agent.persist.recording import RECORDING_FORMAT, read_recording, recording_of

    if isinstance(source, RunResult):
        if source.snapshot is None:
            return _recording_of_result(source)
        source = source.snapshot
    if not isinstance(source, dict):
        msg = f"a fork's source is a RunResult, a snapshot, a recording or a run id, got {type(source).__name__}"
        raise ForkError(msg)
    if source.get("format") == RECORDING_FORMAT:
        return read_recording(source)
    return recording_of(snapshot.parse(source), {})


def _recording_of_result(result: RunResult) -> dict[str, Any]:
    """A finished run's recording from its messages alone: its replies and tool results, without their requests.

    A ``RunResult`` of a run that finished in ``Done`` keeps no snapshot:
    its assistant messages are the replies (no usage), its tool messages
    the results (an ``{"error": ...}`` text is a failed call, as tools report
    failures), and its limits are unknown, so the agent's own apply.
    """
    names = {c.id: c for m in result.messages for c in m.tool_calls}
    replies = [m for m in result.messages[result.prior :] if m.role == "assistant"]
    model_calls = [
        {"reply": {"message": plain(m), "stop_reason": "tool_use" if m.tool_calls else "end_turn", "usage": None}}
        for m in replies
    ]
    tool_calls = []
    for message in result.messages[result.prior :]:
        call = names.get(message.tool_call_id or "")
        if message.role == "tool" and call is not None:
            result_of = {"content": message.content, "error": _error_in(message.content)}
            tool_calls.append({"id": call.id, "name": call.name, "arguments": call.arguments, "result": result_of})
    return {
        "run_id": None,
        "messages": [plain(m) for m in result.messages],
        "prior": result.prior,
        "trace": [plain(t) for t in result.trace],
        "limits": None,
        "model_calls": model_calls,
        "tool_calls": tool_calls,
        "from_messages": True,
    }


def _error_in(content: str) -> str | None:
    """The message of a failed call's ``{"error": ...}`` text, else None."""
    try:
        data = json.loads(content)
    except ValueError:
        return None
    if isinstance(data, dict) and list(data) == ["error"] and isinstance(data["error"], str):
        return data["error"]
    return None


class _Replies:
    """The source's model replies, in order, whatever the rebuilt run sends: the fork's history is the source's."""

    def __init__(self, calls: list[dict[str, Any]]) -> None:
        self.calls = calls
        self.index = 0

    def complete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> ModelResponse:
        """The next recorded reply (a recorded failure raised again)."""
        if self.index >= len(self.calls):
            msg = f"the source made {len(self.calls)} model call(s); the rebuilt run asked for another"
            raise ForkError(msg)
        recorded = self.calls[self.index]
        self.index += 1
        if recorded.get("reply") is None:
            text = recorded.get("error") or "the recorded model call gave no reply"
            kind, _, message = text.partition(": ")
            raise ContextOverflowError(message) if kind == "ContextOverflowError" else RuntimeError(text)
        return response_from(recorded["reply"])

    async def acomplete(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> ModelResponse:
        """``complete``, for the async driver."""
        return self.complete(messages, tools, output)


class _Results:
    """The agent's registry, whose calls return the source's recorded results by call id; all else is the registry's."""

    def __init__(self, registry: Any, recording: dict[str, Any]) -> None:
        self.registry = registry
        self.results = {c["id"]: c for c in recording["tool_calls"]}

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)

    def execute(self, call: ToolCall, *args: Any, **kwargs: Any) -> ToolResult:
        """The recorded result of ``call``."""
        kept = self.results.get(call.id)
        if kept is None or kept["name"] != call.name:
            msg = f"the source holds no result of tool call {call.id!r} ({call.name}), which the rebuilt run made"
            raise ForkError(msg)
        return tool_result(kept["result"])

    async def aexecute(self, call: ToolCall, *args: Any, **kwargs: Any) -> ToolResult:
        """``execute``, for the async driver."""
        return self.execute(call)


def tool_result(data: dict[str, Any]) -> ToolResult:
    """A recorded tool result from its plain form."""
    from fsm_agent.records import child_outcome

    return ToolResult(**{**data, "child": child_outcome(data.get("child"))})


def rebuilding(agent: Agent, recording: dict[str, Any], at: int) -> AgentRun:
    """The source's run started again on a copy of ``agent`` that answers from ``recording``; nothing is called."""
    trace = recording["trace"]
    if isinstance(at, bool) or not isinstance(at, int):
        msg = f"at must be the index of a transition of the source's trace, got {at!r}"
        raise TypeError(msg)
    if not 0 <= at < len(trace):
        msg = f"at={at} is not a transition of the source, whose trace has {len(trace)} (0 to {len(trace) - 1})"
        raise ForkError(msg)
    if trace[at]["dest"] == "Done":
        msg = f"transition {at} ends the source in Done: nothing comes after it to fork; fork at an earlier one"
        raise ForkError(msg)
    double = copy.copy(agent)
    double.model = _Replies(recording["model_calls"])
    parts = agent.run_parts if agent.run_parts[0] == agent.registry.version else agent.refresh_parts()
    double.registry = _Results(agent.registry, recording)  # type: ignore[assignment]
    double.run_parts = (parts[0], {}, parts[2], parts[3])  # a sub-agent's call returns its recorded outcome
    from fsm_agent.observe.events import Hooks

    double.hooks = Hooks()  # the agent's hooks hear of the fork's own transitions only
    messages, prior = recording["messages"], recording["prior"]
    # The system prompt is part of the history: the source's (none if it had none), whatever the agent's is.
    system = messages[0]["content"] if messages[0]["role"] == "system" else ""
    if system != double.settings.system:
        double.settings = attrs.evolve(double.settings, system=system)
    history = [message_from(m) for m in messages[:prior] if m["role"] != "system"]
    earlier = snapshot.earlier_limits_of(recording)  # the source ran under the first until it was first resumed
    limits = None if recording["limits"] is None else earlier[0][1] if earlier else snapshot.limits_of(recording)
    return double._begin(messages[prior]["content"], None, (), None, None, history or None, limits=limits)  # noqa: SLF001


def rebuilt(agent: Agent, recording: dict[str, Any], at: int) -> AgentRun:
    """The source's run rebuilt up to and including transition ``at`` (see the module); nothing is called."""
    run = rebuilding(agent, recording, at)
    while len(run.trace) <= at:
        if run.paused:
            run.decide(decisions(run, recording))
        run, entry = _resumed(run, recording) if run.done else (run, run.advance())
        _checked(run, recording, entry)
    return run


async def arebuilt(agent: Agent, recording: dict[str, Any], at: int) -> AgentRun:
    """``rebuilt`` on the async driver: an agent's async validators and compaction are awaited.

    A turn's calls are taken one at a time, as ``rebuilt`` takes them: a
    source made on the sync driver holds no result of the calls after the
    one it stopped at, which a planned batch would ask for.
    """
    run = rebuilding(agent, recording, at)
    while len(run.trace) <= at:
        run._batches = False  # noqa: SLF001 - the rebuilt run (and each it is resumed as) is this module's own
        if run.paused:
            run.decide(decisions(run, recording))
        run, entry = _resumed(run, recording) if run.done else (run, await run.aadvance())
        _checked(run, recording, entry)
    return run


def _resumed(run: AgentRun, recording: dict[str, Any]) -> tuple[AgentRun, Transition]:
    """The stopped rebuilt run resumed as the source was (``resumed_as_recorded``), retrying a model call.

    A source that kept no limits for the edge (a snapshot from before they
    were kept, or a ``RunResult`` that ended in ``Done``) is resumed under
    its own limits, which lift a ``model_error`` stop (retried) only.
    """
    index = len(run.trace)
    expected = Transition(**recording["trace"][index])
    try:
        resumed = resumed_as_recorded(run, recording)
    except ValueError as exc:
        msg = f"the source cannot be rebuilt up to this transition: its resume at transition {index} failed: {exc}"
        raise ForkError(msg) from exc
    if resumed is not None:
        return resumed
    entry = run.stepper.resume(retry=True) if expected.trigger == "resume" else None
    if entry is None:
        msg = (
            f"the source cannot be rebuilt up to this transition: it was resumed at transition {index} "
            f"({_edge(expected)}) under limits it does not record (a snapshot from before they were kept, or a "
            "RunResult that ended in Done: fork run.snapshot() or the stored run)"
        )
        raise ForkError(msg)
    return run, entry


def resumed_as_recorded(
    run: AgentRun, recording: dict[str, Any], *, cancel: CancelToken | None = None
) -> tuple[AgentRun, Transition] | None:
    """The stopped ``run`` resumed as the recorded one was at its next transition; None if that is no kept resume.

    The resume is ``Agent.resume``'s (``AgentRun._resumed``, a model call
    retried): the run comes back from its snapshot with the limits that
    resume changed set as it set them (the rest stay the run's), and takes
    the ``resume`` edge, which keeps the limits it stopped under, as the
    recorded one did.  A fork rebuilds under the recorded limits, so it
    resumes under exactly those that came next; a replay under its agent's
    own, lifted where the recorded run was lifted.  A ``ValueError`` if the
    new limits do not lift the run's stop.  ``cancel`` is the resumed run's
    cancel token (a replay's, which it cancels where the recorded run was).
    """
    index = len(run.trace)
    earlier = snapshot.earlier_limits_of(recording)
    resumes = [at for at, _ in earlier]
    if index not in resumes or recording["trace"][index]["trigger"] != "resume":
        return None
    before = earlier[resumes.index(index)][1]
    later = [limits for at, limits in earlier if at > index]
    after = later[0] if later else snapshot.limits_of(recording)
    changed = {f.name: getattr(after, f.name) for f in attrs.fields(Limits)}
    changed = {name: value for name, value in changed.items() if value != getattr(before, name)}
    resumed, _, entry = AgentRun._resumed(  # noqa: SLF001 - the recorded resume, taken again
        run.agent, run.snapshot(), None, True, cancel, (), None, changed
    )
    assert entry is not None  # a stopped run: _resumed raises where its edge is not taken
    return resumed, entry


UNRECORDED_STOPS = {"timeout": "the clock", "cancelled": "a cancel token"}
"""The stops that come from no recorded reply or result, so a rebuild does not take them: a fork is taken before."""


def forkable_stops(stops: Iterable[Stop]) -> str:
    """The stops a fork taken at one goes on from, in words, for the error at a stop it cannot go on from."""
    lifted = [stop.reason for stop in stops if stop.resume == "lift" and stop.reason not in UNRECORDED_STOPS]
    retried = [stop.reason for stop in stops if stop.resume == "retry"]
    return (
        f"a fork taken at a stop goes on from {', '.join(lifted)} when its ForkEdit(limits=...) lifts the limit, "
        f"and from {' and '.join(retried)}, asking its model again; at any other stop, fork at an earlier transition"
    )


def _checked(run: AgentRun, recording: dict[str, Any], entry: Transition) -> None:
    """Check the transition just rebuilt against the source's; a ``ForkError`` naming both if they differ."""
    index = len(run.trace) - 1
    expected = Transition(**recording["trace"][index])
    if entry != expected and expected.dest == "Failed" and expected.reason in UNRECORDED_STOPS:
        before = f"at transition {index - 1} or earlier" if index else "nothing comes before it"
        msg = (
            f"the source cannot be rebuilt up to this transition: at transition {index} it stopped with "
            f"{expected.reason!r}, which came from {UNRECORDED_STOPS[expected.reason]}, not from its recorded replies "
            f"and results, so a fork is taken before that stop ({before}); {forkable_stops(run.agent.table.stops)}"
        )
        raise ForkError(msg)
    if entry != expected:
        msg = (
            f"the source cannot be rebuilt up to this transition: at transition {index} it took {_edge(expected)}, "
            f"the rebuilt run {_edge(entry)} (a stop the source was resumed from, or an agent whose rows differ)"
        )
        if recording.get("from_messages"):
            msg += (
                "; a RunResult that ended in Done keeps its messages only: fork run.snapshot() or the stored run, "
                "which keep every model call (a failed one or a context overflow too)"
            )
        raise ForkError(msg)


def decisions(run: AgentRun, recording: dict[str, Any]) -> dict[str, bool | str]:
    """The source's decisions on the calls the rebuilt run is paused on: approved where a result was recorded."""
    made = {c["id"] for c in recording["tool_calls"]}
    answers = {m.get("tool_call_id"): m["content"] for m in recording["messages"] if m["role"] == "tool"}
    found: dict[str, bool | str] = {}
    for call in run.awaiting():
        if call.id in made:
            found[call.id] = True
            continue
        rejected = rejection_in(call.name, _error_in(answers.get(call.id, "")) or "")
        found[call.id] = False if rejected is None else rejected
    return found


def _edge(entry: Transition) -> str:
    label = entry.reason or entry.guard
    return f"{entry.source}->{entry.dest}" + (f"[{label}]" if label else "")
