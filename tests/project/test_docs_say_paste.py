"""The tutorial says to save a page's blocks in order into one file and run it with ``python``, and that holds.

An interactive session reads a blank line inside a class or function as its end, so the tutorial's classes
(``WeatherModel`` on the first page) fail with ``IndentationError`` at the 3.11 and 3.12 prompt
(``code.InteractiveConsole`` reads lines as that prompt does). The first pages of the tutorial, saved as one
file, print what the page shows; pasted into a console, the first page fails, so the page's warning is needed.
"""

from __future__ import annotations

import code
import contextlib
import io
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from support.doc_snippets import matches, parse

ROOT = Path(__file__).resolve().parents[2]
TUTORIAL = ROOT / "docs" / "tutorial"
MARK = "--- next block ---"
"""Printed between two blocks of the saved file, so each block's output is compared with the page's."""


def _pasted(page: Path, cwd: Path) -> str:
    """What the console wrote to stderr while each python block of the page was pasted, a line at a time."""
    blocks = re.findall(r"^```python\n(.*?)^```", page.read_text(encoding="utf-8"), re.S | re.M)
    console = code.InteractiveConsole({"__name__": "__main__"})
    errors, shown = io.StringIO(), io.StringIO()
    here = Path.cwd()
    os.chdir(cwd)
    try:
        with contextlib.redirect_stderr(errors), contextlib.redirect_stdout(shown):
            for block in blocks:
                for line in block.splitlines():
                    console.push(line)
                console.push("")
    finally:
        os.chdir(here)
    return errors.getvalue()


def test_the_tutorial_says_to_save_a_pages_blocks_into_one_file() -> None:
    index = " ".join((TUTORIAL / "index.md").read_text(encoding="utf-8").split())
    assert "paste them in order into one Python session" not in index
    assert "save a page's Python blocks (those without a file name) in order into one file" in index
    assert "run it with `python`" in index


@pytest.mark.subprocess
@pytest.mark.parametrize("name", ["first-agent.md", "stops.md", "testing.md"])
def test_a_pages_blocks_saved_as_one_file_print_what_the_page_shows(name: str, tmp_path: Path) -> None:
    """The page's python blocks, in order in one file run with `python`, print each block's shown output."""
    page = parse(TUTORIAL / name)
    assert page.steps, name
    assert {step.kind for step in page.steps} == {"python"}, "a page with files or commands is not one file"
    script = tmp_path / "page.py"
    script.write_text(
        "\n".join(f"{step.text}\nprint({MARK!r})\n" for step in page.steps),
        encoding="utf-8",
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONHASHSEED": "0", "COLUMNS": "100"}
    done = subprocess.run(
        [sys.executable, script.name], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240, check=False
    )
    assert done.returncode == 0, done.stderr
    printed = done.stdout.split(MARK + "\n")
    assert len(printed) == len(page.steps) + 1, done.stdout
    for step, out in zip(page.steps, printed, strict=False):
        if step.expected is not None:
            assert matches(step.expected, out), (
                f"{name}:{step.line}: printed\n{out}\nbut the page shows\n{step.expected}"
            )


def test_pasting_the_first_page_into_an_interactive_session_fails_as_the_tutorial_warns(tmp_path: Path) -> None:
    errors = _pasted(TUTORIAL / "first-agent.md", tmp_path)
    assert "IndentationError" in errors, errors
