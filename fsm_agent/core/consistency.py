"""Whether a run read back from a snapshot agrees with itself: its counters with what they count.

A snapshot is data anyone can write, and a contradictory one would resume
as a silently wrong run (a failure count above the calls made, outcomes kept
for calls nobody asked for), so ``snapshot.load`` refuses it, naming each
contradiction found here.
"""

from __future__ import annotations

from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State


def contradictions(run: Run) -> list[str]:
    """Where a loaded run's counters disagree with the messages, steps and trace they summarise (its own, after
    ``prior``), and its pending calls with the outcomes and decisions kept for them; empty when none do."""
    problems: list[str] = []
    own = run.messages[run.prior :] if run.prior else run.messages
    executed = sum(1 for s in run.steps if s.kind == "tool_call")
    # tool_calls also counts the calls of the run's sub-agents, which its steps name but do not count.
    nested = any(s.child for s in run.steps)
    if executed != run.tool_calls and not (nested and executed < run.tool_calls):
        problems.append(f"tool_calls is {run.tool_calls} but {executed} tool steps are recorded")
    by_tool = sum(run.calls_by_tool.values())
    if by_tool != run.tool_calls and not (nested and by_tool < run.tool_calls):
        problems.append(f"calls_by_tool adds up to {by_tool}, not tool_calls={run.tool_calls}")
    if run.failures > run.tool_calls:
        problems.append(f"failures is {run.failures} but only {run.tool_calls} tool calls ran")
    replies = sum(1 for m in own if m.role == "assistant")
    if replies > run.turns:
        problems.append(f"turns is {run.turns} but {replies} assistant messages are recorded")
    tool_messages = sum(1 for m in own if m.role == "tool")
    if tool_messages < executed:
        problems.append(f"{executed} tool calls ran but only {tool_messages} tool messages are recorded")
    if run.trace and run.trace[-1].dest != run.state:
        problems.append(f"the trace ends in {run.trace[-1].dest} but the state is {run.state}")
    for before, after in zip(run.trace, run.trace[1:], strict=False):
        if before.dest != after.source:
            problems.append(f"the trace breaks between {before.dest} and {after.source}")
            break
    if run.state is State.ExecuteTool and not run.pending:
        problems.append("the state is ExecuteTool but no tool call is pending")
    pending = {call.id for call in run.pending}
    strays = sorted(set(run.ran) - pending)
    if strays:
        problems.append(f"kept tool outcomes {strays} answer no pending call")
    strays = sorted(run.to_approve - pending)
    if strays:
        problems.append(f"calls {strays} wait for a decision but are not pending")
    return problems
