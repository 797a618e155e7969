"""A run rebuilt up to one of its transitions from its recording, nothing called: the first half of a fork.

The source (a ``RunResult``, a snapshot, a recording, or a stored run's id)
becomes a recording (``drivers.fork_source``), edited by the fork's
``ForkEdit`` (``drivers.fork_edit``); the agent runs again on a copy whose
model answers the recorded replies in order (``_Replies``) and whose tools
return the recorded results by call id (``_Results``), so the core counts
each of them as it came (an edited one as edited; a sub-agent's with every
tool call of its run, the cuts' shares counted where the source counted them:
``drivers.fork_spend``),
and each rebuilt transition is checked against the source's.  A call that waited for the
source's person waits for a decision in the rebuilt run too, whatever the
agent's ``approve=``, and is decided again as it was, approved or rejected
(``decisions``); a stop the source was resumed from is resumed as it was
(``resumed_as_recorded``); a replay uses both too.  What the source met from
outside its replies and results (its deadline, its cancel token, its task
cut with a call in flight) is met again at the same transition
(``drivers.recorded_outside``, which a replay shares), so a fork is taken
past a ``timeout`` or ``cancelled`` stop as past any other.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core import snapshot
from fsm_agent.core.exchanges import message_from, response_from
from fsm_agent.definition.limits import Limits
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.fork_spend import whole_result
from fsm_agent.drivers.recorded_outside import RecordedOutside, recorded_decisions
from fsm_agent.errors import ContextOverflowError, ForkError
from fsm_agent.records import Message, ModelResponse, OutputSchema, ToolCall, Transition
from fsm_agent.tools import JSONSchema, ToolResult

if TYPE_CHECKING:
    from fsm_agent.core.cancellation import CancelToken
    from fsm_agent.definition.stops import Stop
    from fsm_agent.drivers.agent import Agent


class _Replies:
    """The source's model replies, in order, whatever the rebuilt run sends: the fork's history is the source's."""

    departure = None  # never departs from the source (RecordedOutside's model): it refuses a call it does not hold

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
        # The sub-agent runs of its calls: an outcome the rebuilt run is given brings all of its run (fork_spend).
        self.children = recording.get("children") or {}
        # The calls a ForkEdit changed in the reply that asked for them: answered with the source's result all the same.
        self.edited = frozenset(recording.get("edited_calls") or ())
        # Whether the rebuilt run counts each cut's share where the source did (RecordedCuts): answers bring no cut.
        self.cuts_counted = "cut_shares" in recording

    def __getattr__(self, name: str) -> Any:
        return getattr(self.registry, name)

    def execute(self, call: ToolCall, *args: Any, **kwargs: Any) -> ToolResult:
        """The recorded result of ``call``."""
        kept = self.results.get(call.id)
        if kept is None or (kept["name"] != call.name and call.id not in self.edited):
            msg = f"the source holds no result of tool call {call.id!r} ({call.name}), which the rebuilt run made"
            raise ForkError(msg)
        return tool_result(whole_result(kept, self.children.get(call.id), cuts_counted=self.cuts_counted))

    async def aexecute(self, call: ToolCall, *args: Any, **kwargs: Any) -> ToolResult:
        """``execute``, for the async driver."""
        return self.execute(call)


def tool_result(data: dict[str, Any]) -> ToolResult:
    """A recorded tool result from its plain form."""
    from fsm_agent.records import child_outcome

    return ToolResult(**{**data, "child": child_outcome(data.get("child"))})


def rebuilding(agent: Agent, recording: dict[str, Any], at: int) -> tuple[AgentRun, RecordedOutside]:
    """The source's run started again on a copy of ``agent`` that answers from ``recording``; nothing is called.

    With it, what the source met from outside (``RecordedOutside``): the
    rebuilt run's clock and cancel token are its, so the source's deadlines
    and cancels are met at the transitions where the source met them.
    """
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
    _check_replies_kept(recording)
    double = copy.copy(agent)
    double.model = replies = _Replies(recording["model_calls"])
    outside = RecordedOutside(recording, replies)
    outside.until = at  # a fork before a recorded deadline starts with none of the time the source spent past it
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
    # A call waits for a decision as in the source, whatever the agent's approve= says, and is decided as it was
    # (``decisions``): a rejected one rejected again, an approved one approved, so the rebuilt run's record says it
    # waited for a person as the source's does (a fork's history keeps it, and its replay holds it).
    held = frozenset(i for i, (_, decision) in recorded_decisions(recording).items() if decision is not None)
    double.settings = attrs.evolve(double.settings, approve=_HeldAsRecorded(held), clock=outside.clock)
    history = [message_from(m) for m in messages[:prior] if m["role"] != "system"]
    earlier = snapshot.earlier_limits_of(recording)  # the source ran under the first until it was first resumed
    limits = None if recording["limits"] is None else earlier[0][1] if earlier else snapshot.limits_of(recording)
    cancel = outside.token()
    run = double._begin(messages[prior]["content"], cancel, (), None, None, history or None, limits=limits)  # noqa: SLF001
    return run, outside


def _check_replies_kept(recording: dict[str, Any]) -> None:
    """A ``ForkError`` if the recording lacks replies its messages hold: a run stored before model calls were kept.

    Why refused rather than rebuilt from its messages: those keep no usage,
    so the fork would count none of the tokens and dollars the source spent,
    and its budgets would read less than was spent.
    """
    replies = sum(1 for m in recording["messages"][recording["prior"] :] if m["role"] == "assistant")
    kept = sum(1 for call in recording["model_calls"] if call.get("reply") is not None)
    if kept < replies:
        name = recording.get("run_id")
        source = f"the stored run {name!r}" if name else "the source"
        msg = (
            f"{source} holds {replies} model replies but kept {kept} of its model calls: it was stored by an older "
            "release, before model calls were kept, and a fork rebuilds a run from each call's reply and usage; "
            "to go on from its conversation, start a new run with its messages as history="
        )
        raise ForkError(msg)


@attrs.frozen
class _HeldAsRecorded:
    """The rebuilt run's ``approve=``: a call waits for a decision if it waited for the source's person.

    Why not the agent's own rule: the rebuilt run's history is the
    source's, so a call is held exactly where the source's was (approved or
    rejected), whatever the agent's ``approve=`` says now.
    """

    ids: frozenset[str]

    def __call__(self, call: ToolCall) -> bool:
        return call.id in self.ids


def rebuilt(agent: Agent, recording: dict[str, Any], at: int) -> AgentRun:
    """The source's run rebuilt up to and including transition ``at`` (see the module); nothing is called.

    Each transition is the recorded cut where the source's task was cut
    there (``RecordedCuts``), the recorded resume where it was resumed, else
    the next one the run takes.
    """
    run, outside = rebuilding(agent, recording, at)
    while len(run.trace) <= at:
        outside.run = run
        if run.paused:
            run.decide(decisions(run, recording))
        if run.done:
            run, entry = _resumed(run, recording, outside)
        else:
            entry = outside.cuts.take(run) or run.advance()
        _checked(run, recording, entry)
    return run


async def arebuilt(agent: Agent, recording: dict[str, Any], at: int) -> AgentRun:
    """``rebuilt`` on the async driver: an agent's async validators and compaction are awaited.

    A turn's calls are taken one at a time, as ``rebuilt`` takes them: a
    source made on the sync driver holds no result of the calls after the
    one it stopped at, which a planned batch would ask for.
    """
    run, outside = rebuilding(agent, recording, at)
    while len(run.trace) <= at:
        outside.run = run
        run._batches = False  # noqa: SLF001 - the rebuilt run (and each it is resumed as) is this module's own
        if run.paused:
            run.decide(decisions(run, recording))
        if run.done:
            run, entry = _resumed(run, recording, outside)
        else:
            entry = await outside.cuts.atake(run) or await run.aadvance()
        _checked(run, recording, entry)
    return run


def _resumed(run: AgentRun, recording: dict[str, Any], outside: RecordedOutside) -> tuple[AgentRun, Transition]:
    """The stopped rebuilt run resumed as the source was (``resumed_as_recorded``), retrying a model call.

    The resumed run gets a fresh token from ``outside`` (cancelled where the
    source was cancelled again), as the source's resume was given one.

    A source that kept no limits for the edge (a snapshot from before they
    were kept, or a ``RunResult`` that ended in ``Done``) is resumed under
    its own limits, which lift a ``model_error`` stop (retried) only.
    """
    index = len(run.trace)
    expected = Transition(**recording["trace"][index])
    try:
        resumed = resumed_as_recorded(run, recording, cancel=outside.token())
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
    cancel token (a replay's, which it cancels where the recorded run was);
    its ``deps`` are ``run``'s.
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
    deps = run._deps  # noqa: SLF001 - the run's deps go on with it
    resumed, _, entry = AgentRun._resumed(  # noqa: SLF001 - the recorded resume, taken again
        run.agent, run.snapshot(), None, True, cancel, (), None, changed, deps
    )
    assert entry is not None  # a stopped run: _resumed raises where its edge is not taken
    return resumed, entry


def forkable_stops(stops: Iterable[Stop]) -> str:
    """The stops a fork taken at one goes on from, in words, for the error at a stop it cannot go on from.

    A stop a limit lifts goes on when ``ForkEdit(limits=...)`` lifts it; one
    lifted by no limit (``cancelled``) goes on with the fork's own cancel
    token, which nobody cancelled yet.
    """
    stops = list(stops)
    lifted = [stop.reason for stop in stops if stop.resume == "lift" and stop.limit is not None]
    freed = [stop.reason for stop in stops if stop.resume == "lift" and stop.limit is None]
    retried = [stop.reason for stop in stops if stop.resume == "retry"]
    return (
        f"a fork taken at a stop goes on from {', '.join(lifted)} when its ForkEdit(limits=...) lifts the limit, "
        f"from {' and '.join(freed)} with a cancel token not cancelled (or none), "
        f"and from {' and '.join(retried)}, asking its model again; at any other stop, fork at an earlier transition"
    )


def _checked(run: AgentRun, recording: dict[str, Any], entry: Transition) -> None:
    """Check the transition just rebuilt against the source's; a ``ForkError`` naming both if they differ."""
    index = len(run.trace) - 1
    expected = Transition(**recording["trace"][index])
    if entry != expected:
        msg = (
            f"the source cannot be rebuilt up to this transition: at transition {index} it took {_edge(expected)}, "
            f"the rebuilt run {_edge(entry)} (a stop the source was resumed from, or an agent whose rows differ)"
        )
        if recording.get("edited_calls") is not None:
            msg += (
                f"; or the ForkEdit changes what the source did before the fork point: an edited message or result "
                f"comes into the rebuilt run as it is, so to go on from it fork at {index - 1} or earlier"
                if index
                else "; or the ForkEdit changes the run's question"
            )
        if recording.get("from_messages"):
            msg += (
                "; a RunResult that ended in Done keeps its messages only: fork run.snapshot() or the stored run, "
                "which keep every model call (a failed one or a context overflow too)"
            )
        raise ForkError(msg)


def decisions(run: AgentRun, recording: dict[str, Any]) -> dict[str, bool | str]:
    """The source's decisions on the calls the rebuilt run is paused on: approved where a result was recorded."""
    known = recorded_decisions(recording)
    made = {c["id"] for c in recording["tool_calls"]}
    found: dict[str, bool | str] = {}
    for call in run.awaiting():
        decision = known.get(call.id, (call.name, None))[1]
        found[call.id] = (call.id in made) if decision is None else decision
    return found


def _edge(entry: Transition) -> str:
    label = entry.reason or entry.guard
    return f"{entry.source}->{entry.dest}" + (f"[{label}]" if label else "")
