"""When a store's runs are written (``every=``): at every transition, as each call returns, or before each model call.

One rule for every store and for the checker that judges crash safety
under it (``proof/graph.py``): which transitions are written as they are
taken, and what a crash between two writes costs.
"""

from __future__ import annotations

from fsm_agent.definition.states import TERMINAL, State

EVERY = ("transition", "call", "turn")
"""When a store's runs are written (``every=``), from the most writes to the fewest.

``"call"`` (the default): one write per I/O boundary.  As each model or tool
call returns, the transition recording its outcome is written together with
the transitions taken since the last write, in one transaction fenced like
every write; so are the end and a pause.  A run of M model calls and T tool
calls costs at most M + T + 2 store transactions (its creation, one per call,
its end) instead of one per transition.  Exactly-once is as with
``"transition"``: a call's outcome (each result of a parallel batch too) is
durable as soon as the call returns, and a process killed anywhere resumes
from the last write, running again only the call that was in flight; the
transitions between a call's outcome and the next call are pure and are
simply taken again.  What differs: between two calls the stored run lags the
run object, and observers hear of those transitions before they are stored,
so a viewer following a run live sees it move at its calls.

``"transition"``: one write per transition, so the stored run is the run
object at every transition (what a viewer following a run live shows at
every step, and what earlier releases did by default).

``"turn"``: before each model call, at the end and when paused; the model's
reply and a tool call's outcome are written only after the turn's tool calls
ran, so a crash in between makes the completed calls (the model call included)
again."""


def check_every(every: str) -> str:
    """``"transition"``, ``"call"`` or ``"turn"`` (see ``EVERY``)."""
    if every not in EVERY:
        msg = f"every must be 'transition', 'call' or 'turn', got {every!r}"
        raise ValueError(msg)
    return every


def wants(every: str, state: State, paused: bool) -> bool:
    """Whether the transition into ``state`` is written as it is taken (see ``EVERY``).

    Every transition; or (``every="call"``) at the end and when paused, the
    driver writing the others with the outcome of the next call (``Journal.save``);
    or (``every="turn"``) before a model call, at the end and when paused.
    """
    if every == "transition" or paused or state in TERMINAL:
        return True
    return every == "turn" and state is State.AwaitModel
