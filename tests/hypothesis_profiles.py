"""Hypothesis budgets for the property, differential and stateful tests: a fixed one for CI, a big one for fuzzing.

The profile is chosen by ``FSM_AGENT_HYPOTHESIS=ci|fuzz`` (default ``ci``) and
applied with ``@PROFILE`` on each test rather than loaded globally, so other
test modules keep Hypothesis' defaults.  ``ci`` is derandomized with a fixed
example count: the same examples every run, a fixed cost, no flaky red builds.
``fuzz`` (``make fuzz``) draws fresh random examples, many more of them, and
keeps failures in the example database so they replay next time.
"""

from __future__ import annotations

import os

from hypothesis import settings

# deadline=None: a run's cost varies with the generated script and the machine, and time is not what these test.
settings.register_profile("ci", max_examples=120, derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("fuzz", max_examples=4000, deadline=None, print_blob=True)

PROFILE_NAME = os.environ.get("FSM_AGENT_HYPOTHESIS", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)
"""The chosen profile, used as a decorator: ``@PROFILE``."""
