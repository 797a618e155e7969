"""The machine of one table: ``transitions`` builds it and is the oracle; the interpreter takes the rows.

The library builds the machine from the table through its public API
(``Machine(states=..., transitions=[{trigger, source, dest, conditions}])``)
and is asked, through ``get_transitions``, which edges leave each state on
each trigger and in what order, which must be the table's.  Runs are not
attached to it: firing walks the table's rows with ``first_row``
(``core.firing``).  Tests ask the library's own ``trigger()`` which row each
lookup of whole runs and generated run states would take, and hold the
engine to it.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from fsm_agent.core.coverage_watch import WATCHERS, notify
from fsm_agent.definition.guards import Guard
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import State
from fsm_agent.definition.table import Row, Table, first_row
from fsm_agent.records import Transition

if TYPE_CHECKING:
    from transitions import Machine


def library_machine(table: Table, on_taken: Callable[[int, Any], None] | None = None) -> Machine:
    """The table as a plain ``transitions.Machine``; ``on_taken(row_index, run)`` is told which row fired.

    Guards are the rows' conditions and receive the run as the trigger's
    argument: ``model.trigger(name, run)``.  ``transitions`` is imported here,
    when the first agent builds its walker, not by ``import fsm_agent``.
    """
    from transitions import Machine

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


_NOWHERE: frozenset[State] = frozenset()


class Walker:
    """Fires triggers on runs of one table; built once per table and shared by every run and thread."""

    def __init__(self, table: Table) -> None:
        self.table = table
        self.machine = library_machine(table)
        self._finalize_sources: dict[frozenset[str], frozenset[State]] = {}
        self._pruned: dict[frozenset[Guard], Mapping[tuple[State, str], tuple[Row, ...]]] = {}
        for (state, trigger), rows in table.index.items():
            edges = self.machine.get_transitions(trigger=trigger, source=str(state))
            if [t.dest for t in edges] != [str(row.dest) for row in rows]:
                msg = f"transitions orders the edges of {state} on {trigger!r} differently from the table"
                raise AssertionError(msg)

    def finalize_sources(self, policies: Mapping[str, str]) -> frozenset[State]:
        """The states where a stop whose policy is ``finalize`` is checked: only there is a finalize looked for."""
        if "finalize" not in policies.values():
            return _NOWHERE  # most agents: no generator to run for every run they start
        reasons = frozenset(reason for reason, policy in policies.items() if policy == "finalize")
        found = self._finalize_sources.get(reasons)
        if found is None:
            found = frozenset(row.source for row in self.table.rows if row.reason in reasons)
            self._finalize_sources[reasons] = found
        return found

    def rows_without(self, dormant: frozenset[Guard]) -> Mapping[tuple[State, str], tuple[Row, ...]]:
        """The table's index without the rows guarded by ``dormant`` guards (see ``dormant_guards``).

        Rows that cannot fire are only skipped, never reordered, so the walk
        takes the same edge as over the whole table for any run these guards
        are false for; a differential test holds both walks (and the
        ``transitions`` library's own ``trigger()``) to that.
        """
        found = self._pruned.get(dormant)
        if found is None:
            found = {
                key: tuple(row for row in rows if row.guard not in dormant) for key, rows in self.table.index.items()
            }
            self._pruned[dormant] = found
        return found

    def try_fire(self, run: Run, trigger: str) -> Transition | None:
        """Take the first row on ``trigger`` whose guard holds, if any (for guard-only triggers)."""
        row = first_row(run, trigger)
        return None if row is None else self.take(run, row)

    def take(self, run: Run, row: Row) -> Transition:
        """Move ``run`` along ``row`` (found by ``first_row``) and record the edge in its trace."""
        entry = row.entry
        run.at.state = row.dest
        run.at.trace.append(entry)
        if WATCHERS:
            notify(entry)
        return entry


@functools.lru_cache(maxsize=64)
def walker_for(table: Table) -> Walker:
    """The shared walker for ``table``, built the first time it is asked for (a table keeps its hash)."""
    return Walker(table)
