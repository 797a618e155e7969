"""The snippet runner itself: it catches a wrong output, a failing block, an unknown extra, a stray language."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.doc_snippets import matches, parse, run_page

PAGE = """# A page

```python
names = ["a", "b"]
print(len(names))
```

```text title="Output"
2
```

```python title="helper.py"
def shout(text):
    return text.upper()
```

```python
from helper import shout
print(shout(names[0]))
```

```text title="Output"
{second}
```

```console
$ pip install '.[{extra}]'
$ python -c "print('x'); print('y'); print('z')"
x
...
z
```
"""


def _page(tmp_path: Path, second: str = "A", extra: str = "ui") -> Path:
    page = tmp_path / "page.md"
    page.write_text(PAGE.format(second=second, extra=extra), encoding="utf-8")
    return page


def test_a_page_whose_blocks_print_what_it_shows_passes(tmp_path: Path) -> None:
    """Blocks share names, a titled block is a file the next one imports, `...` stands for lines."""
    page = parse(_page(tmp_path))
    assert [s.kind for s in page.steps] == ["python", "file", "python", "command", "command"]
    (tmp_path / "run").mkdir()
    assert run_page(page, tmp_path / "run", {}) == []


def test_a_block_printing_other_than_its_shown_output_fails_naming_its_line(tmp_path: Path) -> None:
    """The second python block prints A; a page showing B fails at that block's line."""
    (tmp_path / "run").mkdir()
    failures = run_page(parse(_page(tmp_path, second="B")), tmp_path / "run", {})
    assert len(failures) == 1
    assert failures[0].startswith("page.md:18: printed\nA\n")


def test_a_pip_line_naming_an_extra_the_project_lacks_fails(tmp_path: Path) -> None:
    """`pip install '.[nosuch]'` is checked against pyproject.toml's extras."""
    (tmp_path / "run").mkdir()
    failures = run_page(parse(_page(tmp_path, extra="nosuch")), tmp_path / "run", {})
    assert len(failures) == 1
    assert "no such extra in pyproject.toml: ['nosuch']" in failures[0]


def test_a_raising_block_fails_with_its_traceback_and_the_page_stops(tmp_path: Path) -> None:
    """The traceback names the page and line; the blocks after it do not run."""
    page = tmp_path / "page.md"
    page.write_text("```python\nraise KeyError('gone')\n```\n\n```python\nprint('after')\n```\n", encoding="utf-8")
    failures = run_page(parse(page), tmp_path, {})
    assert len(failures) == 1
    assert 'File "page.md:2"' in failures[0]
    assert "KeyError: 'gone'" in failures[0]


def test_a_fence_in_a_language_neither_run_nor_shown_is_an_error(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("```ruby\nputs 1\n```\n", encoding="utf-8")
    with pytest.raises(ValueError, match=r"page.md:2: fence language 'ruby'"):
        parse(page)


@pytest.mark.parametrize(
    ("shown", "printed", "equal"),
    [("a\n...\nd\n", "a\nb\nc\nd\n", True), ("a\n...\n", "a\n", True), ("a\nb\n", "a\nc\n", False), ("", "x", False)],
)
def test_shown_output_matches_printed_text_with_dots_for_any_lines(shown: str, printed: str, equal: bool) -> None:
    assert matches(shown, printed) is equal


def test_every_documented_fixture_is_in_the_writers_guide() -> None:
    """docs/contributing/snippets.md lists each fixture a page may ask for, so a writer knows what exists."""
    from support.doc_fixtures import FIXTURES
    from support.doc_snippets import ROOT

    guide = (ROOT / "docs" / "contributing" / "snippets.md").read_text(encoding="utf-8")
    assert sorted(name for name in FIXTURES if f"| `{name}" not in guide) == []
