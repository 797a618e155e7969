"""Every code block of the README and ``docs/``, parsed into steps a page runs in order, outside the clone.

The conventions a page follows (``docs/contributing/snippets.md`` says the same
for writers):

- A ```` ```python ```` block runs. A page's blocks run in order in one
  interpreter and share their names, as a reader pasting them one after the
  other would.
- A block whose fence has ``title="name.ext"`` is a file the reader saves:
  it is written under that name in the page's directory, not run.
- A ```` ```text title="Output" ```` block right after a python block is
  what that block prints; the printed text must equal it. A line ``...``
  stands for any number of lines.
- A ```` ```console ```` block holds commands after ``$ ``; the lines under a
  command are its output, checked the same way. ``fsm-agent ...`` (the
  command pip installs), ``python -m fsm_agent ...`` and ``python file.py``
  run; ``pip install '.[extras]'`` (in the clone) and ``pip install
  --find-links dist 'fsm-agent[extras]'`` (the wheel ``make dist`` built)
  are checked against the extras in ``pyproject.toml``, and ``make target``
  against the Makefile (the suite itself is what ``make test`` runs).
- ``<!-- fixture: NAME ARG... -->`` anywhere on a page asks for a documented
  fixture (``tests/support/doc_fixtures.py``) before the page runs; fixtures set
  environment variables a snippet reads, such as a loopback provider's URL.
- Every other fence is shown, not run: ``text`` (output, tables), ``mermaid``
  and ``dot`` (drawings, checked by ``make diagram``), ``json`` without a title.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SHOWN_ONLY = frozenset({"text", "mermaid", "dot", "json", "jsonl", "toml", "yaml", "sql", "html", ""})
_FENCE = re.compile(r"^(?P<indent> *)```(?P<info>[^`\n]*)\n(?P<body>.*?)^(?P=indent)```[ \t]*$", re.M | re.S)
_TITLE = re.compile(r'title="(?P<title>[^"]+)"')
_FIXTURE = re.compile(r"<!--\s*fixture:\s*(?P<spec>[^>]*?)\s*-->")


@dataclass(frozen=True)
class Step:
    """One thing a page does: ``kind`` is ``python``, ``file`` or ``command``; ``expected`` is shown output or None."""

    kind: str
    line: int
    text: str
    name: str = ""
    expected: str | None = None


@dataclass
class Page:
    """A Markdown page's steps and the fixtures it asks for."""

    path: Path
    steps: list[Step] = field(default_factory=list)
    fixtures: list[list[str]] = field(default_factory=list)

    @property
    def label(self) -> str:
        return self.path.relative_to(ROOT).as_posix() if self.path.is_relative_to(ROOT) else self.path.name


def pages() -> list[Path]:
    """The README and every page under ``docs/``, in a stable order."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def _dedent(body: str, indent: str) -> str:
    return "".join(line.removeprefix(indent) for line in body.splitlines(keepends=True))


def parse(path: Path) -> Page:
    """The page's steps in order; an unknown fence language is an error naming the line."""
    text = path.read_text(encoding="utf-8")
    page = Page(path, fixtures=[shlex.split(m["spec"]) for m in _FIXTURE.finditer(text)])
    fences = list(_FENCE.finditer(text))
    for index, fence in enumerate(fences):
        line = text.count("\n", 0, fence.start()) + 2  # the block's first line, after the fence
        info = fence["info"].strip()
        language = info.split(" ", 1)[0] if info else ""
        body = _dedent(fence["body"], fence["indent"])
        title = _TITLE.search(info)
        if language == "text" and title and title["title"] == "Output":
            continue  # read as the expected output of the block before it
        if title:
            page.steps.append(Step("file", line, body, name=title["title"]))
        elif language == "python":
            expected = None
            following = fences[index + 1] if index + 1 < len(fences) else None
            if following is not None and not text[fence.end() : following.start()].strip():
                shown = _TITLE.search(following["info"])
                if following["info"].startswith("text") and shown and shown["title"] == "Output":
                    expected = _dedent(following["body"], following["indent"])
            page.steps.append(Step("python", line, body, expected=expected))
        elif language == "console":
            page.steps.extend(_commands(body, line))
        elif language not in SHOWN_ONLY:
            msg = f"{path.name}:{line}: fence language {language!r} is neither run nor shown-only"
            raise ValueError(msg)
    return page


def _commands(body: str, first_line: int) -> list[Step]:
    steps: list[Step] = []
    command: list[str] = []
    output: list[str] = []
    start = first_line

    def close() -> None:
        if command:
            shown = "".join(output) if output else None
            steps.append(Step("command", start, " ".join(command), expected=shown))

    lines = body.splitlines(keepends=True)
    for offset, raw in enumerate(lines):
        if raw.startswith("$ "):
            close()
            command, output, start = [raw[2:].rstrip("\n").rstrip("\\").strip()], [], first_line + offset
        elif command and not output and command[-1] != "" and lines[offset - 1].rstrip("\n").endswith("\\"):
            command.append(raw.strip().rstrip("\\").strip())  # a continued command line
        elif command:
            output.append(raw)
        elif raw.strip():
            msg = f"line {first_line + offset}: a console block starts with a `$ ` command"
            raise ValueError(msg)
    close()
    return steps


def matches(expected: str, actual: str) -> bool:
    """Whether printed text equals the shown text, where a shown line ``...`` stands for any number of lines."""
    want = expected.rstrip("\n").split("\n")
    got = actual.rstrip("\n").split("\n") if actual.strip() else []
    if expected.strip() == "":
        return not got

    def fit(i: int, j: int) -> bool:
        if i == len(want):
            return j == len(got)
        if want[i] == "...":
            return any(fit(i + 1, k) for k in range(j, len(got) + 1))
        return j < len(got) and want[i].rstrip() == got[j].rstrip() and fit(i + 1, j + 1)

    return fit(0, 0)


RUNNER = (Path(__file__).parent / "doc_runner.py").read_text(encoding="utf-8")
_PROXY_VARIABLES = ("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "http_proxy", "https_proxy", "all_proxy")


def run_page(page: Page, cwd: Path, extra_env: dict[str, str]) -> list[str]:
    """The failures of one page's steps, each naming its line; empty when every step ran and printed as shown."""
    env = {k: v for k, v in os.environ.items() if k not in _PROXY_VARIABLES and k != "PYTHONPATH"}
    env |= {"PYTHONHASHSEED": "0", "COLUMNS": "100", "NO_COLOR": "1", **extra_env}
    job = {
        "root": str(ROOT),
        "page": page.label,
        "steps": [vars(step) for step in page.steps],
    }
    report = cwd / ".snippet-results.json"
    done = subprocess.run(
        [sys.executable, "-c", RUNNER, str(report)],
        input=json.dumps(job),
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    results = json.loads(report.read_text(encoding="utf-8")) if report.exists() else []
    failures: list[str] = []
    for step, result in zip(page.steps, results, strict=False):
        where = f"{page.label}:{step.line}"
        if result["error"] is not None:
            failures.append(f"{where}: {step.kind} failed:\n{result['error']}")
        elif step.expected is not None and not matches(step.expected, result["printed"]):
            failures.append(f"{where}: printed\n{result['printed']}\nbut the page shows\n{step.expected}")
    if len(results) < len(page.steps) and not failures:
        failures.append(f"{page.label}: the runner stopped after {len(results)} steps\n{done.stderr}")
    return failures
