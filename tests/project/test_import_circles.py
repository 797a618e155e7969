"""Imports go one way: no circle runs when a module loads, and every circle inside a folder is one the page names.

docs/concepts/architecture.md, "Circles inside a folder, and why": between folders imports go one way (held by
``tests/project/test_api.py`` for import statements); inside a folder, each circle "is either for the type
checker only or an import made inside a function, so no module needs another half-built when it loads", and the
page names each one.  The imports are read with ``ast``: module-level ones, those under ``TYPE_CHECKING``, those
inside a function (a module ``__getattr__`` included) and ``importlib.import_module("fsm_agent...")``.
"""

from __future__ import annotations

import ast
import functools
import re
from pathlib import Path
from typing import NamedTuple

import fsm_agent

PACKAGE = Path(fsm_agent.__file__).resolve().parent
ARCHITECTURE = PACKAGE.parent / "docs" / "concepts" / "architecture.md"


class Edge(NamedTuple):
    source: str  # fsm_agent.core.stepper
    target: str
    kind: str  # "module", "type-checking", "function", "importlib"
    line: int
    names: tuple[str, ...]
    function: str = ""


def _module_of(path: Path) -> str:
    parts = list(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {_module_of(path): path for path in PACKAGE.rglob("*.py")}


def _resolve(name: str) -> str:
    while name not in MODULES and "." in name:
        name = name.rsplit(".", 1)[0]
    return name


@functools.cache  # read when a test first asks, not when the suite is collected
def _edges() -> list[Edge]:
    found: list[Edge] = []
    for module, path in MODULES.items():
        package = module if path.name == "__init__.py" else module.rsplit(".", 1)[0]

        def visit(node: ast.AST, kind: str, function: str, module: str = module, package: str = package) -> None:
            for child in ast.iter_child_nodes(node):
                inner, where = kind, function
                if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test) and kind == "module":
                    inner = "type-checking"
                elif isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                    inner, where = "function", where or child.name
                if isinstance(child, ast.ImportFrom):
                    base = child.module or ""
                    if child.level:
                        up = package.split(".")[: len(package.split(".")) - (child.level - 1)]
                        base = ".".join([*up, base] if base else up)
                    if base.split(".")[0] == "fsm_agent":
                        for alias in child.names:
                            full = f"{base}.{alias.name}"
                            target = full if full in MODULES else _resolve(base)
                            found.append(Edge(module, target, kind, child.lineno, (alias.name,), function))
                elif isinstance(child, ast.Import):
                    found.extend(
                        Edge(module, _resolve(alias.name), kind, child.lineno, (), function)
                        for alias in child.names
                        if alias.name.startswith("fsm_agent.")
                    )
                elif (
                    isinstance(child, ast.Call)
                    and ast.unparse(child.func).endswith("import_module")
                    and child.args
                    and isinstance(child.args[0], ast.Constant)
                    and str(child.args[0].value).startswith("fsm_agent.")
                ):
                    found.append(Edge(module, _resolve(str(child.args[0].value)), "importlib", child.lineno, (), where))
                visit(child, inner, where)

        visit(ast.parse(path.read_text(encoding="utf-8")), "module", "")
    return [edge for edge in found if edge.source != edge.target]


def _circles(edges: list[Edge]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan)."""
    after: dict[str, set[str]] = {}
    for edge in edges:
        after.setdefault(edge.source, set()).add(edge.target)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    circles: list[list[str]] = []

    def connect(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(after.get(node, ())):
            if nxt not in index:
                connect(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            part = []
            while True:
                top = stack.pop()
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for node in sorted(MODULES):
        if node not in index:
            connect(node)
    return circles


def _folder(module: str) -> str:
    return module if MODULES[module].name == "__init__.py" else module.rsplit(".", 1)[0]


def _described(circles: list[list[str]], edges: list[Edge]) -> list[str]:
    return [
        f"{[m.removeprefix('fsm_agent.') for m in circle]}: "
        + "; ".join(
            f"{MODULES[e.source].relative_to(PACKAGE.parent)}:{e.line} -> {e.target.removeprefix('fsm_agent.')} "
            f"({e.kind})"
            for e in sorted({e._replace(names=()) for e in edges if e.source in circle and e.target in circle})
        )
        for circle in circles
    ]


def test_the_walk_sees_each_kind_of_import() -> None:
    """Module-level, type-checking, in-function and importlib imports are all found (so an empty finding counts)."""
    kinds = {edge.kind for edge in _edges()}
    assert kinds == {"module", "type-checking", "function", "importlib"}
    assert len(_edges()) > 500


def test_no_circle_of_imports_runs_when_the_modules_load() -> None:
    """The imports made while a module loads (module level, outside ``TYPE_CHECKING``) form no circle."""
    loading = [edge for edge in _edges() if edge.kind == "module"]
    assert _described(_circles(loading), loading) == []


def test_importlib_points_down_the_list_only_where_the_page_says() -> None:
    """``importlib`` names a module of the package only for ``Agent("provider:model")``: ``models.named``."""
    loaded = sorted((edge.source, edge.target) for edge in _edges() if edge.kind == "importlib")
    assert loaded == [("fsm_agent.drivers.checks", "fsm_agent.models.named")]
    assert "loads `models.named` with `importlib`" in ARCHITECTURE.read_text(encoding="utf-8")


def _page_bullets() -> dict[str, str]:
    """The bullets of the page's "Circles inside a folder" section, by the folder each starts with."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    section = text.split("## Circles inside a folder", 1)[1].split("\n## ", 1)[0]
    bullets = re.findall(r"^- `(\w+)`:(.*?)(?=^- |\Z)", section, re.MULTILINE | re.DOTALL)
    return {folder: " ".join(body.split()) for folder, body in bullets}


def _named_edges() -> set[tuple[str, str]]:
    """The in-folder imports the page names as the ones that close a circle, each (source, target) module."""
    build_parser = {
        ("cli.main", e.target.removeprefix("fsm_agent."))
        for e in _edges()
        if e.source == "fsm_agent.cli.main" and e.function == "build_parser"
    }
    return {
        ("core.firing", "core.stepper"),  # `firing` names `Stepper` for the type checker only
        ("definition.run", "definition.stops"),  # `run` names `Stop`, `Row` and `Table` for the type checker only
        ("definition.run", "definition.table"),
        ("definition.table_checks", "definition.table"),  # `table_checks` names `Row` for the type checker only
        ("drivers.base", "drivers.agent"),  # `base`, `child` and `agent_run` name `Agent` for the type checker only
        ("drivers.child", "drivers.agent"),
        ("drivers.agent_run", "drivers.agent"),
        *(
            (f"drivers.{name}", "drivers.agent")
            for name in ("agent_again", "child_stored", "fork", "read_back", "rebuild")
        ),
        ("drivers.base", "drivers.agent_run"),  # these five name `AgentRun` for the type checker only
        ("drivers.child_runs", "drivers.agent_run"),
        ("drivers.child_stored", "drivers.agent_run"),
        ("drivers.cut_runs", "drivers.agent_run"),
        ("drivers.streaming", "drivers.agent_run"),
        ("drivers.child", "drivers.agent_parts"),  # `child` names `AgentParts`
        ("drivers.base", "drivers.cut_spend"),  # `base` names `InFlight`, `cut_spend` names `RunBase`
        ("cli.run", "cli.batch"),  # `run` imports `batch` inside `own_agent`
        ("persist.store", "persist.sqlite"),  # `store` hands out `SqliteStore` through a module `__getattr__`
        *build_parser,  # `main` imports each command's module inside `build_parser`
        ("cli.reference", "cli.main"),  # `reference` imports `build_parser` inside the function that renders the page
    }


def test_the_circles_this_test_names_are_the_pages() -> None:
    """Each edge listed above is named in its folder's bullet: its importer and what it imports, in backticks."""
    bullets = _page_bullets()
    assert set(bullets) == {"core", "definition", "drivers", "persist", "cli"}
    edges = {(e.source.removeprefix("fsm_agent."), e.target.removeprefix("fsm_agent.")): e for e in _edges()}
    for source, target in _named_edges():
        folder, importer = source.split(".")
        bullet = bullets[folder]
        assert f"`{importer}`" in bullet, (source, bullet)
        edge = edges[source, target]
        assert edge.kind != "module", edge  # a circle's edge is for the type checker or made inside a function
        mentioned = {target.split(".")[-1], *edge.names}
        assert any(f"`{name}`" in bullet for name in mentioned) or importer == "main", (source, target, bullet)


def test_every_circle_inside_a_folder_is_one_the_architecture_page_names() -> None:
    """Without the imports the page names, no two modules of one folder import each other, however indirectly."""
    named = _named_edges()
    inside = [
        edge
        for edge in _edges()
        if _folder(edge.source) == _folder(edge.target)
        and (edge.source.removeprefix("fsm_agent."), edge.target.removeprefix("fsm_agent.")) not in named
    ]
    assert _described(_circles(inside), inside) == []
