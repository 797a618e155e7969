"""Fixtures of the run viewer's tests: headless Chromium from the system, one per module, and a page on it."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from support.programs import CHROMIUM_ARGS, require_program


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from the system (``apt-get install chromium``), one per module."""
    executable = require_program("chromium", "apt-get install chromium")
    import playwright.sync_api as playwright_api  # the browser tests' driver, loaded by the tests that use it

    with playwright_api.sync_playwright() as driver:
        launched = driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


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
