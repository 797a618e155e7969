"""The ``system`` marker, given to every test that starts a real component, so ``make test-quick`` can leave them out.

A test carries one of the finer markers (``postgres``, ``browser``, ``ray``,
``subprocess``), at module level or on itself; each of them implies
``system``.  A test whose fixtures start the throwaway PostgreSQL server
(``postgres_cluster``, directly or through another fixture) is a
``postgres`` test without saying so; ``store_target``'s PostgreSQL
parameter is marked where it is declared.
"""

from __future__ import annotations

import pytest

COMPONENTS = ("postgres", "browser", "ray", "subprocess")
"""The markers that name the component a test starts; each implies ``system``."""


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests that need ``postgres_cluster`` as ``postgres``, and every component's tests as ``system``."""
    for item in items:
        if "postgres_cluster" in getattr(item, "fixturenames", ()) and item.get_closest_marker("postgres") is None:
            item.add_marker(pytest.mark.postgres)
        if item.get_closest_marker("system") is None and any(item.get_closest_marker(m) for m in COMPONENTS):
            item.add_marker(pytest.mark.system)
