"""Imported first by each browser test of the run viewer: outside CI, a missing extra skips the module, saying which.

CI installs both, so there a missing one fails loudly where a test first
uses it instead of skipping (CI never skips a test).  Neither is imported
here: collecting the suite imports no browser driver (``support.sdk``).
"""

from __future__ import annotations

import os

from support.sdk import skip_unless_installed

if os.environ.get("FSM_AGENT_CI") != "1":
    skip_unless_installed("starlette", reason="the run viewer's extra: pip install 'fsm-agent[ui]'")
    skip_unless_installed("playwright", reason="the browser tests' driver: pip install playwright")
