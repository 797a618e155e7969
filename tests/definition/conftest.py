"""Fixtures only the table's, the guards' and the stops' tests use (the shared ones are in tests/conftest.py)."""
