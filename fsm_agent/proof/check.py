"""``check(agent)``: prove that every run of an agent stops, within what, and which stops it can reach.

The questions users ask of an agent loop ("will it always stop, and within
what?", "can this stop ever happen with my agent?") are decidable here: the
loop is a finite table, and the checker explores it as a finite system
(``proof.model``).  The answer is a ``Proof``: whether the properties hold,
the bound, the reachable and unreachable stops, the rows no run can take,
and, when termination fails, the shortest run into a loop that never ends.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from fsm_agent.definition.guards import HOLDS
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.table import Row, Table
from fsm_agent.definition.triggers import FINALIZE, RESUME
from fsm_agent.persist.every import check_every
from fsm_agent.proof.graph import Graph
from fsm_agent.proof.model import Explorer, Move, Setup
from fsm_agent.records import Transition


@attrs.frozen
class StopPath:
    """The shortest run to one ending: its edges and what the model, the tools and the world did on each."""

    reason: str
    moves: tuple[Move, ...]

    @property
    def edges(self) -> tuple[Transition, ...]:
        """The transitions taken, in order."""
        return tuple(move.entry for move in self.moves)


@attrs.frozen
class Proof:
    """What the checker proved (or refuted) of one agent's table under its limits.

    ``ok``: every run reaches ``Done`` or ``Failed``.  ``bound``: the most
    transitions any run takes (finalize included), ``None`` when replies may
    ask for any number of tool calls and no cap bounds them (each run still
    stops: a turn's calls are finite); ``model_calls``: the most model calls
    any run makes.  Both count one attempt: a run resumed after a stop keeps
    its trace, and each resume adds its edge and at most ``bound`` more
    transitions and ``model_calls`` more model calls under the limits it
    resumes with (across attempts they add up).
    ``reachable`` and ``unreachable``: the labels of the edges some run can
    or no run can end on (``done`` included among the first), from its start
    to its first stop (a resumed run starts mid-way, its counters carried
    over): the reasons runs end with, except that a run a ``finalize`` policy finishes
    ends on ``done`` or ``finalize_failed`` while its ``RunResult.reason``
    stays the stop that asked for the finalize call;
    ``dead_rows``: the rows no run can take before its first stop.  ``counterexample``: on failure,
    the shortest run into a loop that can repeat forever, the loop last.
    ``paths``: the shortest run to each reachable ending, for the test writer.
    """

    ok: bool
    bound: int | None
    model_calls: int | None
    reachable: tuple[str, ...]
    unreachable: tuple[str, ...]
    dead_rows: tuple[Row, ...]
    counterexample: tuple[Transition, ...] = ()
    loop_start: int | None = None
    """The index in ``counterexample`` where the endless loop begins."""
    crash_safe: bool = True
    """A process killed anywhere runs again at most the call in flight: no call's outcome (a model's reply, a tool's
    result) is still unwritten when the next call begins, under the store's ``every`` (see ``persist.every.EVERY``)."""
    approval_safe: bool = True
    """No tool call the approval rule holds back is made before a person's decision (vacuous without ``approve=``)."""
    approval_counterexample: tuple[Transition, ...] = ()
    """On ``approval_safe`` false: the shortest run to a call made while it waits for a decision."""
    crash_counterexample: tuple[Transition, ...] = ()
    """On ``crash_safe`` false: the shortest run to a call that begins while an earlier call's outcome is unwritten."""
    every: str = "call"
    paths: Mapping[str, StopPath] = attrs.field(factory=dict, repr=False)
    configs: int = 0
    """How many abstract configs the checker explored."""
    notes: tuple[str, ...] = ()
    children: Mapping[str, Proof] = attrs.field(factory=dict, repr=False)
    """Each sub-agent tool's proof, of its runs under this agent: with the limits this agent hands down added."""

    def report(self) -> str:
        """The proof in words, as ``python -m fsm_agent check`` prints it."""
        lines = ["every run stops: " + ("yes" if self.ok else "NO")]
        if self.ok:
            calls = f"{self.model_calls} model call(s)"
            if self.bound is None:
                lines.append(f"bound: at most {calls}; transitions: open (replies may ask for any number of calls)")
            else:
                lines.append(f"bound: at most {self.bound} transitions, {calls}")
        else:
            lines.append("counterexample (the loop repeats from the edge marked *):")
            for n, edge in enumerate(self.counterexample):
                mark = "*" if n == self.loop_start else " "
                lines.append(f"  {mark} {n:>3} {edge_text(edge)}")
        if not self.approval_safe:
            lines.append("approval safe: NO, a held call may run before its decision:")
            lines.extend(f"    {n:>3} {edge_text(edge)}" for n, edge in enumerate(self.approval_counterexample))
        if self.crash_safe:
            lines.append(f"crash safe (every={self.every!r}): a crash runs again at most the call in flight")
        else:
            lines.append(f"crash safe (every={self.every!r}): NO, a completed call may run again after a crash:")
            lines.extend(f"    {n:>3} {edge_text(edge)}" for n, edge in enumerate(self.crash_counterexample))
        lines.append("reachable: " + (", ".join(self.reachable) or "none"))
        lines.append("unreachable: " + (", ".join(self.unreachable) or "none"))
        if self.dead_rows:
            lines.append("rows no run takes: " + ", ".join(f"{row} on {row.trigger}" for row in self.dead_rows))
        for name, inner in self.children.items():
            lines.append(
                f"sub-agent {name!r}, under the limits handed down: every run stops: {'yes' if inner.ok else 'NO'}; "
                "reachable: " + (", ".join(inner.reachable) or "none")
            )
        lines.extend(f"note: {note}" for note in self.notes)
        lines.append(f"({self.configs} abstract configs explored)")
        return "\n".join(lines)


def edge_text(edge: Transition) -> str:
    """An edge as the report prints it: ``Source->Dest[label] on trigger``."""
    label = edge.reason or edge.guard
    return f"{edge.source}->{edge.dest}" + (f"[{label}]" if label else "") + f" on {edge.trigger}"


def check(agent_or_table: Any, *, calls_per_reply: int | None = None, every: str = "call", **limits: Any) -> Proof:
    """Explore every run of ``agent_or_table`` under its limits (``limits`` override them) and prove it stops.

    An ``Agent`` is checked with its own table, limits, policies and parts;
    a ``Table`` with default limits and every optional part present (a typed
    answer, strict hooks, a sub-agent that passes its stop on, an approval
    rule, and each stop under any policy: a ``finalize`` call, ``compact``,
    or the end of the run), so no reason or row is called unreachable for
    want of a part.  ``calls_per_reply`` caps the tool calls a reply is
    taken to ask for (the total ``max_tool_calls`` cap, when the agent has
    one, is used if not given).  ``every`` is the store's checkpoint setting
    the crash safety is judged under.  ``limits`` are ``Limits`` fields; any
    other name is a ``TypeError`` naming them.
    """
    setup = attrs.evolve(setup_of(agent_or_table, calls_per_reply, limits), every=check_every(every))
    return _with_children(prove(setup), agent_or_table, setup.limits)


def _with_children(proof: Proof, agent_or_table: Any, limits: Limits) -> Proof:
    """The proof with each sub-agent's (``Proof.children``), and not crash safe if a sub-agent is not.

    A sub-agent's run gets what this agent has left of its time, budgets and
    tool calls as limits (``drivers.child_runs``), so each is checked under
    its own limits with this agent's added where it has none of the kind: it
    may stop on them.  Its run writes to the parent's store under the same
    ``every``, with replies of its own (``calls_per_reply`` is the parent's);
    a crash inside one re-runs what its own run left unwritten, so its
    counterexample is of its run.
    """
    if isinstance(agent_or_table, Table):
        return proof
    children = {
        name: check(child.agent, every=proof.every, **handed_down(limits, child.agent.limits))
        for name, child in agent_or_table.children().items()
    }
    proof = attrs.evolve(proof, children=children)
    unsafe = next((name for name, inner in children.items() if not inner.crash_safe), None)
    if not proof.crash_safe or unsafe is None:
        return proof
    note = f"the sub-agent tool {unsafe!r} is not crash safe under every={proof.every!r}: the counterexample is its run"
    counterexample = children[unsafe].crash_counterexample
    return attrs.evolve(proof, crash_safe=False, crash_counterexample=counterexample, notes=(*proof.notes, note))


def handed_down(parent: Limits, own: Limits) -> dict[str, Any]:
    """The limits of ``parent``'s kinds a sub-agent with ``own`` limits does not have, which its runs get.

    Why: a sub-agent's run is held to the parent's remaining time, and to
    shares of its tokens, dollars and tool calls (``drivers.child_runs``),
    whatever its own agent says; the parent's whole limit bounds each share.
    """
    added: dict[str, Any] = {
        name: getattr(parent, name)
        for name in ("timeout", "token_budget", "cost_budget")
        if getattr(parent, name) is not None and getattr(own, name) is None
    }
    total = parent.total_tool_calls
    if total is not None and own.total_tool_calls is None:
        caps = own.max_tool_calls
        added["max_tool_calls"] = {**caps, "*": total} if isinstance(caps, dict) else total
    return added


def prove(setup: Setup) -> Proof:
    """Explore every abstract run of ``setup`` and answer the checker's questions of them."""
    graph = Graph(Explorer(setup))
    loop = graph.endless_loop()
    endings = graph.endings()
    reasons = ("done", *setup.table.reasons)
    taken = {move.row for moves in graph.moves.values() for move in moves}
    bound, model_calls = graph.longest() if loop is None else (None, None)
    notes = []
    if loop is None and bound is None:
        notes.append(_open_bound(setup.limits))
    window = graph.crash_window(setup.every)
    gap = graph.approval_gap(HOLDS) if setup.gated else None
    return Proof(
        ok=loop is None,
        bound=bound,
        model_calls=model_calls,
        reachable=tuple(r for r in reasons if r in endings),
        unreachable=tuple(r for r in reasons if r not in endings),
        dead_rows=tuple(
            row
            for row in setup.table.rows
            if row not in taken and row.trigger != RESUME and (row.trigger != FINALIZE or _finalizes(setup, row))
        ),
        counterexample=() if loop is None else tuple(m.entry for m in loop),
        loop_start=None if loop is None else graph.loop_start,
        approval_safe=gap is None,
        approval_counterexample=() if gap is None else tuple(m.entry for m in gap),
        crash_safe=window is None,
        crash_counterexample=() if window is None else tuple(m.entry for m in window),
        every=setup.every,
        paths={reason: StopPath(reason, tuple(graph.path_to(config))) for reason, config in endings.items()},
        configs=len(graph.moves),
        notes=tuple(notes),
    )


def _open_bound(limits: Limits) -> str:
    """The note on an open bound in transitions, naming what would close it (a per-tool cap does not)."""
    said = "a reply may ask for any number of tool calls"
    if limits.max_tool_calls is not None and limits.total_tool_calls is None:  # per-tool caps only
        said += ", and caps per tool do not bound them"
    close = "give calls_per_reply, or a total cap (max_tool_calls=N or its '*' entry), for a bound in transitions"
    return f"{said}: {close}"


def _finalizes(setup: Setup, row: Row) -> bool:
    """A finalize row counts as dead only when its stop's policy asks for finalize (else it is off by choice)."""
    name = row.guard_name or ""
    return any(setup.may(reason, "finalize") for reason in setup.table.reasons if name.endswith("_" + reason))


def setup_of(agent_or_table: Any, calls_per_reply: int | None, limits: Mapping[str, Any]) -> Setup:
    """What the checker reads of an ``Agent`` or a ``Table``: a clear error for anything else."""
    if calls_per_reply is not None and (
        isinstance(calls_per_reply, bool) or not isinstance(calls_per_reply, int) or calls_per_reply < 1
    ):
        msg = f"calls_per_reply must be None or an integer >= 1, got {calls_per_reply!r}"
        raise ValueError(msg)
    known = tuple(field.name for field in attrs.fields(Limits))
    unknown = [name for name in limits if name not in known]
    if unknown:
        msg = (
            f"check() got an unknown limit {unknown[0]!r}; the limits it takes: {', '.join(known)} "
            "(besides calls_per_reply and every)"
        )
        raise TypeError(msg)
    if isinstance(agent_or_table, Table):
        base = Limits()
        found = attrs.evolve(base, **limits) if limits else base
        cap = calls_per_reply if calls_per_reply is not None else _cap(found)
        return Setup(
            agent_or_table,
            found,
            typed=True,
            output_retries=1,
            strict_hooks=True,
            child_raises=True,
            gated=True,
            calls_per_reply=cap,
            children=True,
            any_policy=True,
        )
    from fsm_agent.drivers.agent import Agent  # the checker reads an agent; the drivers never read the checker

    if not isinstance(agent_or_table, Agent):
        msg = f"check takes an Agent or a Table, got {type(agent_or_table).__name__}"
        raise TypeError(msg)
    settings = agent_or_table.settings
    found = attrs.evolve(settings.limits, **limits) if limits else settings.limits
    cap = calls_per_reply if calls_per_reply is not None else _cap(found)
    policies = dict(settings.on_stop)
    if settings.compact is None:
        policies.pop("context_overflow", None)
    output = settings.output
    children = agent_or_table.children()
    child_raises = any(child.on_child_stop == "raise" for child in children.values())
    return Setup(
        settings.table,
        found,
        policies,
        typed=output is not None,
        output_retries=0 if output is None else output.retries,
        strict_hooks=settings.strict_hooks,
        child_raises=child_raises,
        gated=settings.approve is not None,
        calls_per_reply=cap,
        children=bool(children),
    )


def _cap(limits: Limits) -> int | None:
    """A reply's calls beyond the run's cap stop it at the cap, so the cap (plus one) bounds them."""
    total = limits.total_tool_calls
    return None if total is None else total + 1
