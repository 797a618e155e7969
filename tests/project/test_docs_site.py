"""The documentation site builds with ``mkdocs build --strict``, and a broken reference fails that build.

``make docs`` is the same build; ``.ci/run`` runs it after the tests. Each
build here takes a few seconds: the site is built once for the checks of its
pages, and once more per kind of breakage.
"""

from __future__ import annotations

import argparse
import inspect
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent.cli.main import build_parser
from fsm_agent.testing import edge_id

ROOT = Path(__file__).resolve().parents[2]


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of ``config`` into ``site``, from the clone (the changelog's include is relative)."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}  # Material's end-of-life banner, no warning of the build
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "--site-dir", str(site)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``make docs`` builds it; the build must succeed without a single warning."""
    out = tmp_path_factory.mktemp("site")
    done = _build(ROOT / "mkdocs.yml", out)
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr, done.stderr
    return out


def _text(page: Path) -> str:
    """A built page's article as plain text."""
    html = page.read_text(encoding="utf-8")
    article = html[html.index("<article") : html.index("</article>")]
    return re.sub(r"<[^>]+>", "", article)


def _commands(parser: argparse.ArgumentParser, prefix: str = "") -> list[str]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                found += [prefix + name, *_commands(sub, f"{prefix}{name} ")]
    return found


@pytest.mark.subprocess
def test_the_cli_reference_has_a_section_per_command(site: Path) -> None:
    """Every command and `runs` action of the real parser has its own heading on the built page."""
    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = _commands(build_parser())
    assert {"run", "runs list", "runs resume", "batch", "diagram", "ui", "demo"} <= set(commands)
    for command in commands:
        assert f'id="{command.replace(" ", "-")}"' in html, command


@pytest.mark.subprocess
def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    """Each name of ``fsm_agent.__all__`` has its entry, and Agent's page shows its docstring's summary."""
    pages = "".join(p.read_text(encoding="utf-8") for p in (site / "reference" / "api").rglob("index.html"))
    missing = [name for name in fsm_agent.__all__ if f'id="fsm_agent.{name}"' not in pages]
    assert missing == []
    summary = (fsm_agent.Agent.__doc__ or "").strip().splitlines()[0]
    assert summary in _text(site / "reference" / "api" / "agent" / "index.html")


@pytest.mark.subprocess
def test_no_rest_role_reaches_a_page(site: Path) -> None:
    """Docstrings' ``:func:`name``` roles are shown as code (``docs/hooks/griffe_roles.py``), never as markup."""
    pages = sorted((site / "reference" / "api").rglob("index.html"))
    assert [p.parent.name for p in pages if re.search(r":(func|class|meth|mod):`", _text(p))] == []


@pytest.mark.subprocess
def test_the_changelogs_nested_items_stay_nested_on_the_site(site: Path) -> None:
    """Python-Markdown nests a list only under four spaces: each nested item of CHANGELOG.md is an inner list item."""
    source = (ROOT / "CHANGELOG.md").read_text(encoding="utf-8").splitlines()
    assert [line for line in source if re.match(r" {1,3}[-*] ", line)] == []  # would render as a top-level item
    nested = sum(1 for line in source if re.match(r" {4}[-*] ", line))
    html = (site / "changelog" / "index.html").read_text(encoding="utf-8")
    inner = sum(item.count("<li>") for item in re.findall(r"<li>(?:(?!</li>).)*?<ul>(.*?)</ul>", html, re.DOTALL))
    assert nested > 0
    assert inner == nested


def _config_beside_the_clone() -> str:
    """``mkdocs.yml`` for a copy of ``docs/`` elsewhere: the paths it names relative to itself point into the clone."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    moved = {
        'paths: ["."]': f"paths: [{str(ROOT)!r}]",  # the package, for the API pages
        "  - fsm_agent\n": f"  - {ROOT / 'fsm_agent'}\n",  # watched by `make docs-serve`
        "  - CHANGELOG.md\n": f"  - {ROOT / 'CHANGELOG.md'}\n",
        "  - diagrams\n": f"  - {ROOT / 'diagrams'}\n",
    }
    for relative, absolute in moved.items():
        assert relative in config, f"mkdocs.yml no longer has {relative!r}: update this test"
        config = config.replace(relative, absolute)
    return config


BREAKAGES = {
    "a link to a missing page": ("concepts/machine.md", "\nSee [nowhere](nowhere.md).\n", "nowhere.md"),
    "a link to a missing anchor": (
        "concepts/stops.md",
        "\nSee [there](machine.md#no-such-heading).\n",
        "no-such-heading",
    ),
    "a page left out of the nav": ("concepts/orphan.md", "# Orphan\n", "orphan.md"),
}


@pytest.mark.subprocess
@pytest.mark.parametrize("breakage", list(BREAKAGES))
def test_a_broken_reference_fails_the_strict_build(breakage: str, tmp_path: Path) -> None:
    """A copy of the docs with one breakage does not build: strictness is proven, not assumed."""
    page, added, named = BREAKAGES[breakage]
    shutil.copytree(ROOT / "docs", tmp_path / "docs")
    (tmp_path / "mkdocs.yml").write_text(_config_beside_the_clone(), encoding="utf-8")
    target = tmp_path / "docs" / page
    target.write_text((target.read_text(encoding="utf-8") if target.exists() else "") + added, encoding="utf-8")
    done = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert done.returncode != 0
    assert "in strict mode" in done.stdout + done.stderr
    warnings = [line for line in done.stderr.splitlines() if line.startswith("WARNING")]
    assert len(warnings) == 1, done.stderr  # the copy is otherwise clean: the breakage alone failed it
    assert named in done.stderr[done.stderr.index(warnings[0]) :]  # the warning, or the list of files under it


def test_every_relative_link_in_the_readme_names_a_file_of_the_clone() -> None:
    """The landing page links into docs/; mkdocs does not build it, so its links are checked here."""
    readme = ROOT / "README.md"
    targets = re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", readme.read_text(encoding="utf-8"))
    assert len(targets) > 20
    missing = sorted({t for t in targets if not (ROOT / t).exists()})
    assert not missing, f"README links to files that do not exist: {missing}"


def _nav_labels(site: Path) -> list[str]:
    """The labels of the home page's navigation, in order: sections and pages."""
    html = (site / "index.html").read_text(encoding="utf-8")
    nav = html[html.index("md-nav--primary") : html.index("md-sidebar--secondary")]
    labels = re.findall(r'<span class="md-ellipsis">\s*(.*?)\s*</span>', nav, re.DOTALL)
    return [re.sub(r"\s+", " ", label) for label in labels]


@pytest.mark.subprocess
def test_the_tutorial_is_one_level_of_the_navigation(site: Path) -> None:
    """The Tutorial section is its index page's own link, not a heading over a page of the same name."""
    labels = _nav_labels(site)
    assert labels.count("Tutorial") == 1
    assert labels.index("Tutorial") + 1 == labels.index("A first agent")


HOW_TO_GROUPS = ("Providers", "Building agents", "Embedding in apps", "Durable runs", "Watching runs")


@pytest.mark.subprocess
def test_the_how_to_guides_are_grouped(site: Path) -> None:
    """Every how-to page sits in exactly one named group of the navigation, none loose under How-to guides."""
    config = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    section = config[config.index("  - How-to guides:\n") : config.index("  - Concepts:\n")]
    loose = re.findall(r"^ {6}- how-to/", section, re.MULTILINE)
    groups = re.findall(r"^ {6}- ([^:\n]+):\n((?: {10}- how-to/\S+\n)+)", section, re.MULTILINE)
    placed = [page for _, pages in groups for page in re.findall(r"how-to/\S+", pages)]
    assert loose == []
    assert tuple(name for name, _ in groups) == HOW_TO_GROUPS
    assert sorted(placed) == sorted(f"how-to/{page.name}" for page in (ROOT / "docs" / "how-to").glob("*.md"))
    assert max(len(re.findall(r"how-to/", pages)) for _, pages in groups) <= 9
    labels = _nav_labels(site)
    assert [label for label in labels if label in HOW_TO_GROUPS] == list(HOW_TO_GROUPS)


@pytest.mark.subprocess
def test_the_decisions_page_is_called_design_notes_in_the_navigation(site: Path) -> None:
    """The page on what the package decided on its own is listed as Design notes."""
    html = (site / "index.html").read_text(encoding="utf-8")
    assert re.search(r'href="decisions/"[^>]*>\s*<span class="md-ellipsis">\s*Design notes\s*</span>', html)


def _external(html: str) -> list[str]:
    """Scripts and stylesheets a page loads from another host (an absolute or scheme-relative URL)."""
    found = re.findall(r'<script\b[^>]*\bsrc="((?:[a-z]+:)?//[^"]*)"', html)
    for tag in re.findall(r"<link\b[^>]*>", html):
        href = re.search(r'\bhref="((?:[a-z]+:)?//[^"]*)"', tag)
        if href and re.search(r'\brel="(?:stylesheet|preconnect|preload|modulepreload)"', tag):
            found.append(href[1])
    return found


@pytest.mark.subprocess
def test_no_page_loads_a_script_a_stylesheet_or_a_font_from_another_host(site: Path) -> None:
    """The site works offline: nothing from a CDN or Google Fonts, and no Mermaid to fetch one."""
    pages = sorted(site.rglob("*.html"))
    assert len(pages) > 50
    loaded = {p.relative_to(site).as_posix(): _external(p.read_text(encoding="utf-8")) for p in pages}
    assert {page: hosts for page, hosts in loaded.items() if hosts} == {}
    assert [p.relative_to(site).as_posix() for p in pages if 'class="mermaid"' in p.read_text(encoding="utf-8")] == []


@pytest.mark.subprocess
def test_the_site_serves_the_committed_drawings(site: Path) -> None:
    """Every SVG under diagrams/ is a file of the site at the same path, byte for byte (docs/hooks/diagrams.py)."""
    committed = sorted((ROOT / "diagrams").rglob("*.svg"))
    assert {"agent_loop.svg", "agent_loop_compact.svg"} <= {svg.name for svg in committed}
    for svg in committed:
        served = site / svg.relative_to(ROOT)
        assert served.is_file(), served
        assert served.read_bytes() == svg.read_bytes()


@pytest.mark.subprocess
@pytest.mark.parametrize("page", ["index.html", "concepts/machine/index.html"])
def test_the_home_and_machine_pages_show_the_compact_drawing_as_a_link_to_itself(site: Path, page: str) -> None:
    """The drawing is an image of the compact SVG inside a link to that SVG, so a click opens it at full size."""
    html = (site / page).read_text(encoding="utf-8")
    shown = re.findall(r'<a class="machine-drawing" href="([^"]+)"[^>]*><img alt="[^"]+" src="([^"]+)"', html)
    assert len(shown) == 1, shown
    href, src = shown[0]
    assert href == src
    assert (site / page).parent.joinpath(src).resolve() == (site / "diagrams" / "agent_loop_compact.svg").resolve()


@pytest.mark.subprocess
def test_the_machine_page_links_the_full_drawing_and_the_run_paths(site: Path) -> None:
    """The full drawing and each committed run path are linked from the machine page, and the links resolve."""
    page = site / "concepts" / "machine" / "index.html"
    links = set(re.findall(r'href="([^"]+\.svg)"', page.read_text(encoding="utf-8")))
    targets = {(page.parent / link).resolve() for link in links}
    wanted = [site / "diagrams" / "agent_loop.svg", *sorted((site / "diagrams" / "runs").glob("*.svg"))]
    assert len(wanted) > 2
    assert {w.resolve() for w in wanted} <= targets


def test_the_machine_page_names_every_edge_by_its_edge_id() -> None:
    """The edge list and the stepping example use edge ids, ``Source->Dest[label]``, as ``edges()`` does."""
    text = (ROOT / "docs" / "concepts" / "machine.md").read_text(encoding="utf-8")
    listing = text[text.index("<!-- stops:start -->") : text.index("<!-- stops:end -->")]
    table = fsm_agent.TABLE
    rows = [row for state in table.states for row in table.rows_from(state) if row.trigger != "finalize"]
    items = re.findall(r"^ {2}\d+\. `([^`]+)` on `([^`]+)`", listing, re.MULTILINE)
    assert items == [(edge_id(row), row.trigger) for row in rows]
    assert re.findall(r"--\w+-->", text) == []  # the form `source --trigger--> dest`
    assert "Failed(" not in listing
    assert "Dispatch->Done[has_no_tool_calls] on dispatch" in text


# --- the Agent reference ------------------------------------------------------------------------------------

HIDDEN_AGENT_MEMBERS = ("children", "refresh_parts", "rows_for")
"""Methods of ``Agent`` the drivers call, left out of the reference (docs/reference/api/agent.md)."""
SETTINGS_VIEWS = ("limits", "table", "on_stop", "stop_conditions", "output")
"""Read-only views of ``agent.settings`` on the agent, described in the page's text rather than one entry each."""


def _shown_default(parameter: inspect.Parameter) -> str:
    """A default as the parameter table writes it: ``required``, a function by its dotted name, else its repr."""
    default = parameter.default
    if default is inspect.Parameter.empty:
        return "required"
    if callable(default):
        return f"`{default.__module__}.{default.__qualname__}`"
    return f"`{json.dumps(default)}`" if isinstance(default, str) else f"`{default!r}`"


def _parameter_rows() -> list[list[str]]:
    """The cells of each row of the Agent page's parameter table."""
    text = (ROOT / "docs" / "reference" / "api" / "agent.md").read_text(encoding="utf-8")
    table = text[text.index("| parameter | default |") :].split("\n\n")[0].splitlines()[2:]
    return [[cell.strip() for cell in line.strip("|").split(" | ")] for line in table]


def test_the_agent_page_documents_every_parameter_with_its_real_default() -> None:
    """One row per parameter of ``Agent.__init__``, in order, with the default the signature has."""
    parameters = [p for p in inspect.signature(fsm_agent.Agent.__init__).parameters.values() if p.name != "self"]
    rows = _parameter_rows()
    assert [row[0] for row in rows] == [f"`{p.name}`" for p in parameters]
    assert [row[1] for row in rows] == [_shown_default(p) for p in parameters]
    assert all(len(row) == 4 and row[2] and row[3] for row in rows), rows


@pytest.mark.subprocess
def test_the_agent_page_shows_the_table_and_hides_the_drivers_methods(site: Path) -> None:
    """The built page has the table, every public method of Agent but the drivers' own, and none of those."""
    html = (site / "reference" / "api" / "agent" / "index.html").read_text(encoding="utf-8")
    assert "<th>parameter</th>" in html
    for name in ("strict_hooks", "max_concurrency", "tool_timeout", "clock"):
        assert f"<td><code>{name}</code></td>" in html, name
    shown = set(re.findall(r'id="fsm_agent\.Agent\.(\w+)"', html))
    public = {name for name, _ in inspect.getmembers(fsm_agent.Agent) if not name.startswith("_")}
    assert set(HIDDEN_AGENT_MEMBERS) | set(SETTINGS_VIEWS) <= public  # else the lists name what no longer exists
    assert shown == public - set(HIDDEN_AGENT_MEMBERS) - set(SETTINGS_VIEWS)
    for name in SETTINGS_VIEWS:
        assert f"<code>agent.{name}</code>" in html, name


@pytest.mark.subprocess
def test_the_agent_page_documents_how_a_run_is_driven(site: Path) -> None:
    """AgentRun's methods come from its driver classes; the page still shows advance, finish and what a run holds."""
    html = (site / "reference" / "api" / "agent" / "index.html").read_text(encoding="utf-8")
    shown = set(re.findall(r'id="fsm_agent\.AgentRun\.(\w+)"', html))
    assert {"advance", "aadvance", "finish", "afinish", "decide", "snapshot", "result", "trace", "state"} <= shown
