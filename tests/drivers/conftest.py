"""Fixtures only the drivers' tests use (the shared ones are in tests/conftest.py)."""
