"""The pool of a batch on Ray as its executor sees it: each actor's runs in flight, and the actors that died.

Kept apart from the pass over the batch's runs (``on_ray``), which asks it
where a run can go and tells it what came back.
"""

from __future__ import annotations

import math
import time
from typing import Any

from fsm_agent.batch.items import BatchItem
from fsm_agent.batch.worker import Patience

_ASK_AGAIN = 0.2
"""Seconds before an actor that did not answer yet (still restarting) is asked again whether it is back."""

_GONE = math.inf
"""When to ask a dead actor again whether it is back: never, for one Ray will not restart."""


class Slots:
    """The pool's actors by slot: the runs each has in flight, and those that died until they answer again.

    A run sent to an actor still restarting is refused, and would use up
    its retries in a few seconds, so a dead actor takes no run until it
    answers a ping; one Ray will not restart takes none again.
    """

    def __init__(self, ray: Any, pool: list[Any], runs: int) -> None:
        self._ray, self._pool, self._runs = ray, pool, runs
        self._load = [0] * len(pool)
        # Actors that died, by slot: when to ask next whether each is back (None: asked, no answer yet).
        self._down: dict[int, float | None] = {}
        self.pings: dict[Any, int] = {}
        """The pings in flight: the ref of each actor's ``ready`` task, by the slot it asks about."""

    def up(self) -> list[int]:
        """The slots whose actor is alive and has room for one more run."""
        return [slot for slot in range(len(self._pool)) if slot not in self._down and self._load[slot] < self._runs]

    def send(self, item: BatchItem, patience: Patience | None) -> tuple[Any, int]:
        """Submit ``item`` to the live actor with the fewest runs: the task's ref, and the actor's slot."""
        slot = min(self.up(), key=self._load.__getitem__)
        self._load[slot] += 1
        return self._pool[slot].run.remote(item, patience), slot

    def returned(self, slot: int) -> None:
        """A run the actor at ``slot`` had came back (ended, refused, or lost with its actor): room for one more."""
        self._load[slot] -= 1

    def fell(self, slot: int) -> None:
        """The actor at ``slot`` died under a run: it takes none until it answers again."""
        if slot not in self._down:
            self._down[slot] = 0.0  # ask at once

    def ask(self) -> None:
        """Ping each dead actor whose time to be asked has come."""
        now = time.monotonic()
        for slot, at in self._down.items():
            if at is not None and at <= now:
                self.pings[self._pool[slot].ready.remote()] = slot
                self._down[slot] = None

    def answered(self, ref: Any) -> None:
        """A ping came back: its actor is up again, still restarting (asked again shortly), or gone for good."""
        ray, slot = self._ray, self.pings.pop(ref)
        try:
            ray.get(ref)
        except ray.exceptions.ActorDiedError:
            self._down[slot] = _GONE  # Ray will not restart it (max_restarts is -1): killed for good with ray.kill
        except ray.exceptions.RayError:
            self._down[slot] = time.monotonic() + _ASK_AGAIN  # still restarting: ask again
        else:
            del self._down[slot]

    def gone(self) -> bool:
        """Whether every actor died and Ray restarts none of them: the runs still to go cannot be carried out."""
        return all(self._down.get(slot) == _GONE for slot in range(len(self._pool)))
