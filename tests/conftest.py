"""Fixtures shared by the provider adapter and command-line tests: the loopback provider server."""

from __future__ import annotations

import socket
from collections.abc import Iterator

import pytest
from provider_server import ProviderServer

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
