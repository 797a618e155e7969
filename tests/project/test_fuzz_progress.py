"""``make fuzz`` shows how far each test got while it runs, not only when it ends."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent.parent


@pytest.mark.subprocess
def test_a_fuzz_run_prints_progress_lines_through_pytest_s_capture(tmp_path: Path) -> None:
    """Under the fuzz profile a Hypothesis test reports every 250 examples, even with output captured and piped."""
    (tmp_path / "test_probe.py").write_text(
        "from hypothesis import given, strategies as st\n"
        "from support.hypothesis_profiles import PROFILE\n\n\n"
        "@PROFILE\n@given(st.integers())\n"
        "def test_probe(x: int) -> None:\n"
        "    assert isinstance(x, int)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(TESTS), "FSM_AGENT_HYPOTHESIS": "fuzz"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "support.hypothesis_profiles",
            "test_probe.py",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if "examples tried" in line]
    assert lines[0].strip().startswith("test_probe: 250 examples tried (budget 4000")
    assert any("test_probe: 4000 examples tried" in line for line in lines)
