"""Fixtures only the tests of fsm_agent.testing and the plugin use (the shared ones are in tests/conftest.py)."""
