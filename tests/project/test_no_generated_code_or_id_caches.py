"""No code is generated, the package never reads its own source, and nothing is cached by ``id()``.

docs/concepts/architecture.md ("The interpreter"): "No code is generated and nothing is cached by `id()`";
docs/speed.md ("The plain interpreter"): the generated fires "are gone, with the caches keyed by `id()` that kept
it; a table's walker is found by the table's value".  The package is read with ``ast`` (the test reads the
package's source; the package must not).
"""

from __future__ import annotations

import ast
import functools
from collections.abc import Iterator
from pathlib import Path

import fsm_agent
from fsm_agent.core.walker import walker_for
from fsm_agent.definition.stops import CATALOGUE
from fsm_agent.definition.table import TABLE, build_table

PACKAGE = Path(fsm_agent.__file__).resolve().parent


@functools.cache  # parsed when a test first asks, not when the suite is collected
def _sources() -> dict[str, ast.Module]:
    """Each module of the package, parsed, by its path from the repository's root."""
    return {
        str(path.relative_to(PACKAGE.parent)): ast.parse(path.read_text(encoding="utf-8"))
        for path in sorted(PACKAGE.rglob("*.py"))
    }


GENERATORS = frozenset({"exec", "eval", "compile", "__import__"})
"""Built-ins that run or build code from text."""
SOURCE_READERS = frozenset({"getsource", "getsourcelines", "getsourcefile", "getfile", "getmodule", "findsource"})
"""``inspect``'s readers of a function's source."""
CODE_ATTRIBUTES = frozenset({"__code__", "co_code", "FunctionType", "CodeType", "LambdaType"})
"""What building or reading a function's code object goes through."""


def _code_generation(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
        runs_text = isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in GENERATORS
        reads_code = isinstance(node, ast.Attribute) and node.attr in SOURCE_READERS | CODE_ATTRIBUTES
        if runs_text or reads_code:
            yield getattr(node, "lineno", 0), ast.unparse(node)[:80]
        elif isinstance(node, ast.ImportFrom) and node.module in ("inspect", "types", "linecache"):
            names = {alias.name for alias in node.names} & (SOURCE_READERS | CODE_ATTRIBUTES)
            if names:
                yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.Import) and any(alias.name in ("linecache", "marshal") for alias in node.names):
            yield node.lineno, ast.unparse(node)


def test_the_package_generates_no_code_and_reads_no_source_of_its_own() -> None:
    """No ``exec``, ``eval``, ``compile`` (``re.compile`` is a pattern), ``inspect.getsource``, ``__code__``."""
    found = {path: hits for path, tree in _sources().items() if (hits := sorted(set(_code_generation(tree))))}
    assert found == {}


def test_the_check_sees_code_generation() -> None:
    """Each kind of generating or source-reading code is found; ``re.compile`` is not."""
    source = (
        "import re\nfrom inspect import getsource\nre.compile('x')\nexec('1')\neval('1')\ncompile('1', 'f', 'exec')\n"
        "inspect.getsource(f)\nf.__code__\ntypes.FunctionType(c, {})\n"
    )
    assert sorted(line for line, _ in _code_generation(ast.parse(source))) == [2, 4, 5, 6, 7, 8, 9]


def _id_of(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "id"


def _locals(scopes: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> set[str]:
    """Names assigned in the body of the functions enclosing a use (not their parameters): made by that call."""
    names: set[str] = set()
    for scope in scopes:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    named = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
                    names |= {name.id for name in named if isinstance(name, ast.Name)}
            elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value is not None:
                names.add(node.target.id)
    return names


def _id_keys(tree: ast.AST) -> Iterator[tuple[int, str, bool]]:
    """Each container read or written by an ``id()`` key: line, container, and whether the call made it."""

    def keyed(node: ast.AST) -> ast.expr | None:
        if isinstance(node, ast.Subscript) and _id_of(node.slice):
            return node.value
        if isinstance(node, ast.Compare) and _id_of(node.left) and isinstance(node.ops[0], ast.In | ast.NotIn):
            return node.comparators[0]
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr in {"get", "pop", "setdefault", "add", "discard", "remove"}
            and node.args
            and _id_of(node.args[0])
        ):
            return node.func.value
        return None

    def visit(node: ast.AST, scopes: list[ast.FunctionDef | ast.AsyncFunctionDef]) -> Iterator[tuple[int, str, bool]]:
        for child in ast.iter_child_nodes(node):
            inner = [*scopes, child] if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else scopes
            container = keyed(child)
            if container is not None:
                local = isinstance(container, ast.Name) and container.id in _locals(scopes)
                yield getattr(child, "lineno", 0), ast.unparse(container), local
            yield from visit(child, inner)

    yield from visit(tree, [])


def test_the_check_tells_a_walks_own_seen_set_from_a_kept_cache() -> None:
    """A set of ids made by the call that fills it is a walk's memory; a dict handed in or kept on self is a cache."""
    source = (
        "def walk(node):\n    todo, seen = [], set()\n    if id(node) in seen:\n        return\n"
        "    seen.add(id(node))\n"
        "def cached(memo, record):\n    return memo.get(id(record))\n"
        "class C:\n    def f(self, x):\n        self._known[id(x)] = x\n"
    )
    assert sorted(_id_keys(ast.parse(source))) == [
        (3, "seen", True),
        (5, "seen", True),
        (7, "memo", False),
        (10, "self._known", False),
    ]


def test_nothing_is_kept_by_id() -> None:
    """No container keyed by ``id()`` outlives the call that makes it (a walk's own seen-set is fine)."""
    kept = {
        path: sorted({f"{line}: {container}" for line, container, local in found if not local})
        for path, tree in _sources().items()
        if (found := list(_id_keys(tree)))
    }
    assert {path: hits for path, hits in kept.items() if hits} == {}


def _module_caches() -> Iterator[tuple[str, str, list[str]]]:
    """Each module-level function cached by ``functools``: where, its name, and its parameters' annotations."""
    for path, tree in _sources().items():
        for node in tree.body:
            if not isinstance(node, ast.FunctionDef):
                continue
            for decorator in node.decorator_list:
                called = decorator.func if isinstance(decorator, ast.Call) else decorator
                if ast.unparse(called).split(".")[-1] in {"cache", "lru_cache"}:
                    annotations = [ast.unparse(a.annotation) if a.annotation else "?" for a in node.args.args]
                    yield path, node.name, annotations


def test_the_module_level_caches_are_keyed_by_value() -> None:
    """The only module-level ``functools`` caches take strings or a ``Table``, whose hash is its value's."""
    assert sorted(_module_caches()) == [
        ("fsm_agent/core/walker.py", "walker_for", ["Table"]),
        ("fsm_agent/definition/table.py", "finalize_on", ["str", "str"]),
    ]
    again = build_table(CATALOGUE)
    assert again is not TABLE
    assert walker_for(again) is walker_for(TABLE)  # found by the table's value, not its identity
