"""Provider SDKs as the tests reach them: imported when a test runs, so collecting the tests imports none."""

from __future__ import annotations

import importlib
import importlib.util
from typing import Any

import pytest


def sdk_attribute(path: str) -> Any:
    """The object ``module:name`` names (``"openai:BadRequestError"``), importing its module now."""
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


def skip_unless_installed(module: str, reason: str) -> None:
    """Skip the calling test module where ``module`` is not installed, without importing it (as importorskip would)."""
    if importlib.util.find_spec(module) is None:
        pytest.skip(reason, allow_module_level=True)
