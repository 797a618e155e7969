"""The README's `make demo` block, a shown-only ``text`` block the snippet runner does not compare, is what it prints.

``tests/cli/test_cli_hardening.py`` compares the ``A)`` to ``E)`` lines; this compares the whole block the
README shows, the ``path:`` lines and the closing lines included (the store's temporary path aside).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fsm_agent.cli.main import main

ROOT = Path(__file__).resolve().parents[2]


def _readme_demo_block() -> list[str]:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    found = re.search(r"```text\n(A\) max_steps:.*?)```", readme, re.S)
    assert found, "README.md no longer shows the demo's output in a ```text block"
    return found[1].rstrip("\n").split("\n")


def test_the_readme_demo_block_is_what_the_demo_prints(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Every line of the README's block, the path lines too, is printed by `demo --out diagrams/runs` (make demo)."""
    out = tmp_path / "diagrams" / "runs"
    assert main(["demo", "--out", str(out), "--store", str(tmp_path / "runs.db")]) == 0
    printed = capsys.readouterr().out.rstrip("\n").split("\n")
    shown = _readme_demo_block()
    # Everything but the last two lines names directories: compare those by shape.
    assert printed[:-2] == shown[:-2]
    assert printed[-2] == f"run paths drawn in {out}/" or printed[-2].startswith("run paths written as DOT")
    assert shown[-2] == "run paths drawn in diagrams/runs/"
    assert printed[-1].startswith("see the runs in a browser: ")
    assert shown[-1].startswith("see the runs in a browser: ")
    assert printed[-1].endswith(" ui --store " + str(tmp_path / "runs.db"))
