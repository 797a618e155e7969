"""Fixtures only the core's tests use (the shared ones are in tests/conftest.py)."""
