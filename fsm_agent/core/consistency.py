"""Whether a run read back from a snapshot agrees with itself: its counters with what they count.

A snapshot is data anyone can write, and a contradictory one would resume
as a silently wrong run (a failure count above the calls made, outcomes kept
for calls nobody asked for), so ``snapshot.load`` refuses it, naming each
contradiction found here.
"""

from __future__ import annotations

from fsm_agent.core.hand_down import origins
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.triggers import RESUME


def contradictions(run: Run) -> list[str]:
    """Where a loaded run's counters disagree with the messages, steps and trace they summarise (its own, after
    ``prior``), and its pending calls with the outcomes and decisions kept for them; empty when none do."""
    problems: list[str] = []
    own = run.talk.messages[run.talk.prior :] if run.talk.prior else run.talk.messages
    executed = sum(1 for s in run.talk.steps if s.kind == "tool_call")
    # tool_calls also counts the calls of the run's sub-agents, which its steps name but do not count, and those
    # a sub-agent run cut in flight completed, counted at the cut whatever its call's outcome: its cut_shares entry
    # is the evidence (or, in a snapshot from before they were kept, its cut_children entry, kept until a child's
    # outcome answers the call: its step names the child then).
    nested = bool(run.calls.cut_shares or run.calls.cut_children) or any(s.child for s in run.talk.steps)
    if executed != run.counts.tool_calls and not (nested and executed < run.counts.tool_calls):
        problems.append(f"tool_calls is {run.counts.tool_calls} but {executed} tool steps are recorded")
    by_tool = sum(run.counts.calls_by_tool.values())
    if by_tool != run.counts.tool_calls and not (nested and by_tool < run.counts.tool_calls):
        problems.append(f"calls_by_tool adds up to {by_tool}, not tool_calls={run.counts.tool_calls}")
    if run.counts.failures > run.counts.tool_calls:
        problems.append(f"failures is {run.counts.failures} but only {run.counts.tool_calls} tool calls ran")
    replies = sum(1 for m in own if m.role == "assistant")
    if replies > run.counts.turns:
        problems.append(f"turns is {run.counts.turns} but {replies} assistant messages are recorded")
    tool_messages = sum(1 for m in own if m.role == "tool")
    if tool_messages < executed:
        problems.append(f"{executed} tool calls ran but only {tool_messages} tool messages are recorded")
    if run.at.trace and run.at.trace[-1].dest != run.at.state:
        problems.append(f"the trace ends in {run.at.trace[-1].dest} but the state is {run.at.state}")
    for before, after in zip(run.at.trace, run.at.trace[1:], strict=False):
        if before.dest != after.source:
            problems.append(f"the trace breaks between {before.dest} and {after.source}")
            break
    resumes = [at for at, _ in run.at.earlier_limits]
    misplaced = [at for at in resumes if at >= len(run.at.trace) or run.at.trace[at].trigger != RESUME]
    if misplaced or resumes != sorted(resumes):
        problems.append(f"earlier_limits names transitions {resumes}, not the trace's resume edges in order")
    beyond = sorted({at for at, _, _ in run.calls.cut_shares} | set(run.calls.cuts_taken_back))
    if beyond and beyond[-1] > len(run.at.trace):
        problems.append(
            f"cut_shares or cuts_taken_back name transitions {beyond}, past the trace's {len(run.at.trace)}"
        )
    if run.at.state is State.ExecuteTool and not run.calls.pending:
        problems.append("the state is ExecuteTool but no tool call is pending")
    pending = {call.id for call in run.calls.pending}
    strays = sorted(set(run.calls.ran) - pending)
    if strays:
        problems.append(f"kept tool outcomes {strays} answer no pending call")
    strays = sorted(run.calls.to_approve - pending)
    if strays:
        problems.append(f"calls {strays} wait for a decision but are not pending")
    if run.calls.prepaid:
        strays = sorted(run.calls.prepaid - _held_origins(run))
        if strays:
            problems.append(f"prepaid names {strays}, outcomes the run neither took nor holds")
    return problems


def _held_origins(run: Run) -> set[str]:
    """Where each outcome ``run`` took (its steps, its kept outcomes) or holds handed to it came from (``reused_from``).

    Why: ``prepaid`` marks some of them as counted by a cut; a mark naming
    none of them would count nothing, or a later outcome of that name wrongly.
    """
    taken = [*(step.reused_from for step in run.talk.steps), *(r.reused_from for r in run.calls.ran.values())]
    held = origins(run.calls.carried).union(*(origins(outcomes) for _, _, outcomes in run.calls.carried_down))
    return held | {origin for origin in taken if origin is not None}
