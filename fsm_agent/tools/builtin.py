"""Demonstration tools for the command line, safe by construction: arithmetic, the time, and reading text files.

A model's arguments are untrusted input, so each tool accepts only what it
can check: ``calculate`` walks the expression's syntax tree and evaluates
numbers and arithmetic operators only (no ``eval``, no names, no calls, and
no powers too large to compute quickly); the file tools exist only when a
root directory is given and refuse any path that resolves outside it,
symbolic links included.  A refusal raises ``ValueError``, which the registry
hands to the model as a failed tool result.
"""

from __future__ import annotations

import ast
import datetime as dt
import math
import operator
import zoneinfo
from collections.abc import Callable
from pathlib import Path

from fsm_agent.tools.registry import ToolRegistry

Number = int | float

MAX_EXPRESSION_CHARS = 200
# Keeps every intermediate result small enough to compute in microseconds; 2**4096 has 1,234 digits.
MAX_RESULT_BITS = 4096
MAX_FILE_BYTES = 100_000
MAX_LISTED_FILES = 200

_BINARY: dict[type[ast.operator], Callable[[Number, Number], Number]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY: dict[type[ast.unaryop], Callable[[Number], Number]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def _bits(value: Number) -> float:
    return math.log2(abs(value)) if value else 0.0


def _power(base: Number, exponent: Number) -> Number:
    # Estimate the result's size before computing it: 9**9**9 must be refused, not attempted.
    if abs(base) > 1 and exponent > 0 and _bits(base) * exponent > MAX_RESULT_BITS:
        msg = f"{base!r} ** {exponent!r} is too large to compute (over {MAX_RESULT_BITS} bits)"
        raise ValueError(msg)
    result: Number = base**exponent
    if isinstance(result, complex):
        msg = f"{base!r} ** {exponent!r} has no real value"
        raise ValueError(msg)  # noqa: TRY004 - a value problem in the expression, not a wrong argument type
    return result


def _evaluate(node: ast.AST) -> Number:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    # type() rather than isinstance(): bool is an int subclass, and True + True is not arithmetic input.
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        number: Number = node.value  # type: ignore[assignment]  # the type() check above narrows what mypy cannot
        return number
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow):
            return _power(left, right)
        result = _BINARY[type(node.op)](left, right)
        if _bits(result) > MAX_RESULT_BITS:
            msg = f"the result is too large (over {MAX_RESULT_BITS} bits)"
            raise ValueError(msg)
        return result
    msg = f"unsupported syntax {ast.unparse(node)!r}: only numbers, + - * / // % ** and parentheses are allowed"
    raise ValueError(msg)


def calculate(expression: str) -> Number:
    """Evaluate an arithmetic expression: numbers, + - * / // % ** and parentheses, e.g. "(2+3)*4"."""
    if len(expression) > MAX_EXPRESSION_CHARS:
        msg = f"the expression is longer than {MAX_EXPRESSION_CHARS} characters"
        raise ValueError(msg)
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as exc:
        msg = f"not an arithmetic expression: {exc.msg}"
        raise ValueError(msg) from None
    return _evaluate(tree)


def current_time(timezone: str = "UTC") -> str:
    """The current date and time in ISO 8601, in an IANA time zone such as "Europe/Paris" (default UTC)."""
    if timezone.upper() == "UTC":
        return dt.datetime.now(dt.UTC).isoformat(timespec="seconds")
    try:
        zone = zoneinfo.ZoneInfo(timezone)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        msg = f"unknown time zone {timezone!r}; use an IANA name such as 'Europe/Paris', or 'UTC'"
        raise ValueError(msg) from None
    return dt.datetime.now(zone).isoformat(timespec="seconds")


class FileReader:
    """``read_file`` and ``list_files`` confined to one directory tree."""

    def __init__(self, root: Path) -> None:
        self.root = root.resolve(strict=True)
        if not self.root.is_dir():
            msg = f"{root} is not a directory"
            raise NotADirectoryError(msg)

    def _inside(self, path: str) -> Path:
        # Resolving first follows every symlink and "..", so the check sees where the path really leads.
        target = (self.root / path).resolve()
        if Path(path).is_absolute() or not target.is_relative_to(self.root):
            msg = f"{path!r} is outside the readable directory; give a path relative to it"
            raise ValueError(msg)
        return target

    def read_file(self, path: str) -> str:
        """Read a UTF-8 text file, by its path relative to the readable directory (see list_files)."""
        target = self._inside(path)
        if not target.is_file():
            msg = f"{path!r} is not a file"
            raise ValueError(msg)
        if target.stat().st_size > MAX_FILE_BYTES:
            msg = f"{path!r} is larger than {MAX_FILE_BYTES} bytes"
            raise ValueError(msg)
        try:
            return target.read_text(encoding="utf-8")
        except UnicodeDecodeError:
            msg = f"{path!r} is not a UTF-8 text file"
            raise ValueError(msg) from None

    def list_files(self, directory: str = ".") -> list[str]:
        """List the files under a directory of the readable directory (default: all of it), as relative paths."""
        target = self._inside(directory)
        if not target.is_dir():
            msg = f"{directory!r} is not a directory"
            raise ValueError(msg)
        found = sorted(
            str(p.relative_to(self.root))
            for p in target.rglob("*")
            if p.is_file() and p.resolve().is_relative_to(self.root)
        )
        return found[:MAX_LISTED_FILES]


def builtin_registry(files: Path | None = None) -> ToolRegistry:
    """``calculate`` and ``current_time``, plus ``read_file`` and ``list_files`` when ``files`` names a directory."""
    registry = ToolRegistry()
    registry.register(calculate)
    registry.register(current_time)
    if files is not None:
        reader = FileReader(files)
        registry.register(reader.read_file, name="read_file")
        registry.register(reader.list_files, name="list_files")
    return registry
