"""Hypothesis budgets for the property, differential and stateful tests: fixed for CI, small while working, big to fuzz.

The profile is chosen by ``FSM_AGENT_HYPOTHESIS=ci|quick|fuzz`` (default ``ci``) and
applied with ``@PROFILE`` on each test rather than loaded globally, so other
test modules keep Hypothesis' defaults.  ``ci`` is derandomized with a fixed
example count: the same examples every run, a fixed cost, no flaky red builds.
``fuzz`` (``make fuzz``) draws fresh random examples, many more of them, and
keeps failures in the example database so they replay next time.  ``quick``
(``make test-quick``) is ``ci`` with a quarter of its examples: the same
checks, a shorter search, for the loop of editing and rerunning.
"""

from __future__ import annotations

import functools
import os
import sys
import time
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import settings

# deadline=None: a run's cost varies with the generated script and the machine, and time is not what these test.
settings.register_profile("ci", max_examples=120, derandomize=True, database=None, deadline=None, print_blob=True)
settings.register_profile("quick", settings.get_profile("ci"), max_examples=30)
settings.register_profile("fuzz", max_examples=4000, deadline=None, print_blob=True)

PROFILE_NAME = os.environ.get("FSM_AGENT_HYPOTHESIS", "ci")
PROFILE = settings.get_profile(PROFILE_NAME)
"""The chosen profile, used as a decorator: ``@PROFILE``."""


def examples(ci: int) -> int:
    """A test's own example budget under the chosen profile: ``ci`` as given, a quarter of it under ``quick``.

    For the tests whose budget is their own rather than the profile's (a
    search sized for what it looks for); ``fuzz`` leaves them as they are.
    """
    return max(ci // 4, 10) if PROFILE_NAME == "quick" else ci


def _to_stderr(line: str) -> None:
    print(line, file=sys.__stderr__, flush=True)


report: Callable[[str], None] = _to_stderr
"""Where progress lines go; under pytest, its terminal reporter (set in conftest), which its capture leaves alone."""


def progress(name: str, every: int = 250) -> Callable[[], None]:
    """A tick to call once per example: under ``fuzz`` it prints every ``every`` examples how far ``name`` got.

    A fuzz run takes minutes per test and pytest shows nothing until a test
    ends, so the count goes to ``report``, straight to the terminal.
    Under ``ci`` the tick does nothing.
    """
    if PROFILE_NAME != "fuzz":
        return lambda: None
    count, started = 0, time.monotonic()

    def tick() -> None:
        nonlocal count
        count += 1
        if count % every == 0:
            rate = count / max(time.monotonic() - started, 1e-9)
            budget = PROFILE.max_examples
            report(f"  {name}: {count} examples tried (budget {budget}, shrinking adds more), {rate:.0f}/s")

    return tick


def with_progress(test: Any) -> None:
    """Make a ``@given`` test tick ``progress`` once per example (Hypothesis calls ``inner_test`` per example)."""
    inner = getattr(getattr(test, "hypothesis", None), "inner_test", None)
    if inner is None or PROFILE_NAME != "fuzz":
        return
    tick = progress(test.__name__)

    @functools.wraps(inner)
    def counted(*args: Any, **kwargs: Any) -> Any:
        tick()
        return inner(*args, **kwargs)

    test.hypothesis.inner_test = counted


# Pytest hooks, re-exported by conftest (and usable as a plugin: ``-p hypothesis_profiles``).


@pytest.hookimpl(trylast=True)  # after the terminal plugin has registered its reporter
def pytest_configure(config: pytest.Config) -> None:
    """Send fuzz progress lines to pytest's terminal while a test runs, past its output capture."""
    global report  # the one place the destination of progress lines is set
    reporter = config.pluginmanager.get_plugin("terminalreporter")
    capture = config.pluginmanager.get_plugin("capturemanager")
    if reporter is not None and capture is not None:

        def to_terminal(line: str) -> None:
            with capture.global_and_fixture_disabled():  # a test is running: its capture would keep the line
                reporter.write_line(line)
                reporter.flush()  # seen now, even when the output is a pipe

        report = to_terminal


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Under ``make fuzz``, every Hypothesis test reports its progress (see ``progress``)."""
    for item in items:
        if isinstance(item, pytest.Function):
            with_progress(item.obj)
