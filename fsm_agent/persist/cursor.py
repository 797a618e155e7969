"""``RunCursor``: where a page of runs listed in creation order ended, so the next page starts right after it.

``list_runs(order="created")`` lists runs by when the store first held them,
latest first, ties by run id (descending); ``after=cursor`` gives the runs
after a page's last one in that order.  Both values are set once, when a run
is first stored, and never change, so paging by a cursor shows each run that
was there exactly once: a run added meanwhile sorts before the first page, a
run saved again keeps its place.  An offset cannot promise that: it counts
positions in a list that moves.  The checks of a listing's order, cursor and
offset live here beside the cursor, the same for every store.
"""

from __future__ import annotations

import math
import re
from typing import Literal, Protocol

import attrs

from fsm_agent.persist.checks import check_run_id

Order = Literal["updated", "created"]
"""How ``list_runs`` orders runs: by last save (the default) or by creation, each latest first."""

ORDERS: tuple[Order, ...] = ("updated", "created")
"""The orders ``list_runs`` takes."""

_NUMBER = re.compile(r"-?(?:\d+(?:\.\d*)?|\.\d+)(?:[eE][-+]?\d+)?")
"""A finite number as ``repr(float)`` writes it (no ``nan``, ``inf``, blanks or underscores, which ``float`` takes)."""


class Listed(Protocol):
    """What a cursor is made from: a listed run's id and creation time (``StoredRun`` has both)."""

    @property
    def run_id(self) -> str: ...

    @property
    def created(self) -> float | None: ...


def _created(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        msg = f"RunCursor created must be a finite number of seconds since the epoch, got {value!r}"
        raise ValueError(msg)
    return float(value)


def _run_id(value: object) -> str:
    if value == "":  # check_run_id's words for it are about starting a run
        msg = "RunCursor run_id must not be empty"
        raise ValueError(msg)
    try:
        return check_run_id(value)
    except (TypeError, ValueError) as exc:
        msg = f"RunCursor {exc}"
        raise type(exc)(msg) from None


@attrs.frozen
class RunCursor:
    """The creation time and run id of the last run of a page: ``list_runs(order="created", after=...)`` goes on.

    Made from a listed run (``RunCursor.of(page[-1])``); ``str(cursor)`` is
    its text, ``<created>:<run id>``, for a URL or a command line, which
    ``RunCursor.parse`` reads back exactly (the time is written as Python
    writes a float, so it compares equal to the stored one).
    """

    created: float = attrs.field(converter=_created)
    run_id: str = attrs.field(converter=_run_id)

    @classmethod
    def of(cls, run: Listed) -> RunCursor:
        """The cursor after ``run``; ``ValueError`` for a run whose store did not say when it was created."""
        if run.created is None:
            msg = f"run {run.run_id!r} was listed without its creation time (created): no cursor can follow it"
            raise ValueError(msg)
        return cls(run.created, run.run_id)

    @classmethod
    def parse(cls, text: str) -> RunCursor:
        """The cursor ``str(cursor)`` wrote; ``ValueError`` saying what a cursor's text is, for anything else."""
        if not isinstance(text, str):
            msg = f"a run cursor's text must be a str, got {type(text).__name__}"
            raise TypeError(msg)
        created, colon, run_id = text.partition(":")
        if not colon or _NUMBER.fullmatch(created) is None or not math.isfinite(float(created)):
            msg = f"a run cursor is '<created>:<run id>' (the text of a RunCursor), got {text[:60]!r}"
            raise ValueError(msg)
        return cls(float(created), run_id)

    def __str__(self) -> str:
        return f"{self.created!r}:{self.run_id}"


def check_listing(order: object, after: object, offset: int) -> tuple[Order, RunCursor | None]:
    """A listing's ``order`` and ``after`` as given, or the error naming the one at fault, before any query.

    ``after`` pages the creation order only (a last save moves, so no cursor
    over it stays put), and replaces an offset: both at once would be two
    starting points.
    """
    chosen = next((known for known in ORDERS if known == order and isinstance(order, str)), None)
    if chosen is None:
        msg = f"list_runs order must be one of {', '.join(map(repr, ORDERS))}, got {order!r}"
        raise ValueError(msg)
    if after is None:
        return chosen, None
    if not isinstance(after, RunCursor):
        msg = (
            f"list_runs after must be a RunCursor or None, got {type(after).__name__}"
            " (RunCursor.parse reads a cursor's text)"
        )
        raise TypeError(msg)
    if chosen != "created":
        msg = f"list_runs after pages the creation order: pass order='created' with it, not order={chosen!r}"
        raise ValueError(msg)
    if offset:
        msg = f"list_runs takes after or offset, not both (after={str(after)[:60]!r}, offset={offset!r})"
        raise ValueError(msg)
    return chosen, after
