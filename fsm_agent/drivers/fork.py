"""Fork a run: a new run whose history is another's up to one of its transitions, going on from there.

The source (a ``RunResult``, a snapshot, a recording, or a stored run's id)
is edited (``ForkEdit``, ``drivers.fork_edit``) and rebuilt up to transition
``at`` (``drivers.rebuild``), nothing called, and the fork starts there as a
new run that names its source (``forked_from``).  The outcomes of the
calls the source completed after ``at`` go with it (``Calls.carried``): a
call of the fork with the same tool and arguments takes the recorded outcome
instead of being made again (its step's ``reused_from`` says so), unless
``rerun`` names it; so do those the source still carried itself (a fork of
a fork), and a sub-agent's completed calls go down to the new sub-agent
run of a call made again (``Calls.carried_down``).  Nothing is stored
until the fork is whole.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.exchanges import message_from
from fsm_agent.core.hand_down import canonical_arguments, down_parts, one_down
from fsm_agent.core.history import check_paired
from fsm_agent.definition.limits import Limits
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.fork_edit import ForkEdit, in_source
from fsm_agent.drivers.fork_source import Rerun, error_in
from fsm_agent.drivers.fork_spend import whole_result
from fsm_agent.drivers.rebuild import forkable_stops
from fsm_agent.drivers.watched import Observer
from fsm_agent.errors import ForkError
from fsm_agent.records import Transition

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.persist.store import Store


@attrs.frozen
class Prepared:
    """A fork ready to be made: its snapshot, the limits it lifts, its decisions, and the stored source it names."""

    data: dict[str, Any]
    lifted: dict[str, Any]
    approvals: Mapping[str, bool | str]


def prepared(
    run: AgentRun, source: dict[str, Any], at: int, run_id: str | None, edit: ForkEdit, rerun: Rerun
) -> Prepared:
    """The fork's snapshot from the rebuilt ``run``: the source's history, ``edit`` checked, carried outcomes added.

    ``source`` is the recording ``run`` was rebuilt from, ``edit``'s messages
    and results already in it (``drivers.fork_edit``): what is left here is
    to check that they fit the fork's position.
    """
    from fsm_agent.core.child_ids import LINK
    from fsm_agent.persist.store import check_run_id
    from fsm_agent.persist.summary import VERSION_KEY

    if run_id is not None:
        run_id = check_run_id(run_id)  # as start(run_id=...): an empty id is refused, not made a fresh one
    # What the rebuilt snapshot says of the run it belongs to (its id, version, session, parent): none is the fork's.
    links = {"run_id", "start_id", VERSION_KEY, "session_id", "request_id", "request_turns", *LINK, "forked_from"}
    data = {k: v for k, v in run.snapshot().items() if k not in links}
    data["start_id"] = uuid.uuid4().hex  # a fork is a run started anew: the calls it sends are its own
    data["messages"] = list(source["messages"][: len(data["messages"])])  # the source's own, system prompt too
    # A call the rebuilt run still holds undecided waited, in the source, for a decision taken after the fork point:
    # whether the fork holds it is its own agent's approve= (the source's rejections held it for the rebuild only).
    data["to_approve"] = [i for i in data["to_approve"] if i in data["approvals"]]
    origin = source.get("run_id")
    data["forked_from"] = [origin, at]
    if run_id is not None:
        data["run_id"] = run_id
    known = {m["tool_call_id"] for m in data["messages"] if m["role"] == "tool"} | set(data["ran"])
    after = [c for c in source["tool_calls"] if c["id"] not in known]
    again = _rerun(rerun, after, known)
    children = source.get("children") or {}
    carried = {
        c["id"]: [c["name"], canonical_arguments(c["arguments"]), _reused(c, origin, children)]
        for c in after
        if c["id"] not in again
    }
    _check_edited(data, source, edit)
    # A fork of a fork: what its source still carried (from the runs it was forked from) is carried on too.
    inherited = [] if rerun == "all" else [list(entry) for entry in source.get("carried") or ()]
    data["carried"] = [*carried.values(), *inherited]
    data["carried_down"] = [] if rerun == "all" else _carried_down(source, after, again, known)
    data.pop("prepaid", None)  # a fork keeps no cut past its fork point: each outcome it hands on counts where taken
    unknown = sorted(set(edit.limits) - {f.name for f in attrs.fields(Limits)})
    if unknown:
        names = ", ".join(f.name for f in attrs.fields(Limits))
        msg = f"ForkEdit.limits names no limit: {', '.join(unknown)} (limits: {names})"
        raise ForkError(msg)
    return Prepared(data, dict(edit.limits), edit.approvals)


def _carried_down(
    recording: dict[str, Any], after: list[dict[str, Any]], again: set[str], known: set[str]
) -> list[list[Any]]:
    """For each sub-agent call the fork makes again, its source run's completed calls, which the new child run takes.

    Such a call is one ``rerun`` names, or one the source was still making
    when it was cut (it holds no result of it, but its sub-agent's stored
    run holds the calls that completed).  Known where the source's sub-agent
    runs were recorded (a stored source, whose export nests them).  What the
    source itself still carried down (a fork of a fork) goes on down too.
    """
    children = recording.get("children") or {}
    cut = _cut(recording, known)
    down = _not_taken(recording, cut)
    for call in [c for c in after if c["id"] in again] + cut:
        child = children.get(call["id"])
        if child is not None:
            down.append([call["name"], canonical_arguments(call["arguments"]), _outcomes(child)])
    return down


def _not_taken(recording: dict[str, Any], cut: list[dict[str, Any]]) -> list[list[Any]]:
    """What ``recording`` still carried down, but the entries the runs of its ``cut`` calls took (one each).

    Why: a cut call's run started, so it took its entry (``carry_in``); the
    run's stored snapshot may not say so (the cut came before its next
    write), and the child's recording, which holds what that entry gave and
    what the child did since, is handed instead: the stale entry, taken
    first, would make the child's own completed calls again.
    """
    down = [list(entry) for entry in recording.get("carried_down") or ()]
    for call in cut:
        name, arguments = call["name"], canonical_arguments(call["arguments"])
        alike = [i for i, entry in enumerate(down) if entry[0] == name and down_parts(entry[1])[1] == arguments]
        # Its own entry (named by its id) first, as the run took it (core.hand_down.take_carried_down).
        taken = next((i for i in alike if down_parts(down[i][1])[0] == call["id"]), alike[0] if alike else None)
        if taken is not None:
            del down[taken]
    return down


def _cut(recording: dict[str, Any], known: set[str]) -> list[dict[str, Any]]:
    """The sub-agent calls ``recording`` was still making when it was cut: a run of theirs is in its ``children``,
    but no result (nor in ``known``, the calls answered before a fork point)."""
    done = {c["id"] for c in recording["tool_calls"]}
    asked = {c["id"]: c for m in recording["messages"] for c in m.get("tool_calls") or ()}
    return [asked[i] for i in recording.get("children") or {} if i in asked and i not in done and i not in known]


def _outcomes(recording: dict[str, Any]) -> list[list[Any]]:
    """A (sub-agent's) run's outcomes a run forked from it takes: its completed calls, and those it still carried.

    Its own sub-agent calls' go with them, one level further down
    (``one_down``, the text ``split_down`` reads at the next level): what it
    still carried down, and what the runs of its calls cut in flight
    completed, each level's in turn; so a grandchild's completed call runs
    no more than a child's.
    """
    origin, children = recording.get("run_id"), recording.get("children") or {}
    made = [
        [c["name"], canonical_arguments(c["arguments"]), _reused(c, origin, children)] for c in recording["tool_calls"]
    ]
    cut = _cut(recording, set())
    down = _not_taken(recording, cut)
    for call in cut:
        down.append([call["name"], canonical_arguments(call["arguments"]), _outcomes(children[call["id"]])])
    deeper = [list(entry) for name, arguments, outcomes in down for entry in one_down(name, arguments, outcomes)]
    return made + [list(entry) for entry in recording.get("carried") or ()] + deeper


def _reused(call: dict[str, Any], origin: str | None, children: dict[str, Any]) -> dict[str, Any]:
    """The recorded outcome of ``call`` as a fork takes it: naming where it came from, and, a sub-agent's, bringing
    every tool call of its run (``children``: the recording's sub-agent runs by call id): past its fork point a fork
    keeps no cut of the call (``fork_spend``)."""
    result = whole_result(call, children.get(call["id"]))
    return {**result, "reused_from": f"{origin}/{call['id']}" if origin else call["id"]}


def _rerun(rerun: Rerun, after: list[dict[str, Any]], known: set[str]) -> set[str]:
    """The call ids ``rerun`` names, each one the source completed after the fork point; a ``ForkError`` if not."""
    if rerun is None:
        return set()
    if rerun == "all":
        return {c["id"] for c in after}
    if isinstance(rerun, str) or not isinstance(rerun, Iterable):
        given = f"the text {rerun!r}" if isinstance(rerun, str) else type(rerun).__name__
        msg = f'rerun is a collection of call ids or "all", got {given}'
        raise TypeError(msg)
    items = list(rerun)
    others = [item for item in items if not isinstance(item, str)]
    if others:
        shown = ", ".join(f"{item!r} ({type(item).__name__})" for item in others[:3]) + (", ..." if others[3:] else "")
        msg = f'rerun is a collection of call ids (texts) or "all"; it holds {shown}'
        raise TypeError(msg)
    wanted = set(items)
    ids = {c["id"] for c in after}
    early = sorted(wanted & known)
    if early:
        msg = f"calls {', '.join(early)} completed before the fork point: edit their results with ForkEdit(results=...)"
        raise ForkError(msg)
    strange = sorted(wanted - ids)
    if strange:
        done = ", ".join(sorted(ids)) or "none"
        msg = f"rerun names calls the source never completed: {', '.join(strange)} (after the fork point: {done})"
        raise ForkError(msg)
    return wanted


def _check_edited(data: dict[str, Any], source: dict[str, Any], edit: ForkEdit) -> None:
    """``edit``'s messages are of the fork's and leave them paired, and its results name calls the source answered.

    A result still kept in ``ran`` (a call of a cut batch, not recorded
    yet) takes the edited text here, where the fork's run will record it.
    """
    messages = data["messages"]
    for index in edit.messages:
        if not 0 <= index < len(messages):
            msg = f"ForkEdit.messages: {index!r} is not the index of a message of the fork (0 to {len(messages) - 1})"
            raise ForkError(msg)
    if edit.messages:  # only an edited message can leave a call without its answer, or an answer without its call
        _check_paired(data)
    for call_id, text in edit.results.items():
        if call_id in data["ran"]:
            data["ran"][call_id] = {**data["ran"][call_id], "content": text, "error": error_in(text)}
        elif not in_source(source, call_id):
            msg = f"ForkEdit.results: the source has no result of call {call_id!r} to change"
            raise ForkError(msg)


def _check_paired(data: dict[str, Any]) -> None:
    """The edited messages still pair each tool call with its answer (providers refuse them otherwise), or ForkError.

    The calls the fork is still to make (``pending``) are the ones left open
    by its last messages, as in the source.
    """
    messages = [message_from(m) for m in data["messages"]]
    still_open = {call["id"] for call in data["pending"]}
    try:
        check_paired(list(enumerate(messages)), where="messages", still_open=still_open)
    except ValueError as exc:
        msg = f"ForkEdit.messages leave a history providers refuse: {exc}"
        raise ForkError(msg) from exc


def forked(
    agent: Agent,
    ready: Prepared,
    *,
    cancel: CancelToken | None,
    observers: Sequence[Observer],
    store: Store | None,
    deps: Any,
) -> tuple[AgentRun, Transition | None]:
    """The fork as a run of ``agent`` (not written yet), and the resume edge it takes when forked at a stop."""
    try:
        # retry: a fork at a failed model call (model_error, context_overflow) asks its own model again.
        run, _, entry = AgentRun._resumed(  # noqa: SLF001 - a fork comes back from its snapshot as a resumed run does
            agent,
            ready.data,
            ready.approvals,
            True,
            cancel,
            observers,
            store,
            ready.lifted,
            deps,
            resumable=forkable_stops(agent.table.stops),
            instead="fork at an earlier transition, before that much was used",
        )
    except ValueError as exc:
        raise ForkError(f"the fork cannot go on: {exc}") from exc
    # Once it goes on (a stop it is forked at lifted as in its source's counts): a call unanswered here brings what
    # its cuts counted with the outcome the fork takes, or, handed down, where it is taken (fork_spend).
    run.stepper.forked_here()
    return run, entry
