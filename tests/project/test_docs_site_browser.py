"""The documentation site in a real browser, offline: Debian's Chromium, headless, driven by Playwright.

The site is built as ``make docs`` builds it, with every proxy pointed at a
closed port, and served on loopback; the browser may fetch nothing else, and
every request it tries elsewhere is recorded and refused.  Each page is then
checked for what a person sees: no drawing shown as its source text, no code
line cut off, and on the home and machine pages drawings whose labels can be
read.  The viewport is a laptop screen's (as in ``tests/ui/test_ui_browser.py``),
and a smaller one for the drawings.
"""

from __future__ import annotations

import functools
import http.server
import os
import re
import subprocess
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from support.programs import CHROMIUM_ARGS, require_program
from support.sdk import sdk_attribute, skip_unless_installed

if os.environ.get("FSM_AGENT_CI") != "1":  # CI installs both: there a missing one fails the site's build or browser
    skip_unless_installed("mkdocs", reason="the site's builder: pip install 'fsm-agent[docs]'")
    skip_unless_installed("playwright", reason="the browser tests' driver: pip install playwright")

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
WAIT = 30_000
"""Milliseconds a page may take to load; one takes about 0.2 s here, and up to 2 s on a busy 2-core machine."""
READABLE = 11.0
"""The smallest label, in CSS pixels, a drawing may show."""
SOURCE_STARTS = ("flowchart", "stateDiagram", "digraph", "graph LR", "graph TD", "sequenceDiagram")
"""How a drawing's source text begins (Mermaid, Graphviz): a block starting so is a drawing left undrawn."""
DRAWING_PAGES = ["", "concepts/machine/"]


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``make docs`` builds it, with the network out of reach; the build has no warning."""
    out = tmp_path_factory.mktemp("site")
    closed = "http://127.0.0.1:9"  # the discard port: nothing listens, so any fetch fails at once
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "no_proxy": "", "NO_PROXY": ""}
    env |= dict.fromkeys(("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY"), closed)
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


class _Quiet(http.server.SimpleHTTPRequestHandler):
    """Serves the site's files without a log line per request."""

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 - the name the base class gives it
        """Say nothing."""


@pytest.fixture(scope="module")
def base(site: Path) -> Iterator[str]:
    """The site served on loopback, as ``http://127.0.0.1:PORT/``."""
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_Quiet, directory=str(site)))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_port}/"
    server.shutdown()
    server.server_close()
    thread.join(timeout=10)


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium from the system (``apt-get install chromium``), one per module."""
    executable = require_program("chromium", "apt-get install chromium")
    with sdk_attribute("playwright.sync_api:sync_playwright")() as driver:
        launched = driver.chromium.launch(executable_path=executable, args=CHROMIUM_ARGS)
        yield launched
        launched.close()


class Visit:
    """One browser tab on the site: every request off the site is refused and recorded."""

    def __init__(self, browser: Any, base: str, width: int, height: int) -> None:
        self.base = base
        self.context = browser.new_context(viewport={"width": width, "height": height})
        self.context.set_default_timeout(WAIT)
        self.elsewhere: list[str] = []
        self.context.route("**/*", self._route)
        self.page = self.context.new_page()

    def _route(self, route: Any) -> None:
        url = route.request.url
        if url.startswith(self.base) or urlsplit(url).scheme in ("data", "blob"):
            route.continue_()
        else:
            self.elsewhere.append(url)
            route.abort()

    def open(self, path: str) -> Any:
        """Load ``path`` of the site, with its images, and return the page."""
        self.page.goto(self.base + path, wait_until="load", timeout=WAIT)
        self.page.wait_for_function(
            "() => [...document.images].every(image => image.complete)", timeout=WAIT, polling=100
        )
        return self.page


@pytest.fixture
def visit(browser: Any, base: str) -> Iterator[Visit]:
    """A tab the size of a laptop screen."""
    tab = Visit(browser, base, 1440, 900)
    yield tab
    tab.context.close()


def _pages(site: Path) -> list[str]:
    """Every page of the site, as its path from the site's root (``""`` for the home page)."""
    pages = sorted(p.parent.relative_to(site).as_posix() + "/" for p in site.rglob("index.html"))
    return ["" if page == "./" else page for page in pages]


_SHOWN = """nodes => nodes.map(node => ({
    text: node.innerText.trim(),
    mermaid: node.matches('.mermaid'),
    cut: node.tagName === 'PRE'
        ? [...node.children].filter(code => code.tagName === 'CODE' && code.scrollWidth > code.clientWidth + 1)
            .map(code => code.innerText.split('\\n')[0].slice(0, 40))
        : [],
}))"""
"""For each code block and drawing of a page's article (``article pre, article .mermaid``): its text, whether it is
of class mermaid (left undrawn), and the first line of each of its ``code`` children wider than its box (cut off).
One round trip to the browser a page, where three selectors took three."""


def test_every_page_loads_offline_shows_no_drawing_source_and_cuts_off_no_code(site: Path, visit: Visit) -> None:
    """On each page: nothing fetched elsewhere, no Mermaid or DOT text in place of a drawing, no code line hidden."""
    pages = _pages(site)
    assert len(pages) > 50
    undrawn: dict[str, list[str]] = {}
    cut: dict[str, list[str]] = {}
    for path in pages:
        page = visit.open(path)
        nodes: list[dict[str, Any]] = page.eval_on_selector_all("article pre, article .mermaid", _SHOWN)
        shown = [node["text"][:40] for node in nodes if node["text"].startswith(SOURCE_STARTS)]
        shown += ["(an element of class mermaid)"] * sum(node["mermaid"] for node in nodes)
        if shown:
            undrawn[path] = shown
        hidden = [line for node in nodes for line in node["cut"]]
        if hidden:
            cut[path] = hidden
    assert visit.elsewhere == []
    assert undrawn == {}
    assert cut == {}


def _svg_geometry(svg: Path) -> tuple[float, float]:
    """A Graphviz SVG's width in its own units (the viewBox) and its smallest font size in those units."""
    text = svg.read_text(encoding="utf-8")
    view_box = re.search(r'viewBox="([-\d.]+) ([-\d.]+) ([\d.]+) ([\d.]+)"', text)
    sizes = [float(size) for size in re.findall(r'font-size="([\d.]+)"', text)]
    assert view_box is not None, svg
    assert sizes, svg
    return float(view_box[3]), min(sizes)


@pytest.mark.parametrize(("width", "height"), [(1440, 900), (1280, 800)], ids=["1440x900", "1280x800"])
@pytest.mark.parametrize("path", DRAWING_PAGES, ids=["home", "machine"])
def test_the_drawings_on_the_home_and_machine_pages_are_readable_and_open_at_full_size(
    site: Path, browser: Any, base: str, path: str, width: int, height: int
) -> None:
    """Each drawing's smallest label is at least 11 px as shown, and a click on it opens the SVG itself."""
    tab = Visit(browser, base, width, height)
    try:
        page = tab.open(path)
        drawings: list[dict[str, Any]] = page.eval_on_selector_all(
            "article img, article svg, article object",
            """nodes => nodes.map(node => ({
                tag: node.tagName.toLowerCase(),
                src: node.currentSrc || node.getAttribute('data') || '',
                width: node.getBoundingClientRect().width,
                loaded: node.tagName !== 'IMG' || node.naturalWidth > 0,
                link: node.closest('a') ? node.closest('a').href : null,
                fonts: [...(node.tagName === 'svg' ? node.querySelectorAll('text') : [])]
                    .map(text => text.getBoundingClientRect().height),
            }))""",
        )
        content = page.eval_on_selector("article", "article => article.getBoundingClientRect().width")
    finally:
        tab.context.close()
    assert tab.elsewhere == []
    assert [d["tag"] for d in drawings] == ["img"], drawings  # the drawing, and no other picture
    for drawing in drawings:
        assert drawing["loaded"], drawing
        assert drawing["link"] == drawing["src"], drawing  # a link to the SVG itself
        served = site / urlsplit(drawing["src"]).path.lstrip("/")
        own_width, smallest = _svg_geometry(served)
        label = smallest * drawing["width"] / own_width
        assert drawing["width"] >= min(content, 1400) - 2, (drawing, content)  # shown large: the content's width
        assert label >= READABLE, f"{served.name} at {drawing['width']:.0f} px: labels of {label:.1f} px"


def test_the_full_drawing_is_linked_from_the_machine_page_and_opens(site: Path, visit: Visit) -> None:
    """The full drawing, too wide to read inline, is a link on the machine page to an SVG the browser opens."""
    page = visit.open("concepts/machine/")
    links = page.locator("article a[href$='diagrams/agent_loop.svg']")
    assert links.count() >= 1
    links.first.click()
    page.wait_for_url(re.compile(r"/diagrams/agent_loop\.svg$"), timeout=WAIT)
    assert page.locator("svg text", has_text="ExecuteTool").count() >= 1
    assert visit.elsewhere == []
