"""Fixtures only the diagrams' tests use (the shared ones are in tests/conftest.py)."""
