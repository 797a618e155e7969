"""A stored run as the viewer shows it: its snapshot laid out transition by transition, as plain JSON.

A snapshot keeps the whole conversation, the steps (each with every counter
against its limit after it) and the trace, but not which message or step each
transition brought.  :func:`moments` lines them up again the way the stepper
makes them: a ``replied`` edge brings the next assistant message, a
``tool_done`` edge the next tool message and the next tool step, the edge
into ``Done`` the final step.  A run that continued a conversation starts
after the ``prior`` messages it was given.  The counters of a transition are those of the
latest step at or before it; the last transition gets the run's counters as
they stand, rebuilt from the snapshot by the engine's own code, and a stop
its evidence in full.  A sub-agent call's edges name the child run it was
(its step's ``child``); a sub-agent's run names its parent run and call.
Nothing here draws, serves or reads a store: the app turns this into JSON
and the page into text.
"""

from __future__ import annotations

from typing import Any

from fsm_agent import TABLE, State, Table, Transition
from fsm_agent.core import snapshot as snapshots
from fsm_agent.definition.run import Run
from fsm_agent.persist.summary import VERSION_KEY, fork_origin
from fsm_agent.render.model import diagram_edges, row_index

MODEL_EDGES = frozenset({"replied"})
"""Triggers out of ``AwaitModel`` that bring the model's reply (an assistant message)."""
TOOL_EDGES = frozenset({"tool_done"})
"""Triggers out of ``ExecuteTool`` that bring a tool's result (a tool message and a step)."""


def edge_ids(table: Table, entry: Transition) -> tuple[int | None, list[str]]:
    """The table row a trace entry took and the ids of what draws it: ``row<index>`` and its trunk, if any.

    ``(None, [])`` when the entry matches no row of ``table`` (a run of an
    agent with its own stops, shown over the default table): the timeline
    still lists it, the drawing just cannot light it.
    """
    try:
        index = row_index(table, entry)
    except ValueError:
        return None, []
    row = table.rows[index]
    ids = [f"row{index}"]
    if row.reason is not None:
        ids.append(f"stops_{row.source}")
    elif row.trigger == "finalize":
        ids.append(f"finalize_{row.source}")
    return index, ids


def checked(run_id: str, data: dict[str, Any], table: Table = TABLE) -> tuple[dict[str, Any], Run]:
    """The snapshot as a resume reads it (an older version brought up to date) and the run it loads into.

    ``SnapshotError`` naming the run and the field at fault for a snapshot a
    store would refuse to save (malformed steps, messages or trace entries, a
    state not of ``table``, a negative counter): a store written by an older
    version or by hand may still hold one, and the page says it is corrupted
    instead of drawing a run that is not there.
    """
    try:
        parsed = snapshots.parse(data)
        run = Run(snapshots.limits_of(parsed), [], table=table)
        snapshots.load(run, parsed, table.states)
    except snapshots.SnapshotError as exc:
        msg = f"stored run {run_id!r} is corrupted: {exc}"
        raise snapshots.SnapshotError(msg) from exc
    return parsed, run


def current_counters(data: dict[str, Any], table: Table) -> dict[str, Any] | None:
    """Every counter against its limit as the run stands, by loading the snapshot into a run; None if it won't load."""
    try:
        run = Run(snapshots.limits_of(data), [], table=table)
        snapshots.load(run, data, table.states)
    except (snapshots.SnapshotError, KeyError, TypeError, ValueError):
        return None
    return dict(run.counters())


def _calls_by_id(messages: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    return {call["id"]: call for message in messages for call in message.get("tool_calls") or () if "id" in call}


def _next(messages: list[dict[str, Any]], start: int, role: str) -> int | None:
    return next((i for i in range(start, len(messages)) if messages[i].get("role") == role), None)


def _prior(data: dict[str, Any], messages: list[dict[str, Any]]) -> int:
    """Where the run's own messages start (``0`` if the snapshot predates histories or says nonsense)."""
    prior = data.get("prior", 0)
    return prior if isinstance(prior, int) and not isinstance(prior, bool) and 0 <= prior <= len(messages) else 0


def moments(data: dict[str, Any], table: Table = TABLE) -> list[dict[str, Any]]:
    """One entry per transition of the stored run: the edge, and what it brought (messages, call, counters)."""
    messages: list[dict[str, Any]] = list(data.get("messages") or [])
    steps: list[dict[str, Any]] = list(data.get("steps") or [])
    trace = [Transition(**entry) for entry in data.get("trace") or []]
    calls = _calls_by_id(messages)
    labels = {edge.index: (edge.label, edge.tooltip) for edge in diagram_edges(table)}
    tool_steps = iter(step for step in steps if step.get("kind") == "tool_call")
    final_steps = iter(step for step in steps if step.get("kind") == "final")
    sent_back = iter(step for step in steps if step.get("kind") == "output_invalid")
    compactions = iter(step for step in steps if step.get("kind") == "compaction")
    first_reply = _next(messages, _prior(data, messages), "assistant")  # a history's replies are not this run's
    cursor = len(messages) if first_reply is None else first_reply
    counters: dict[str, Any] | None = None
    counted_from = ""
    turn = made = 0
    out: list[dict[str, Any]] = []
    for position, entry in enumerate(trace):
        start = cursor
        call = result = child = None
        if entry.source == State.AwaitModel and entry.trigger in MODEL_EDGES:
            turn += 1
            found = _next(messages, cursor, "assistant")
            cursor = cursor if found is None else found + 1
        elif entry.source == State.ExecuteTool and entry.trigger in TOOL_EDGES:
            found = _next(messages, cursor, "tool")
            if found is not None:
                cursor = found + 1
                result = messages[found]
                call = calls.get(result.get("tool_call_id") or "")
            step = next(tool_steps, None)
            if step is not None:
                child = step.get("child")  # the sub-agent run the call was, if it was one
                made += 1  # a step's index is its model turn, shared by the turn's calls: the call is numbered
                counters, counted_from = step.get("counters"), f"after tool call {made}"
        elif entry.guard == "output_invalid":
            # A typed answer sent back: the edge brings the message telling the model what was wrong.
            found = _next(messages, cursor, "user")
            cursor = cursor if found is None else found + 1
            step = next(sent_back, None)
            if step is not None:
                counters, counted_from = step.get("counters"), "after the answer was sent back"
        elif entry.guard == "compacts_history":
            step = next(compactions, None)  # the history the model is sent was shortened; the run's is kept
            if step is not None:
                counters, counted_from = step.get("counters"), f"after the compaction ({step.get('detail')})"
        elif entry.dest == State.Done:
            step = next(final_steps, None)
            if step is not None:
                counters, counted_from = step.get("counters"), "after the final answer"
        index, ids = edge_ids(table, entry)
        fallback = (entry.reason or entry.guard or entry.trigger, "")
        label, tooltip = labels[index] if index is not None else fallback
        out.append(
            {
                "index": position,
                "source": entry.source,
                "trigger": entry.trigger,
                "dest": entry.dest,
                "guard": entry.guard,
                "reason": entry.reason,
                "row": index,
                "ids": ids,
                "label": label,
                "tooltip": tooltip,
                "turn": turn,
                "messages": [start, cursor],
                "call": call,
                "result": result,
                "child": child if isinstance(child, str) else None,
                "counters": counters,
                "counted_from": counted_from,
                "evidence": None,
            }
        )
    _fill_calls_being_dispatched(out)
    if out:
        _finish(out[-1], data, table, len(messages))
    return out


def _fill_calls_being_dispatched(out: list[dict[str, Any]]) -> None:
    """A ``Dispatch -> ExecuteTool`` edge shows the call it dispatches: the one the next tool edge ran."""
    for position, moment in enumerate(out):
        if moment["source"] == State.Dispatch and moment["dest"] == State.ExecuteTool:
            following = next((m for m in out[position + 1 :] if m["source"] == State.ExecuteTool), None)
            if following is not None and following["trigger"] in TOOL_EDGES:
                moment["call"], moment["child"] = following["call"], following["child"]


def _finish(last: dict[str, Any], data: dict[str, Any], table: Table, message_count: int) -> None:
    """The last transition brings whatever came after it, the counters as they stand, and the stop's evidence."""
    last["messages"][1] = message_count
    now = current_counters(data, table)
    if now is not None:
        last["counters"], last["counted_from"] = now, "as the run stands now"
    evidence = data.get("evidence") or {}
    if last["reason"] is not None or last["dest"] == State.Done:
        last["evidence"] = evidence or None
    if last["call"] is None and last["source"] == State.Dispatch and data.get("pending"):
        last["call"] = data["pending"][0]  # the call a stop at Dispatch did not make


def sub_agent_runs(run_id: str, data: dict[str, Any]) -> list[dict[str, Any]]:
    """The sub-agent runs the run's tool calls were, in call order: each one's run id, call id and tool name.

    Read from the steps (a step of a sub-agent call names its run); a call
    still in flight has no step yet (the app looks for its run in the store).
    """
    calls = _calls_by_id(list(data.get("messages") or []))
    out: list[dict[str, Any]] = []
    for step in data.get("steps") or ():
        child = step.get("child") if isinstance(step, dict) else None
        if isinstance(child, str) and child not in (known["run_id"] for known in out):
            out.append(_sub_agent_run(run_id, child, calls))
    return out


def _sub_agent_run(run_id: str, child: str, calls: dict[str, dict[str, Any]]) -> dict[str, Any]:
    prefix = run_id + "/"
    call_id = child[len(prefix) :] if child.startswith(prefix) else None
    tool = (calls.get(call_id) or {}).get("name") if call_id is not None else None
    return {"run_id": child, "call_id": call_id, "tool": tool}


def parent_of(run_id: str, data: dict[str, Any]) -> tuple[str | None, str | None]:
    """The run whose tool call this run is (its snapshot's ``parent_run_id``) and that call's id, or Nones."""
    parent = data.get("parent_run_id")
    if not isinstance(parent, str) or not parent:
        return None, None
    prefix = parent + "/"
    return parent, run_id[len(prefix) :] if run_id.startswith(prefix) else None


def digest(run_id: str, data: dict[str, Any], table: Table = TABLE) -> dict[str, Any]:
    """Everything the run page shows about one stored run, as JSON-ready data; ``SnapshotError`` if it is corrupted."""
    data, run = checked(run_id, data, table)
    state = str(data.get("state"))
    parent, parent_call = parent_of(run_id, data)
    paused = bool(data.get("paused"))
    terminal = state in {str(s) for s in table.terminal}
    counters = dict(run.counters())
    raw = data.get("counters") or {}
    return {
        "run_id": run_id,
        # The stored version this page was read at: two pages of one version are the same run, a later one is newer.
        "version": data.get(VERSION_KEY),
        "state": state,
        "reason": data.get("reason"),
        "paused": paused,
        "live": not terminal and not paused,
        "final": data.get("final") or "",
        "error": data.get("error"),
        "evidence": data.get("evidence") or {},
        "messages": data.get("messages") or [],
        "pending": data.get("pending") or [],
        "approvals": data.get("approvals") or {},
        "counters": counters,
        "tokens": int(raw.get("input_tokens", 0)) + int(raw.get("output_tokens", 0)),
        # US dollars, None where a call was unpriced (or the run was stored before runs were priced).
        "cost": None if raw.get("unpriced", 1) else raw.get("cost"),
        # A step is a model turn, as max_steps counts them; the snapshot's Step records are calls and the answer.
        "steps": int(raw.get("turns", 0)),
        "tool_calls": int(raw.get("tool_calls", 0)),
        "moments": moments(data, table),
        # A sub-agent's run names the run and call it was; a parent its sub-agent runs (see sub_agent_runs).
        "parent_run_id": parent,
        "parent_call_id": parent_call,
        "children": sub_agent_runs(run_id, data),
        # A fork names the run and the transition it was forked at (Agent.fork); the page links to it.
        "forked_from": fork_origin(data.get("forked_from")),
    }
