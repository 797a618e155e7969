"""Fixtures only the tests of the package as a whole use (the shared ones are in tests/conftest.py)."""
