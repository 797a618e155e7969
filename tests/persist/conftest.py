"""Fixtures only the stores' tests use (the shared ones are in tests/conftest.py)."""
