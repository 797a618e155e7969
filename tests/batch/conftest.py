"""Fixtures only the batch tests use (the shared ones are in tests/conftest.py)."""
