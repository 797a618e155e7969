"""No name is a method in one class of a driver and a field in another: the type checker cannot see that clash.

A driver is built from mixins (``WatchedRun``, ``RunBase``, ``SyncDriver``
or ``AsyncDriver``); one declaring ``_call: ToolCall | None`` and another
defining ``def _call`` type-check, and the field set at run time replaces the
method, so every watched run with a tool call failed.
"""

from __future__ import annotations

import inspect

import pytest

from fsm_agent.drivers.aio import AsyncDriver
from fsm_agent.drivers.sync import SyncDriver


def _kinds(cls: type) -> dict[str, set[str]]:
    """Each name any class of ``cls``'s MRO defines, and whether as a method, a field, or both."""
    kinds: dict[str, set[str]] = {}
    for klass in inspect.getmro(cls):
        if klass is object:
            continue
        for name in getattr(klass, "__annotations__", {}):
            kinds.setdefault(name, set()).add("field")
        for name, value in vars(klass).items():
            if callable(value) or isinstance(value, staticmethod | classmethod | property):
                kinds.setdefault(name, set()).add("method")
    return kinds


@pytest.mark.parametrize("driver", [SyncDriver, AsyncDriver], ids=["sync", "async"])
def test_no_name_is_a_method_in_one_driver_class_and_a_field_in_another(driver: type) -> None:
    clashes = sorted(name for name, kinds in _kinds(driver).items() if kinds == {"field", "method"})
    assert clashes == []
