"""The ``start_id`` a parent's driver stores its call's child with: for tests that store such a child by hand.

A child belongs to its call in one start of its parent (a parent started
again over its id takes none of its old run's children), so a child put
in the store for a parent to find must carry this start.
"""

from __future__ import annotations

from fsm_agent import AgentRun
from fsm_agent.core.child_ids import child_start


def child_start_of(parent: AgentRun, call_id: str) -> str:
    """The ``start_id`` of the child of call ``call_id`` in this start of ``parent`` (``core.child_ids``)."""
    return child_start(parent.start_id, call_id)
