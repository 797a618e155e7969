"""Imported first by each browser test of the run viewer: outside CI, a missing extra skips the module, saying which.

CI installs both, so there the imports that follow fail loudly instead of
skipping (CI never skips a test).
"""

from __future__ import annotations

import os

import pytest

if os.environ.get("FSM_AGENT_CI") != "1":
    pytest.importorskip("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    pytest.importorskip("playwright.sync_api", reason="the browser tests' driver: pip install playwright")
