"""Every code block of the README and the site runs, from a directory outside the clone, offline.

The conventions are in ``doc_snippets``; this file runs each page as one
interpreter would and checks every shown output.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from support.doc_fixtures import environment
from support.doc_snippets import ROOT, pages, parse, run_page

pytestmark = pytest.mark.subprocess


def _has_code(path: Path) -> bool:
    try:
        return bool(parse(path).steps)
    except ValueError:
        return True  # the test reports the parse error against the page


PAGES_WITH_CODE = [path for path in pages() if _has_code(path)]


@pytest.mark.parametrize("path", PAGES_WITH_CODE, ids=lambda p: p.relative_to(ROOT).as_posix())
def test_every_snippet_on_the_page_runs_and_prints_what_the_page_shows(
    path: Path, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """Each page's blocks run in order, from a fresh directory outside the clone; shown output must match."""
    page = parse(path)
    with environment(page.fixtures, request) as extra_env:
        failures = run_page(page, tmp_path, extra_env)
    assert not failures, "\n\n".join(failures)
