"""Fixtures only the OpenTelemetry tests use (the shared ones are in tests/conftest.py)."""
