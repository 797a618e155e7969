"""Agents that call agents: ``Agent.as_tool``, the tool it registers, and the checks of a registry's sub-agents.

The tool is an ordinary function a registry accepts (one string argument,
``input``); a parent's driver recognises it and runs the child itself, so the
child is bounded by what the parent's run already knows, never by globals:
the parent's remaining deadline, token budget and cost budget become the
child's limits (each no larger than the child agent's own), the parent's
cancel token is the child's, and the child's tokens, dollars and model calls
count against the parent (``drivers.child_runs`` runs the call).  The child's
tools get the parent run's ``deps`` unless the tool was given its own.  A child that stops is a tool error
carrying its reason and evidence (and the text it ended with, a finalize
call's answer say, or its typed output), or, with ``on_child_stop="raise"``,
stops the parent with ``child_stopped``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Literal

import attrs

from fsm_agent.records import RunResult
from fsm_agent.tools.registry import ToolRegistry

if TYPE_CHECKING:
    from fsm_agent.drivers.agent import Agent
    from fsm_agent.drivers.agent_parts import AgentParts

OnChildStop = Literal["error", "raise"]
PARAMETERS = {
    "type": "object",
    "properties": {"input": {"type": "string"}},
    "required": ["input"],
    "additionalProperties": False,
}
FINISHED = frozenset({"Done", "Failed"})


@attrs.frozen
class ChildTool:
    """What ``Agent.as_tool`` registers: the child agent and what a stop of its run does to the parent."""

    agent: Agent
    name: str
    on_child_stop: OnChildStop = "error"
    deps: Any = attrs.field(default=None, eq=False, repr=False)
    """The child runs' own deps (``as_tool(..., deps=...)``); None: the parent run's."""


def as_tool(
    agent: Agent, name: str, description: str, on_child_stop: OnChildStop, deps: Any = None
) -> Callable[[str], Any]:
    """A function to register: called by a parent's run it runs ``agent`` as a child; called directly, plainly."""
    if on_child_stop not in ("error", "raise"):
        msg = f"on_child_stop must be 'error' or 'raise', got {on_child_stop!r}"
        raise ValueError(msg)
    if not isinstance(description, str) or not description.strip():
        msg = "as_tool needs a description: it is all the parent's model knows of what the agent does"
        raise ValueError(msg)
    child = ChildTool(agent, name, on_child_stop, deps)

    def tool(input: str) -> Any:  # noqa: A002 - the argument the model fills is called input
        return answer_of(agent.run(input, deps=deps))

    tool.__name__ = tool.__qualname__ = name
    tool.__doc__ = description
    tool.child = child  # type: ignore[attr-defined]  # how a parent's driver recognises the tool
    return tool


def child_of(function: object) -> ChildTool | None:
    """The sub-agent behind a registered function, or None for an ordinary tool."""
    found = getattr(function, "child", None)
    return found if isinstance(found, ChildTool) else None


def children_in(registry: ToolRegistry) -> tuple[dict[str, ChildTool], bool]:
    """The sub-agent tools of ``registry`` by name, and whether one passes its stop on (``on_child_stop="raise"``)."""
    found = {name: child_of(tool.function) for name in registry if (tool := registry.get(name)) is not None}
    children = {name: child for name, child in found.items() if child is not None}
    return children, any(child.on_child_stop == "raise" for child in children.values())


def check_no_cycle(agent: AgentParts) -> None:
    """Refuse an agent that is, directly or through other agents' tools, its own sub-agent.

    Each call of such an agent could start another run of it without end
    (the process would die of a ``RecursionError``).  Checked whenever the
    agent's tools change, before any run of it starts; a cycle closed later
    through another agent's registry is found when that agent's tools are
    next read, at the latest when the call that would close it starts.
    """
    stack: list[tuple[AgentParts, tuple[str, ...]]] = [(agent, ())]
    seen: list[AgentParts] = []
    while stack:
        current, through = stack.pop()
        for name, child in children_in(current.registry)[0].items():
            path = (*through, name)
            if child.agent is agent:
                names = " -> ".join(repr(step) for step in path)
                msg = f"the agent is its own sub-agent through {names}: each call would start it again without end"
                raise ValueError(msg)
            if not any(child.agent is known for known in seen):
                seen.append(child.agent)
                stack.append((child.agent, path))


def answer_of(result: RunResult) -> Any:
    """A finished child's answer as the tool's JSON value: its typed output, else its final text.

    The output is dumped in pydantic's JSON mode, as pydantic checked it
    (a pydantic model, a dataclass or a TypedDict): a ``date`` is its ISO
    text, as in the answer the model gave.  A JSON Schema's output is plain
    JSON already, and needs no pydantic (nor has it, without the extra).
    """
    output = result.output
    if output is None:
        return result.final
    if isinstance(output, str):
        return output
    if hasattr(output, "model_dump"):
        return output.model_dump(mode="json")
    try:
        from pydantic_core import to_jsonable_python  # pydantic: the optional output extra
    except ImportError:
        if dataclasses.is_dataclass(output) and not isinstance(output, type):
            return dataclasses.asdict(output)
        return output
    return to_jsonable_python(output)
