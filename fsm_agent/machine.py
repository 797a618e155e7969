"""The ``transitions`` machine built from a table: it decides the next state and nothing else.

One machine per table, built once and shared by every run (and thread) of
every agent using that table.  Runs are never attached with ``add_model``
(it costs time proportional to the live runs); the engine fires an event with
the run as model, and the event tries the rows of the run's state in table
order.  ``RowTransition`` evaluates its guard directly and records the edge,
and ``RowEvent`` walks a state's rows without building the library's
per-trigger event data: no callbacks run inside a transition (model and tool
calls stay in the driver), so that machinery would be pure cost on every step.
"""

from __future__ import annotations

import functools
from typing import Any, cast

from transitions import Event, Machine, MachineError
from transitions import Transition as LibraryTransition

from fsm_agent.records import Transition
from fsm_agent.run import Run
from fsm_agent.table import Row, Table


class RowTransition(LibraryTransition):
    """A library transition that is one table row: guard check, state change, trace entry."""

    def __init__(self, source: str, dest: str, *args: Any, row: Row, **kwargs: Any) -> None:
        super().__init__(source, dest, *args, **kwargs)
        self.row = row
        self._guard = row.guard
        self._dest = row.dest
        # Trace entries are immutable and identical for every firing of a row, so build one.
        self._entry = Transition(str(row.source), row.trigger, str(row.dest), row.guard_name, row.reason)

    def execute(self, event_data: Any) -> bool:
        """The library's entry point, kept so the transition also works when fired the library's way."""
        return self.take(event_data.model)

    def take(self, run: Run) -> bool:
        """Move ``run`` along this row if its guard holds; return whether it did."""
        if self._guard is not None and not self._guard(run):
            return False
        run.state = self._dest
        run.trace.append(self._entry)
        return True


class RowEvent(Event):
    """A library event that tries the rows of the run's state in order, with no event data or callbacks."""

    def trigger(self, model: Any, *args: Any, **kwargs: Any) -> bool:
        rows = self.transitions.get(model.state)
        if rows is None:
            msg = f"{self.machine.name}Can't trigger event {self.name} from state {model.state}!"
            raise MachineError(msg)
        # Every transition of a TableMachine is a RowTransition (its transition_cls).
        return any(cast(RowTransition, row).take(model) for row in rows)


class TableMachine(Machine):
    """A plain ``transitions.Machine`` whose transitions are the rows of one table."""

    transition_cls = RowTransition
    event_cls = RowEvent

    def __init__(self, table: Table) -> None:
        # auto_transitions would add to_<state>() shortcuts that bypass every guard.
        super().__init__(
            model=None,
            states=[str(state) for state in table.states],
            initial=str(table.initial),
            auto_transitions=False,
        )
        self.table = table
        for row in table.rows:
            self.add_transition(row.trigger, str(row.source), str(row.dest), row=row)

    def try_fire(self, run: Run, trigger: str) -> bool:
        """Take the first row on ``trigger`` whose guard holds, if any; for guard-only triggers."""
        result: bool = self.events[trigger].trigger(run)
        return result

    def fire(self, run: Run, trigger: str) -> None:
        """Take the first row out of ``run``'s state on ``trigger`` whose guard holds."""
        if not self.events[trigger].trigger(run):
            # Unreachable for a validated table (every trigger ends in a fallback) except for
            # guard-only triggers, which the engine only fires after checking they apply.
            msg = f"no row fired for trigger {trigger!r} in state {run.state}"
            raise AssertionError(msg)


@functools.lru_cache(maxsize=64)
def machine_for(table: Table) -> TableMachine:
    """The shared machine for ``table``, built the first time it is asked for."""
    return TableMachine(table)
