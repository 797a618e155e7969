"""Fixtures shared by the tests: the loopback provider server, a throwaway PostgreSQL server, a store per kind."""

from __future__ import annotations

import os
import shutil
import socket
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis_profiles import pytest_collection_modifyitems, pytest_configure  # noqa: F401 - hooks: fuzz progress
from pg_cluster import HOW_TO_GET, Cluster, find_bindir
from provider_server import ProviderServer

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""A quiet headless Chromium: no sandbox (CI runs as root), no GPU, nothing fetched from the network on its own."""


def require_program(program: str, how: str) -> str:
    """The path of a system program a test needs; a one-line skip saying how to get it, or a failure under CI.

    ``.ci/run`` installs every system component and sets ``FSM_AGENT_CI=1``, so
    CI never skips these tests; a developer machine without one skips them.
    """
    path = shutil.which(program)
    if path is not None:
        return path
    message = f"{program} is not installed: {how}"
    if os.environ.get("FSM_AGENT_CI") == "1":
        pytest.fail(message + " (CI must not skip this)")
    pytest.skip(message)


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
    """A throwaway PostgreSQL server for the session; skipped (failed under CI) where PostgreSQL is not installed."""
    bindir = find_bindir()
    if bindir is None:
        require_program("initdb", HOW_TO_GET)
        raise AssertionError  # require_program skipped or failed
    pytest.importorskip("psycopg", reason="pip install 'fsm-agent[postgres]'")
    cluster = Cluster(bindir).start()
    try:
        yield cluster
    finally:
        cluster.stop()


@pytest.fixture(params=["sqlite", "postgres"])
def store_target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """Where a store test keeps its runs: a fresh SQLite file, then a fresh PostgreSQL database (same tests)."""
    if request.param == "sqlite":
        return str(tmp_path / "runs.db")
    cluster: Cluster = request.getfixturevalue("postgres_cluster")
    return cluster.new_database(f"t_{uuid.uuid4().hex[:16]}")
