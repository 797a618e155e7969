"""The public API: what ``fsm_agent`` exports."""

from __future__ import annotations

import ast
import re
import subprocess
import sys
import types
from collections.abc import Iterator
from pathlib import Path

import pytest

import fsm_agent


def test_all_is_sorted_and_complete() -> None:
    """__all__ lists every public, non-module name of the package, sorted isort-style (as ruff's RUF022 keeps it)."""
    # dir(), not vars(): the stores' names are imported on first use (fsm_agent.__getattr__).
    names = [n for n in dir(fsm_agent) if not n.startswith("_")]
    public = {n for n in names if not isinstance(getattr(fsm_agent, n), types.ModuleType)}
    isort_style = sorted(fsm_agent.__all__, key=lambda n: (0 if n.isupper() else 1 if n[0].isupper() else 2, n))
    assert fsm_agent.__all__ == isort_style
    assert set(fsm_agent.__all__) == public


@pytest.mark.subprocess
def test_importing_the_package_does_not_import_provider_sdks_or_diagrams() -> None:
    """Optional extras and the diagram renderer stay off the import path of the engine."""
    watched = "('openai', 'anthropic', 'graphviz', 'fsm_agent.render', 'fsm_agent.cli')"
    code = f"import sys, fsm_agent; print(sorted(m for m in sys.modules if m.startswith({watched})))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


ARCHITECTURE = Path(__file__).resolve().parents[2] / "docs" / "concepts" / "architecture.md"
PACKAGE = Path(fsm_agent.__file__).resolve().parent


def _architecture_rows() -> list[set[str]]:
    """The places of the architecture page's block, top to bottom (a row may name several: ``mcp, otel``)."""
    block = ARCHITECTURE.read_text(encoding="utf-8").split("```text\n", 1)[1].split("```", 1)[0]
    rows = []
    for line in block.strip().splitlines():
        names = re.split(r"\s{2,}", line.strip(), maxsplit=1)[0]
        rows.append({name.strip().rstrip("/") for name in names.split(",")})
    return rows


def _place_of(module: str) -> str:
    """``fsm_agent.core.stepper`` -> ``core``; the package itself (its public API) is ``fsm_agent``."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else parts[0]


def _imported_places(tree: ast.AST) -> Iterator[str]:
    for node in ast.walk(tree):  # imports inside functions and TYPE_CHECKING blocks count too
        if isinstance(node, ast.ImportFrom) and node.module is not None and node.module.split(".")[0] == "fsm_agent":
            if node.module == "fsm_agent":
                yield from (alias.name if (PACKAGE / alias.name).is_dir() else "fsm_agent" for alias in node.names)
            else:
                yield _place_of(node.module)
        elif isinstance(node, ast.Import):
            yield from (_place_of(alias.name) for alias in node.names if alias.name.startswith("fsm_agent."))


def test_every_place_imports_only_the_places_the_architecture_page_lists_above_it() -> None:
    """The architecture block is the import order: a module never imports a place listed below its own."""
    rank = {place: i for i, row in enumerate(_architecture_rows()) for place in row}
    # The package's public API gathers everything up to the drivers and the checker; __main__ is the command line's.
    rank["fsm_agent"], rank["__main__"] = rank["proof"] + 0.5, rank["cli"]
    found = {
        path.stem if path.parent == PACKAGE else path.relative_to(PACKAGE).parts[0] for path in PACKAGE.rglob("*.py")
    }
    found.discard("__init__")
    assert found <= set(rank), f"places missing from docs/concepts/architecture.md: {sorted(found - set(rank))}"
    wrong = []
    for path in sorted(PACKAGE.rglob("*.py")):
        relative = path.relative_to(PACKAGE)
        source = (
            "fsm_agent"
            if relative == Path("__init__.py")
            else _place_of(f"fsm_agent.{relative.with_suffix('').as_posix().replace('/', '.')}")
        )
        for target in _imported_places(ast.parse(path.read_text(encoding="utf-8"))):
            if rank[target] > rank[source]:
                wrong.append(f"{relative} imports {target}, listed below {source}")
    assert wrong == []


def test_no_module_of_the_package_is_much_over_400_lines() -> None:
    """A module that outgrows about 400 lines holds more than one thing; split it by what its parts hold."""
    long = {
        str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines())) > 425
    }
    assert long == {}
