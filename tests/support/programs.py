"""The system programs the tests start: found on PATH, skipped where missing, never skipped under CI."""

from __future__ import annotations

import os
import shutil

import pytest

CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]
"""A quiet headless Chromium: no sandbox (CI runs as root), no GPU, nothing fetched from the network on its own."""


def require_program(program: str, how: str) -> str:
    """The path of a system program a test needs; a one-line skip saying how to get it, or a failure under CI.

    ``.ci/run`` installs every system component and sets ``FSM_AGENT_CI=1``, so
    CI never skips these tests; a developer machine without one skips them.
    """
    path = shutil.which(program)
    if path is not None:
        return path
    message = f"{program} is not installed: {how}"
    if os.environ.get("FSM_AGENT_CI") == "1":
        pytest.fail(message + " (CI must not skip this)")
    pytest.skip(message)
