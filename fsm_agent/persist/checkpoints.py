"""What a stored run's next write holds, decided from the run alone: nothing, a renewal, an entry, or the run whole.

A ``Journal`` (``persist.journal``) owns a stored run and makes its writes
against the store; this half decides what each holds, with no I/O and no
clock (whether the lease is due is the journal's): whether the store wants
the transition just taken written, what the run added since the last write
(the lengths and last items of its growing lists, its small fields: a
``Point``), and whether its history was rewritten rather than extended, so
it is written whole.  Apart from the writes so an entry's cost reads here on
its own: what the transition added, never how long the run already is.
"""

from __future__ import annotations

import copy
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from fsm_agent.core import snapshot
from fsm_agent.definition.run import Run
from fsm_agent.definition.states import TERMINAL, State
from fsm_agent.jsontext import dumps
from fsm_agent.persist.cut_writes import Point
from fsm_agent.persist.store import Store
from fsm_agent.persist.summary import Entry, Summary

_MISSING = object()
RENEW = object()
"""The plan that writes no transition: the lease renewed, fenced by the version last written."""
_CALLING = frozenset({State.AwaitModel, State.ExecuteTool})
_BY_REFERENCE = ("evidence", "finalize_evidence")
"""Fields ``dump_small`` hands out as the run's own dicts: remembered as copies, so a later change is seen."""


class Checkpoints:
    """The planning half of a ``Journal``: what its next write holds, and where the entry after it starts."""

    store: Store
    run_id: str
    full: bool
    after_calls: bool
    seq: int
    _named: dict[str, Any]
    _marks: tuple[int, ...]
    _tails: tuple[object, ...]
    _small: dict[str, Any]
    _next: Point | None
    _early: set[str]

    if TYPE_CHECKING:

        def _lease_due(self) -> bool:
            """The ``Journal``'s: whether the lease is a third gone (read on its clock)."""

    def _whole(self, run: Run, paused: bool) -> dict[str, Any]:
        """The run's whole snapshot, and (once it is written) the point the next entry starts from.

        The point is taken now, with the snapshot, not after the awaited
        write: a batch's call may grow the run while the write is in flight.
        """
        whole = snapshot.dump(run, **self._named, paused=paused)
        small = {k: v for k, v in whole.items() if k not in snapshot.GROWING and k not in snapshot.ONCE}
        self._next = self._position(run, small)  # what dump_small gives: what the next entry is told apart from
        return whole

    @staticmethod
    def _position(run: Run, small: dict[str, Any]) -> Point:
        lists = (run.talk.messages, run.talk.steps, run.at.trace, run.talk.io)
        marks = tuple(len(items) for items in lists)
        kept = {**small, **{k: copy.deepcopy(small[k]) for k in _BY_REFERENCE if small.get(k)}}
        return marks, tuple(items[-1] if items else None for items in lists), kept

    def _plan(self, run: Run, paused: bool, *, force: bool = False) -> Entry | dict[str, Any] | object | None:
        """The entry to append now, a whole snapshot, a lease renewal, or nothing (``force``: a versioned write)."""
        release = paused or run.at.state in TERMINAL
        if not self.full:
            return self._whole(run, paused) if force or self.store.wants(run.at.state, paused) else None
        if not (force or release or self.store.wants(run.at.state, paused)):
            return RENEW if self._lease_due() else None
        lists: tuple[Sequence[object], ...] = (run.talk.messages, run.talk.steps, run.at.trace, run.talk.io)
        for items, mark, tail in zip(lists, self._marks, self._tails, strict=True):
            if len(items) < mark or (mark and items[mark - 1] is not tail):
                return self._whole(run, paused)  # history was rewritten, not extended: write it whole
        small = snapshot.dump_small(run, **self._named, paused=paused)
        if self._small.keys() - small.keys():
            return self._whole(run, paused)  # a field went absent, which an entry cannot say: it sets, never drops
        changed = {k: v for k, v in small.items() if self._small.get(k, _MISSING) != v}
        growth = {k: v for k, v in snapshot.dump_growth(run, self._marks).items() if v}
        self._next = self._position(run, small)
        tokens = run.counts.input_tokens + run.counts.output_tokens
        summary = Summary(
            str(run.at.state), run.at.reason, paused, len(run.talk.steps), tokens, self._named.get("session_id")
        )
        return Entry(self.run_id, self.seq + 1, dumps({"add": growth, "set": changed}), summary, release)

    def unwritten(self, run: Run) -> bool:
        """Whether the run grew since the last write: a transition, message, step or call's outcome its store lacks.

        A store that writes only some transitions (``every="call"`` or
        ``"turn"``) lags the run between its writes; one that writes each
        (``"transition"``) lags it at no call.
        """
        lists: tuple[Sequence[object], ...] = (run.talk.messages, run.talk.steps, run.at.trace, run.talk.io)
        for items, mark, tail in zip(lists, self._marks, self._tails, strict=True):
            if len(items) != mark or (mark and items[mark - 1] is not tail):
                return True
        return False

    def _moved(self, run: Run, paused: bool) -> bool:
        """Whether the run holds more than its last write: grown, or a small field (state, counters, ...) changed."""
        return self.unwritten(run) or snapshot.dump_small(run, **self._named, paused=paused) != self._small

    def _called(self, run: Run) -> bool:
        """Whether (``every="call"``) the transition just taken recorded a call's outcome not written yet.

        It left a calling state, and (for a tool call) the outcome it
        recorded was not already written while its batch was in flight.
        """
        if not self.after_calls or not run.at.trace or run.at.trace[-1].source not in _CALLING:
            return False
        if self._early and run.at.trace[-1].source == State.ExecuteTool and run.talk.messages:
            answered = run.talk.messages[-1].tool_call_id
            if answered in self._early:
                self._early.discard(answered)
                return False
        return True
