"""The public API: what ``fsm_agent`` exports."""

from __future__ import annotations

import subprocess
import sys
import types

import fsm_agent


def test_all_is_sorted_and_complete() -> None:
    """__all__ lists every public, non-module name of the package, sorted isort-style (as ruff's RUF022 keeps it)."""
    public = {n for n, v in vars(fsm_agent).items() if not n.startswith("_") and not isinstance(v, types.ModuleType)}
    isort_style = sorted(fsm_agent.__all__, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert fsm_agent.__all__ == isort_style
    assert set(fsm_agent.__all__) == public


def test_importing_the_package_does_not_import_provider_sdks_or_diagrams() -> None:
    """Optional extras and the diagram renderer stay off the import path of the engine."""
    watched = "('openai', 'anthropic', 'graphviz', 'fsm_agent.render', 'fsm_agent.cli')"
    code = f"import sys, fsm_agent; print(sorted(m for m in sys.modules if m.startswith({watched})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
