"""Fixtures only the OpenTelemetry tests use (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import pytest
from support.spans import Spans


@pytest.fixture
def spans() -> Spans:
    """A tracer provider of the real SDK, its spans kept in memory (``support.spans``)."""
    return Spans()
