"""What an agent's runs are built from: its settings read through, its tools' parts, the rows a run walks, hooks.

``Agent`` (``drivers.agent``) adds the entry points that start, resume and
fork runs; this half is what every one of them reads, so it stays apart
from how a run begins.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from fsm_agent.core.output import OutputSpec
from fsm_agent.core.settings import AgentSettings
from fsm_agent.definition.guards import Guard, dormant_guards, passes_child_stop
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.stops import StopCondition
from fsm_agent.definition.table import Row, Table
from fsm_agent.drivers.checks import (
    PLAIN_UNUSED,
    Parts,
    check_tools_named,
    parts_of,
    plain_parts,
    schemas_of,
)
from fsm_agent.drivers.child import ChildTool, check_no_cycle
from fsm_agent.drivers.position import ReadThrough
from fsm_agent.observe.events import Hook, HookName, Hooks
from fsm_agent.tools import JSONSchema, ToolRegistry


class AgentParts:
    """The half of an agent its runs read: settings, parts and rows, kept per agent; ``Agent`` adds the runs."""

    settings: AgentSettings
    registry: ToolRegistry
    hooks: Hooks
    run_parts: Parts
    _fresh_rows: dict[tuple[bool, tuple[Guard, ...]], Mapping[tuple[State, str], tuple[Row, ...]]]

    # The settings users read on the agent itself, as before: fields of the frozen record, never set here.
    limits = ReadThrough[Limits]("settings")
    table = ReadThrough[Table]("settings")
    on_stop = ReadThrough[Mapping[str, str]]("settings")
    stop_conditions = ReadThrough[tuple[StopCondition, ...]]("settings")
    output = ReadThrough[OutputSpec | None]("settings")

    def children(self) -> Mapping[str, ChildTool]:
        """The registry's sub-agent tools by name."""
        parts = self.run_parts
        return (parts if parts[0] == self.registry.version else self.refresh_parts())[1]

    def refresh_parts(self) -> Parts:
        """``run_parts`` again after the tools changed: their version, sub-agents, dormant guards and schemas.

        The tools ``approve=`` and ``max_tool_calls`` name are checked against them first.

        The guards are those of parts the agent lacks; the schemas ``tool_schemas``'s, each run's copied from them.
        Those of an agent without a typed answer or compaction (most) are the same for all such agents, so kept in
        the registry: a fresh agent per request finds them.
        """
        registry = self.registry
        check_tools_named(self.settings, registry)
        unused = self.settings.unused_guards
        if unused is PLAIN_UNUSED:
            parts = registry.cached("plain parts", plain_parts)
            if parts[1]:  # the sub-agents, found again after the tools changed: none is the agent itself
                check_no_cycle(self)
            self.run_parts = parts
            return parts
        children, raising, schemas = registry.cached("parts", parts_of)
        if children:
            check_no_cycle(self)
        dormant = unused if raising else (*unused, passes_child_stop)
        self.run_parts = (registry.version, children, dormant, schemas)
        return self.run_parts

    def rows_for(
        self, run: Run, cancellable: bool, unused: tuple[Guard, ...]
    ) -> Mapping[tuple[State, str], tuple[Row, ...]]:
        """The rows ``run`` walks: the table's without those whose guards cannot hold (see ``dormant_guards``).

        A new run under the agent's own limits (most runs) gets those found for an earlier run of this agent.
        """
        fresh = run.limits is self.settings.limits and not run.at.trace and run.at.finalizing is None
        found = self._fresh_rows.get((cancellable, unused)) if fresh else None
        if found is None:
            dormant = dormant_guards(run, strict_hooks=self.settings.strict_hooks, cancellable=cancellable, also=unused)
            found = self.settings.walker.rows_without(dormant)
            if fresh:
                self._fresh_rows[cancellable, unused] = found
        return found

    def tool_schemas(self) -> list[JSONSchema]:
        """The schemas of the registry's tools as the model is offered them: a list of this run's own.

        Building them costs as much as a transition and every run offers the
        same tools, so they are kept in the registry until its tools change,
        for every agent over it (a fresh agent per request included).
        """
        cached = getattr(self.registry, "cached", None)
        if cached is None:  # a registry of another kind: ask it every time
            return self.registry.schemas()
        return list(cached("schemas", schemas_of))

    def on(self, name: HookName, hook: Hook | None = None) -> Any:
        """Register an observer: ``agent.on("transition", fn)`` or ``@agent.on("enter:ExecuteTool")``.

        Names: ``transition`` and ``failed`` (a ``TransitionEvent``), ``enter:<State>``
        and ``leave:<State>`` (the same event), ``before_model``, ``after_model``,
        ``before_tool`` and ``after_tool`` (a ``CallEvent``), ``text`` (a
        ``TextDelta`` of a streaming model's reply as it arrives), ``unfinished``
        (an exception left the run where it was) and ``paused`` (the run waits
        for a person's decision), each a ``CallEvent``.  For one transition the
        order is leave, enter, transition, failed; ``paused`` comes after the
        transition that paused the run.
        """
        if hook is None:

            def register(fn: Hook) -> Hook:
                self.hooks.add(name, fn)
                return fn

            return register
        self.hooks.add(name, hook)
        return hook
