"""How a snapshot of an older version becomes one of the current version (``snapshot.parse`` applies them).

Each version's migration brings it to the next one, so a snapshot written by
any earlier release still loads.  Fields that came later within a version
(``io``, ``earlier_limits``, ...) need none: ``snapshot.load`` reads their
absence as "none kept".
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def _migrate_v1(data: dict[str, Any]) -> dict[str, Any]:
    """Version 1 kept a batch's outcomes as a list after the current call; version 2 keys them by call id."""
    ran = {}
    for item in data.get("ran", []):
        call, content, error = item
        ran[call["id"]] = {"content": content, "error": error, "truncated": 0}
    return {**data, "version": 2, "ran": ran, "frozen": None, "unfinished": None}


MIGRATIONS: dict[int, Callable[[dict[str, Any]], dict[str, Any]]] = {1: _migrate_v1}
"""How each older version becomes the next one."""
