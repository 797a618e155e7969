"""Fixtures only the command line's tests use (the shared ones are in tests/conftest.py)."""
