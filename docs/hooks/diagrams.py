"""An MkDocs hook: the committed Graphviz drawings under ``diagrams/`` become files of the site.

The site shows the machine as ``make diagram`` draws it: ``agent_loop.svg``
(one edge per row), ``agent_loop_compact.svg`` (each state's stops folded
into one edge) and the demo's run paths under ``diagrams/runs/``.  They are
served from the site itself, at the same paths as in the repository, so a
page links them as ``../diagrams/agent_loop.svg`` and the strict build checks
each link.  The tests check the committed drawings against a fresh render
(``tests/render/test_diagram*.py``), so copying them needs no Graphviz here.  Like
the changelog's include, the folder is found from the directory the build
runs in, the clone.
"""

from __future__ import annotations

from pathlib import Path

from mkdocs.config.defaults import MkDocsConfig
from mkdocs.structure.files import File, Files

DIAGRAMS = Path("diagrams")
"""The drawings' folder, relative to the clone the build runs in."""


def on_files(files: Files, config: MkDocsConfig) -> Files:
    """Add every SVG under ``diagrams/`` to the site, at its path in the repository."""
    drawings = sorted(DIAGRAMS.resolve().rglob("*.svg"))
    if not drawings:
        msg = f"no drawing under {DIAGRAMS.resolve()}: build the site from the clone, after `make diagram`"
        raise FileNotFoundError(msg)
    for svg in drawings:
        uri = (DIAGRAMS / svg.relative_to(DIAGRAMS.resolve())).as_posix()
        files.append(File.generated(config, uri, abs_src_path=str(svg)))
    return files
