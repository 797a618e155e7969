"""Fixtures only the checker's tests use (the shared ones are in tests/conftest.py)."""
