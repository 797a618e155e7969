"""Fixtures only the stores' tests use (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from support.pg_cluster import HOW_TO_GET, find_bindir
from support.pg_killable import KillableCluster


@pytest.fixture
def killable() -> Iterator[KillableCluster]:
    """A PostgreSQL cluster this test alone uses, so killing it breaks no other test."""
    bindir = find_bindir()
    if bindir is None:
        message = f"PostgreSQL is not installed: {HOW_TO_GET}"
        if os.environ.get("FSM_AGENT_CI") == "1":
            pytest.fail(message + " (CI must not skip this)")
        pytest.skip(message)
    pytest.importorskip("psycopg", reason="pip install 'fsm-agent[postgres]'")
    cluster = KillableCluster(bindir).start()
    try:
        yield cluster
    finally:
        cluster.stop()
