"""Fixtures shared by the tests: the loopback provider server, a throwaway PostgreSQL server, a store per kind."""

from __future__ import annotations

import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.pg_cluster import HOW_TO_GET, Cluster, find_bindir, memory_folder
from support.programs import require_program
from support.provider_server import ProviderServer

pytest_plugins = ["support.hypothesis_profiles", "support.markers"]
"""Hooks: fuzz progress under ``make fuzz``; the ``system`` marker on every test that starts a real component."""


@pytest.fixture
def dot() -> str:
    """Graphviz's ``dot``, for tests that render pictures."""
    return require_program("dot", "apt-get install graphviz")


_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


@pytest.fixture
def provider_server(monkeypatch: pytest.MonkeyPatch) -> Iterator[ProviderServer]:
    """A provider server on a free 127.0.0.1 port, stopped after the test."""
    # httpx honours proxy variables, and a proxy must never see (or break) loopback test traffic.
    for name in _PROXY_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    with ProviderServer() as server:
        yield server


@pytest.fixture
def unused_port() -> int:
    """A 127.0.0.1 port nothing listens on, so connecting to it is refused at once."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
    return port


@pytest.fixture(scope="session")
def postgres_cluster() -> Iterator[Cluster]:
    """A throwaway PostgreSQL server for the session, in memory where there is room (``support.pg_cluster``); skipped
    (failed under CI) where PostgreSQL is not installed."""
    bindir = find_bindir()
    if bindir is None:
        require_program("initdb", HOW_TO_GET)
        raise AssertionError  # require_program skipped or failed
    pytest.importorskip("psycopg", reason="pip install 'fsm-agent[postgres]'")
    cluster = Cluster(bindir, folder=memory_folder()).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """Where a store test keeps its runs: a fresh SQLite file, then a fresh PostgreSQL database (same tests), which
    is dropped after the test."""
    if request.param == "sqlite":
        yield str(tmp_path / "runs.db")
        return
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    name = f"t_{uuid.uuid4().hex[:16]}"
    yield cluster.new_database(name)
    cluster.drop_database(name)
