"""A newcomer's first hour: the version, the command the demo prints, the words users read, the CLI's errors."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import re
import shlex
import subprocess
import sys
import tomllib
import urllib.request
from pathlib import Path

import pytest
from support.store_cases import tick_agent

import fsm_agent
from fsm_agent import SqliteStore
from fsm_agent.cli.main import build_parser, main
from fsm_agent.persist import StoreError, store_for

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CLEAN_PATH = "/usr/local/bin:/usr/bin:/bin"
"""A fresh shell's PATH: no virtual environment active."""


def _fresh_shell() -> dict[str, str]:
    """The environment of a new terminal: no venv on PATH, no VIRTUAL_ENV, no PYTHONPATH."""
    drop = {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}
    return {k: v for k, v in os.environ.items() if k not in drop} | {"PATH": CLEAN_PATH}


# --- 1. the version ------------------------------------------------------------------------------


def test_version_is_the_installed_distributions() -> None:
    """fsm_agent.__version__ is what pip installed, read from the package's metadata."""
    assert fsm_agent.__version__ == importlib.metadata.version("fsm-agent")
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert fsm_agent.__version__ == project["version"]


@pytest.mark.subprocess
def test_importing_the_package_does_not_read_its_metadata() -> None:
    """__version__ is looked up on first use, so `import fsm_agent` does not load importlib.metadata."""
    code = "import sys, fsm_agent; print('importlib.metadata' in sys.modules, fsm_agent.__version__)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.split() == ["False", importlib.metadata.version("fsm-agent")]


def test_an_unknown_attribute_is_still_an_attribute_error() -> None:
    """The module's __getattr__ answers only __version__."""
    with pytest.raises(AttributeError, match="no attribute 'nosuch'"):
        _ = fsm_agent.nosuch


# --- 2. commands that run where they are printed ----------------------------------------------


def test_pyproject_declares_the_fsm_agent_command() -> None:
    """[project.scripts] fsm-agent names the command line's real entry function."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["scripts"] == {"fsm-agent": "fsm_agent.cli.main:main"}
    module, _, name = project["scripts"]["fsm-agent"].partition(":")
    assert getattr(importlib.import_module(module), name) is main


@pytest.mark.subprocess
def test_the_installed_command_runs_in_a_fresh_shell(tmp_path: Path) -> None:
    """`.venv/bin/fsm-agent --help` runs with no virtual environment active."""
    done = subprocess.run(
        [str(BIN / "fsm-agent"), "--help"],
        cwd=tmp_path,
        env=_fresh_shell(),
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert "demo" in done.stdout


@pytest.mark.subprocess
def test_every_command_the_demo_prints_runs_as_printed_in_a_fresh_shell(tmp_path: Path) -> None:
    """The demo, run from the clone as `make demo` does, ends with a `ui` command that serves the runs as printed."""
    demo = subprocess.run(
        [
            str(BIN / "python"),
            "-m",
            "fsm_agent",
            "demo",
            "--out",
            str(tmp_path / "runs"),
            "--store",
            str(tmp_path / "r.db"),
        ],
        cwd=ROOT,
        env=_fresh_shell(),
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert demo.returncode == 0, demo.stderr
    printed = [line.split(": ", 1)[1] for line in demo.stdout.splitlines() if line.startswith("see the runs in")]
    assert len(printed) == 1, demo.stdout
    command = shlex.split(printed[0])
    assert command[0] == ".venv/bin/fsm-agent" if BIN == ROOT / ".venv" / "bin" else command[0].startswith("/")
    # As printed, plus a free port so the test does not collide with a viewer someone has open.
    with subprocess.Popen(
        [*command, "--port", "0"],
        cwd=ROOT,
        env=_fresh_shell(),
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    ) as viewer:
        try:
            assert viewer.stdout is not None
            first = viewer.stdout.readline()
            found = re.search(r"(http://\S+/)", first)
            assert found, f"the printed command did not start the viewer: {first!r}"
            with urllib.request.urlopen(f"{found[1]}api/runs", timeout=30) as response:
                runs = json.loads(response.read())
        finally:
            viewer.terminate()
    listed = runs["runs"] if isinstance(runs, dict) else runs
    assert sorted(run["run_id"] for run in listed) == [
        "A_max_steps",
        "B_repeated_action",
        "C_max_tokens",
        "D_tool_failures",
        "E_done",
    ]


def test_make_demo_runs_the_demo_with_the_venvs_interpreter() -> None:
    """The line `make demo` echoes runs without an active venv: the venv's own interpreter, by its path."""
    recipe = re.search(r"^demo:.*\n\t(?P<line>.+)$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)
    assert recipe is not None
    assert recipe["line"].startswith("$(PY) -m fsm_agent demo")
    assert re.search(r"^PY := \$\(VENV\)/bin/python$", (ROOT / "Makefile").read_text(encoding="utf-8"), re.M)


# --- 3. words for users --------------------------------------------------------------------------

FORBIDDEN = re.compile(r"\b(seeds?|chapters?|issues?)\b|(?<![&\w/])#\d{1,4}(?![\w;-])", re.I)
"""Words of the project's own making that tell a user nothing: where the package came from, not what it does
(an issue's number, ``#28``, included; an HTML entity such as ``&#34;`` or a page's anchor is not one)."""


def _user_pages() -> list[Path]:
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in pages if page.name != "changelog.md"]


def _found(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if FORBIDDEN.search(line)]


@pytest.mark.parametrize("page", _user_pages(), ids=lambda p: p.relative_to(ROOT).as_posix())
def test_no_page_speaks_of_seeds_chapters_or_issues(page: Path) -> None:
    """README and the docs pages (the changelog aside) describe the package, not its history."""
    assert _found(page.read_text(encoding="utf-8")) == []


def _helps() -> dict[str, str]:
    """Every --help text of the command line: the top level, each command, each action of `runs`."""
    texts = {"": build_parser().format_help()}
    parsers: list[tuple[str, argparse.ArgumentParser]] = [("", build_parser())]
    while parsers:
        name, parser = parsers.pop()
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for sub_name, sub in action.choices.items():
                    full = f"{name} {sub_name}".strip()
                    texts[full] = sub.format_help()
                    parsers.append((full, sub))
    return texts


def test_no_help_text_speaks_of_seeds_chapters_or_issues() -> None:
    """Every --help, `demo --help` included, is free of the project's private words."""
    helps = _helps()
    assert {"demo", "runs resume", "ui"} <= set(helps)
    assert {name: _found(text) for name, text in helps.items() if _found(text)} == {}


def test_the_demo_speaks_english_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The demo's lines are English, with counts pluralised, and free of the project's private words."""
    assert main(["demo", "--out", str(tmp_path / "runs"), "--store", str(tmp_path / "r.db")]) == 0
    out = capsys.readouterr().out
    lines = [line for line in out.splitlines() if line[:2] in ("A)", "B)", "C)", "D)", "E)")]
    assert lines == [
        "A) max_steps: 3 steps done",
        "B) repeated_action: 1 step done",
        "C) max_tokens: text kept 'First I add, which gives'",
        "D) tool_failures: 3 failures in a row, last error quota exceeded",
        "E) done: (2+3)*4 = 20",
    ]
    assert not re.search(r"[\u4e00-\u9fff]", out)
    assert _found(out) == []


def test_the_original_text_is_kept_behind_a_flag(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """`demo --original-text` prints the original Chinese lines, with the same stops and figures."""
    assert main(["demo", "--original-text", "--out", str(tmp_path / "runs"), "--store", str(tmp_path / "r.db")]) == 0
    lines = [line for line in capsys.readouterr().out.splitlines() if line[:2] in ("A)", "B)", "C)", "D)", "E)")]
    assert lines == [
        "A) max_steps: 已完成 3 步",
        "B) repeated_action: 已完成 1 步",
        "C) max_tokens: 保留文本 '我先算加法得'",
        "D) tool_failures: 连续失败 3 次, 最后错误 quota exceeded",
        "E) done: (2+3)*4 = 20",
    ]


# --- 4. the CLI's errors -----------------------------------------------------------------------


@pytest.fixture
def paused(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """A store holding run ``p`` paused for approval of one call, and an ``agents:make`` the CLI can import."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "agents.py").write_text(
        "from support.store_cases import tick_agent\n\n\ndef make():\n    return tick_agent(3)\n", encoding="utf-8"
    )
    db = str(tmp_path / "runs.db")
    with SqliteStore(db) as store:
        tick_agent(3, approve={"tick"}).run("go", store=store, run_id="p")
        (call,) = store.load("p")["pending"]
    return db, str(call["id"])


@pytest.mark.parametrize("given", ["=maybe", "=y", "=true", "=", "=nope:x"])
def test_an_approval_that_is_no_accepted_form_is_refused_and_decides_nothing(
    given: str, paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """`--approve ID=maybe` once rejected the call with "maybe" as the reason; now it is a usage error, exit 1."""
    db, call_id = paused
    code = main(["runs", "resume", "p", "--store", db, "--agent", "agents:make", "--approve", call_id + given])
    err = capsys.readouterr().err
    assert code == 1, err
    assert "--approve ID, --approve ID=yes, --approve ID=no[:WHY] or --reject ID[=WHY]" in err
    with SqliteStore(db) as store:
        assert not store.load("p").get("approvals")


@pytest.mark.parametrize(
    ("flag", "given", "outcome"),
    [
        ("--approve", "", '-> {"n": 0}'),
        ("--approve", "=yes", '-> {"n": 0}'),
        ("--approve", "=no", "rejected this call to 'tick': no reason given"),
        ("--approve", "=no:not today", "rejected this call to 'tick': not today"),
        ("--reject", "", "rejected this call to 'tick': no reason given"),
        ("--reject", "=not today", "rejected this call to 'tick': not today"),
    ],
)
def test_each_accepted_form_decides_as_it_says(
    flag: str, given: str, outcome: str, paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """--approve ID, ID=yes run the call; --approve ID=no[:WHY] and --reject ID[=WHY] reject it, with the reason."""
    db, call_id = paused
    code = main(["runs", "resume", "p", "--store", db, "--agent", "agents:make", "--quiet", flag, call_id + given])
    assert code == 0, capsys.readouterr().err
    with SqliteStore(db) as store:
        first = store.load("p")["steps"][0]["detail"]
    assert first.startswith('tick({"n": 0}) ')
    assert outcome in first


def test_an_error_keeps_its_closing_quote(paused: tuple[str, str], capsys: pytest.CaptureFixture[str]) -> None:
    """`cannot import 'nosuchmod': No module named 'nosuchmod'` keeps the quote its end once lost."""
    db, _ = paused
    assert main(["runs", "resume", "p", "--store", db, "--agent", "nosuchmod:make"]) == 1
    assert capsys.readouterr().err.rstrip("\n").endswith("No module named 'nosuchmod'")


def test_a_missing_run_is_named_without_stray_quotes(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """A KeyError's own text is shown, not its repr: the quotes in it pair up."""
    db, _ = paused
    assert main(["runs", "show", "nosuch", "--store", db]) == 1
    err = capsys.readouterr().err
    assert "nosuch" in err
    assert err.count("'") % 2 == 0, err
    assert not err.startswith('error: "')


def test_a_paused_run_is_shown_awaiting_approval_not_in_execute_tool(
    paused: tuple[str, str], capsys: pytest.CaptureFixture[str]
) -> None:
    """Its tool never ran, so `runs show` and `runs list` say it awaits approval rather than `ExecuteTool`."""
    db, _ = paused
    assert main(["runs", "show", "p", "--store", db]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "run p: awaiting approval, reason paused"
    assert main(["runs", "list", "--store", db]) == 0
    assert capsys.readouterr().out.split("\t")[1] == "awaiting approval"


URL = "mysql://fsm:s3cret@db.example/runs"


@pytest.mark.parametrize(
    "argv",
    [["runs", "list", "--store", URL], ["ui", "--store", URL, "--port", "0"]],
    ids=["runs list", "ui"],
)
def test_a_store_url_of_another_kind_names_the_supported_kinds(
    argv: list[str], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """`--store mysql://...` names what a store may be (once: "no store at mysql://..."), without the password."""
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1, err
    assert "no store at" not in err
    assert "mysql://" in err
    assert "a SQLite file's path or a postgresql://" in err
    assert "s3cret" not in err
    assert list(tmp_path.iterdir()) == []


def test_store_for_refuses_a_url_of_another_kind(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """store="mysql://..." is a StoreError naming the kinds, not a SQLite file called mysql:."""
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StoreError, match=r"a SQLite file's path or a postgresql://") as caught:
        store_for(URL)
    assert "s3cret" not in str(caught.value)
    assert list(tmp_path.iterdir()) == []


# --- 5. the smaller things ---------------------------------------------------------------------


@pytest.mark.subprocess
def test_the_viewer_pluralises_its_counts() -> None:
    """The run header's counts go through one helper that writes `1 step` and `2 steps`."""
    source = (ROOT / "fsm_agent" / "ui" / "static" / "app.js").read_text(encoding="utf-8")
    assert not re.search(r"\$\{[^}]*\} (steps|tool calls|tokens|transitions)\b", source)
    node = subprocess.run(["node", "--version"], capture_output=True, check=False) if _has("node") else None
    if node is not None and node.returncode == 0:
        helper = re.search(r"function counted\(n, noun\) \{.*?\n\}", source, re.S)
        assert helper is not None
        script = (
            helper[0] + '\nconsole.log([counted(1, "step"), counted(2, "step"), counted(0, "tool call")].join("|"))'
        )
        out = subprocess.run(["node", "-e", script], capture_output=True, text=True, check=True).stdout
        assert out.strip() == "1 step|2 steps|0 tool calls"


def _has(program: str) -> bool:
    return any((Path(d) / program).is_file() for d in os.environ.get("PATH", "").split(os.pathsep) if d)


def test_make_test_quick_exists_and_the_readme_says_how_long_make_test_takes() -> None:
    """The README gives `make test`'s time and points to `make test-quick`, a target of the Makefile."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert re.search(r"`make test`[^.]*about \d+ minutes", readme)
    assert "`make test-quick`" in readme
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^test-quick: .*## ", makefile, re.M)
    assert re.search(r"^install: .*## ", makefile, re.M)
    assert re.search(r"^dist: .*## ", makefile, re.M)
