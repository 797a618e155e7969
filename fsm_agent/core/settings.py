"""An agent's settings: one frozen record of everything its runs read besides the model and the tools.

Built once per agent from its checked arguments (``drivers.checks.agent_settings``)
and handed whole to each run and its stepper, the way a run-spec record is
handed to a graph instead of the whole agent: a reader finds every setting a
run obeys in one place, and nothing can change it while runs are in flight.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

import attrs

from fsm_agent.core.output import OutputSpec
from fsm_agent.core.pricing import NO_PRICING, Pricing
from fsm_agent.core.walker import Walker
from fsm_agent.definition.guards import Guard
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.stops import StopCondition
from fsm_agent.records import Message, ToolCall

if TYPE_CHECKING:
    from fsm_agent.definition.table import Table


@attrs.frozen
class AgentSettings:
    """What an agent derived from its arguments, each checked; the fields are read, never changed.

    ``walker`` is the shared walker of the agent's table (the built-in rows plus
    its ``stop_conditions``); ``on_stop`` the stop policy of every reason that
    does not raise (its ``on_stop`` over the stops' defaults); ``output`` a
    typed answer's spec and ``model_keywords`` what each model method is called
    with besides messages and tools (None: nothing); ``unused_guards`` the guards
    of parts the agent lacks (a typed answer, compaction), which its runs' rows
    leave out; ``pricing`` what its model's calls cost (``core.pricing``).
    """

    system: str
    clock: Callable[[], float]
    limits: Limits
    walker: Walker
    on_stop: Mapping[str, str]
    stop_conditions: tuple[StopCondition, ...]
    output: OutputSpec | None
    model_keywords: Mapping[str, Mapping[str, Any]] | None
    approve: Callable[[ToolCall], bool] | None
    history_processors: tuple[Callable[[list[Message]], Any], ...]
    compact: Callable[[list[Message]], Any] | None
    unused_guards: tuple[Guard, ...]
    tool_timeout: float | None
    max_concurrency: int | None
    strict_hooks: bool
    pricing: Pricing = NO_PRICING

    @property
    def table(self) -> Table:
        """The walker's own table, so the rows a run walks are the very rows the walker knows."""
        return self.walker.table
