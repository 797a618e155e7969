"""The install the docs print works: the wheel built as ``make dist`` builds it, pip-installed into a fresh venv.

Slow (about a minute: a build in an isolated environment and an install of
the core dependencies), so ``make test-quick`` leaves it out.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from support.doc_snippets import RUNNER, matches, parse

ROOT = Path(__file__).resolve().parents[2]
FIRST_PAGE = ROOT / "docs" / "tutorial" / "first-agent.md"

pytestmark = [pytest.mark.slow, pytest.mark.subprocess]


def _run(*command: str | Path, cwd: Path, timeout: float = 600) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in {"VIRTUAL_ENV", "PYTHONPATH", "PYTHONHOME"}}
    done = subprocess.run(
        [str(part) for part in command], cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout, check=False
    )
    assert done.returncode == 0, f"{command}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


def test_the_built_wheel_installs_in_a_fresh_venv_and_runs_the_first_tutorial_page(tmp_path: Path) -> None:
    """`make dist`'s build, `pip install --find-links dist fsm-agent` in a new venv, then first-agent.md there."""
    pytest.importorskip("build", reason="make dist needs the dev extra's build")
    dist = tmp_path / "dist"
    _run(sys.executable, "-m", "build", "--outdir", dist, ROOT, cwd=tmp_path)
    version = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    assert sorted(p.name for p in dist.iterdir()) == [
        f"fsm_agent-{version}-py3-none-any.whl",
        f"fsm_agent-{version}.tar.gz",
    ]
    _run(sys.executable, "-m", "venv", tmp_path / "venv", cwd=tmp_path)
    python = tmp_path / "venv" / "bin" / "python"
    # As the tutorial prints it: the package from dist/, its core dependencies from the index.
    _run(
        python,
        "-m",
        "pip",
        "install",
        "--quiet",
        "--disable-pip-version-check",
        "--find-links",
        dist,
        "fsm-agent",
        cwd=tmp_path,
    )
    work = tmp_path / "work"  # outside the clone: only the installed package can be imported
    work.mkdir()
    shown = _run(python, "-c", "import fsm_agent; print(fsm_agent.__version__, fsm_agent.__file__)", cwd=work).stdout
    installed_version, where = shown.split()
    assert installed_version == version
    assert Path(where).is_relative_to(tmp_path / "venv")
    assert "usage:" in _run(tmp_path / "venv" / "bin" / "fsm-agent", "--help", cwd=work).stdout
    page = parse(FIRST_PAGE)
    assert "python" in {step.kind for step in page.steps}
    assert not page.fixtures  # runs offline, with no server to start
    job = {"root": str(ROOT), "page": "first-agent.md", "steps": [vars(step) for step in page.steps]}
    report = work / "results.json"
    subprocess.run(
        [python, "-c", RUNNER, report],
        input=json.dumps(job),
        cwd=work,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    results = json.loads(report.read_text(encoding="utf-8"))
    assert len(results) == len(page.steps)
    for step, result in zip(page.steps, results, strict=True):
        assert result["error"] is None, f"first-agent.md:{step.line}: {result['error']}"
        if step.expected is not None:
            assert matches(step.expected, result["printed"]), f"first-agent.md:{step.line}: {result['printed']}"
