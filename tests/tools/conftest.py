"""Fixtures only the tool registry's tests use (the shared ones are in tests/conftest.py)."""
