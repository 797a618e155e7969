"""Fixtures of the run viewer's tests: headless Chromium from the system, and a page on it.

One Chromium serves a run of consecutive tests that use it (the browser
tests of several modules), and is closed before the first test that does
not: while Playwright's synchronous driver is open, ``asyncio.run`` cannot
run in this thread, and other tests of this folder call it.  Each test still
gets a fresh browser context (``page``): no cookie, storage or tab of one
test reaches the next.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from support.programs import CHROMIUM_ARGS, require_program


class _Chromium:
    """The open Chromium, and the Playwright driver it runs on, if any."""

    def __init__(self) -> None:
        self._driver: Any = None
        self._browser: Any = None

    def open(self) -> Any:
        """The open browser, launched first if none is."""
        if self._browser is None:
            executable = require_program("chromium", "apt-get install chromium")
            import playwright.sync_api as playwright_api  # the browser tests' driver, loaded by the tests that use it

            self._driver = playwright_api.sync_playwright().start()
            try:
                self._browser = self._driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
            except BaseException:
                self.close()
                raise
        return self._browser

    def close(self) -> None:
        """Close the browser and stop its driver (nothing if none is open)."""
        browser, driver = self._browser, self._driver
        self._browser = self._driver = None
        try:
            if browser is not None:
                browser.close()
        finally:
            if driver is not None:
                driver.stop()


_CHROMIUM = _Chromium()
HERE = Path(__file__).resolve().parent


@pytest.fixture
def browser() -> Any:
    """Headless Chromium from the system (``apt-get install chromium``), shared by consecutive tests that use it."""
    return _CHROMIUM.open()


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> Iterator[None]:
    """Once a test's fixtures are torn down, close Chromium unless the next test, one of this folder, uses it too."""
    try:
        return (yield)
    finally:
        mine = nextitem is not None and nextitem.path.is_relative_to(HERE)
        if not mine or "browser" not in getattr(nextitem, "fixturenames", ()):
            _CHROMIUM.close()


def pytest_sessionfinish() -> None:
    """Close Chromium if a run of the session stopped early (``-x``, Ctrl-C) while it was open."""
    _CHROMIUM.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh page the size of a laptop screen; a script error on it fails the test."""
    context = browser.new_context(viewport={"width": 1440, "height": 900})
    opened = context.new_page()
    errors: list[str] = []
    opened.on("pageerror", lambda error: errors.append(str(error)))
    yield opened
    context.close()
    assert not errors, errors
