"""Fixtures only the provider adapters' tests use (the shared ones are in tests/conftest.py)."""
