"""The machine of one table: ``transitions`` decides which edges exist, the row walker takes them.

The library builds the machine from the table through its public API
(``Machine(states=..., transitions=[{trigger, source, dest, conditions}])``)
and is asked, through ``get_transitions``, which edges leave each state on
each trigger and in what order; the walker's index is built from that
answer.  Firing then walks that index with ``first_row``, the same function
every lookahead uses, instead of going through the library's per-trigger
event objects, which would cost more than the rest of a step.  A
differential test shows, for every row and generated run states, that the
library's own ``trigger()`` takes the same edge.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from transitions import Machine

from fsm_agent.definition.run import Run
from fsm_agent.definition.table import Row, Table, first_row
from fsm_agent.records import Transition


def library_machine(table: Table, on_taken: Callable[[int, Any], None] | None = None) -> Machine:
    """The table as a plain ``transitions.Machine``; ``on_taken(row_index, run)`` is told which row fired.

    Guards are the rows' conditions and receive the run as the trigger's
    argument: ``model.trigger(name, run)``.
    """
    transitions = []
    for index, row in enumerate(table.rows):
        spec: dict[str, Any] = {
            "trigger": row.trigger,
            "source": str(row.source),
            "dest": str(row.dest),
            "conditions": [] if row.guard is None else [row.guard],
        }
        if on_taken is not None:
            spec["after"] = [functools.partial(on_taken, index)]
        transitions.append(spec)
    # auto_transitions would add to_<state>() shortcuts that bypass every guard.
    return Machine(
        model=None,
        states=[str(state) for state in table.states],
        initial=str(table.initial),
        transitions=transitions,
        auto_transitions=False,
    )


class Walker:
    """Fires triggers on runs of one table; built once per table and shared by every run and thread."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.machine = library_machine(table)
        # Trace entries are immutable and identical for every firing of a row, so one is built per row.
        self._entries = {
            id(row): Transition(str(row.source), row.trigger, str(row.dest), row.guard_name, row.reason)
            for row in table.rows
        }
        for (state, trigger), rows in table.index.items():
            edges = self.machine.get_transitions(trigger=trigger, source=str(state))
            if [t.dest for t in edges] != [str(row.dest) for row in rows]:
                msg = f"transitions orders the edges of {state} on {trigger!r} differently from the table"
                raise AssertionError(msg)

    def entry(self, row: Row) -> Transition:
        """The trace entry of ``row``."""
        return self._entries[id(row)]

    def try_fire(self, run: Run, trigger: str) -> Transition | None:
        """Take the first row on ``trigger`` whose guard holds, if any (for guard-only triggers)."""
        row = first_row(run, trigger)
        if row is None:
            return None
        entry = self._entries[id(row)]
        run.state = row.dest
        run.trace.append(entry)
        return entry

    def fire(self, run: Run, trigger: str) -> Transition:
        """Take the first row out of ``run``'s state on ``trigger`` whose guard holds."""
        entry = self.try_fire(run, trigger)
        if entry is None:
            # Unreachable for a validated table (every trigger ends in a fallback) except for guard-only
            # triggers, which the stepper only fires after checking one of their rows applies.
            msg = f"no row fired for trigger {trigger!r} in state {run.state}"
            raise AssertionError(msg)
        return entry


@functools.lru_cache(maxsize=64)
def walker_for(table: Table) -> Walker:
    """The shared walker for ``table``, built the first time it is asked for."""
    return Walker(table)
