"""The documentation site builds with ``mkdocs build --strict``, and a broken reference fails that build.

``make docs`` is the same build; ``.ci/run`` runs it after the tests. Each
build here takes a few seconds: the site is built once for the checks of its
pages, and once more per kind of breakage.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

import fsm_agent
from fsm_agent.cli.main import build_parser

ROOT = Path(__file__).resolve().parent.parent


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


def test_the_cli_reference_has_a_section_per_command(site: Path) -> None:
    """Every command and `runs` action of the real parser has its own heading on the built page."""
    html = (site / "reference" / "cli" / "index.html").read_text(encoding="utf-8")
    commands = _commands(build_parser())
    assert {"run", "runs list", "runs resume", "batch", "diagram", "ui", "demo"} <= set(commands)
    for command in commands:
        assert f'id="{command.replace(" ", "-")}"' in html, command


def test_the_api_reference_documents_every_public_name(site: Path) -> None:
    """Each name of ``fsm_agent.__all__`` has its entry, and Agent's page shows its docstring's summary."""
    pages = "".join(p.read_text(encoding="utf-8") for p in (site / "reference" / "api").rglob("index.html"))
    missing = [name for name in fsm_agent.__all__ if f'id="fsm_agent.{name}"' not in pages]
    assert missing == []
    summary = (fsm_agent.Agent.__doc__ or "").strip().splitlines()[0]
    assert summary in _text(site / "reference" / "api" / "agent" / "index.html")


def test_no_rest_role_reaches_a_page(site: Path) -> None:
    """Docstrings' ``:func:`name``` roles are shown as code (``docs/hooks/griffe_roles.py``), never as markup."""
    pages = sorted((site / "reference" / "api").rglob("index.html"))
    assert [p.parent.name for p in pages if re.search(r":(func|class|meth|mod):`", _text(p))] == []


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
