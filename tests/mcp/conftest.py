"""Fixtures only the MCP tools' tests use (the shared ones are in tests/conftest.py)."""
