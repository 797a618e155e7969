"""The command line's demonstration tools: correct where allowed, refusing everything else."""

from __future__ import annotations

import datetime as dt
import json
import os
import time
from pathlib import Path

import pytest

from fsm_agent import ToolCall
from fsm_agent.tools.builtin import MAX_FILE_BYTES, FileReader, builtin_registry, calculate, current_time


@pytest.mark.parametrize(
    ("expression", "value"),
    [
        ("(2+3)*4", 20),
        ("2 + 3 * 4", 14),
        ("-2 ** 2", -4),
        ("7 / 2", 3.5),
        ("7 // 2", 3),
        ("7 % 3", 1),
        ("1_000 * 1.5", 1500.0),
        ("2 ** 10", 1024),
        ("2 ** -1", 0.5),
        ("+(-(3))", -3),
    ],
)
def test_calculate_evaluates_arithmetic_with_python_precedence(expression: str, value: float) -> None:
    """Numbers, the arithmetic operators and parentheses evaluate as in Python."""
    assert calculate(expression) == value


@pytest.mark.parametrize(
    "expression",
    [
        "__import__('os').system('true')",
        "abs(-1)",
        "x + 1",
        "(1).real",
        "[1, 2]",
        "'a' * 3",
        "True + True",
        "1j * 1j",
        "1 if 2 else 3",
        "lambda: 1",
        "2 < 3",
    ],
)
def test_calculate_refuses_anything_but_numbers_and_operators(expression: str) -> None:
    """Names, calls, attributes, strings, booleans, complex numbers and comparisons are refused, never evaluated."""
    with pytest.raises(ValueError, match="unsupported syntax"):
        calculate(expression)


@pytest.mark.parametrize("expression", ["9 ** 9 ** 9", "10 ** 10000", "(2 ** 4000) * (2 ** 4000)", "1e308 * 10"])
def test_calculate_refuses_results_too_large_to_compute_quickly(expression: str) -> None:
    """Huge powers and products are refused from their size estimate, at once."""
    started = time.perf_counter()
    with pytest.raises(ValueError, match="too large"):
        calculate(expression)
    assert time.perf_counter() - started < 0.5


def test_calculate_refuses_long_input_and_bad_syntax() -> None:
    """Over-long expressions and text that does not parse are refused with the reason."""
    with pytest.raises(ValueError, match="longer than 200"):
        calculate("1+" * 150 + "1")
    with pytest.raises(ValueError, match="not an arithmetic expression"):
        calculate("(2+")


def test_a_refused_or_failing_calculation_is_a_failed_tool_result_for_the_model() -> None:
    """Through the registry, refusals and division by zero come back as failed results, never as a crash."""
    registry = builtin_registry()
    refused = registry.execute(ToolCall("c1", "calculate", {"expression": "open('x')"}))
    by_zero = registry.execute(ToolCall("c2", "calculate", {"expression": "1/0"}))
    assert refused.error is not None
    assert "unsupported syntax" in refused.error
    assert by_zero.error is not None
    assert "ZeroDivisionError" in by_zero.error
    assert registry.execute(ToolCall("c3", "calculate", {"expression": "(2+3)*4"})).content == "20"


def test_current_time_is_iso_8601_with_its_offset() -> None:
    """The time is now, in ISO 8601 with the zone's UTC offset."""
    utc = dt.datetime.fromisoformat(current_time())
    assert utc.utcoffset() == dt.timedelta(0)
    assert abs((dt.datetime.now(dt.UTC) - utc).total_seconds()) < 5


def test_current_time_refuses_an_unknown_zone() -> None:
    """A zone that is not an IANA name is refused with a hint."""
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        current_time("Mars/Olympus")


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    """A readable directory with a text file, a nested file and a binary file, next to a secret outside it."""
    root = tmp_path / "root"
    (root / "notes").mkdir(parents=True)
    (root / "a.txt").write_text("alpha", encoding="utf-8")
    (root / "notes" / "b.md").write_text("# beta", encoding="utf-8")
    (root / "blob.bin").write_bytes(b"\xff\xfe\x00\x01")
    (tmp_path / "secret.txt").write_text("do not read", encoding="utf-8")
    return root


def test_read_file_reads_text_under_the_root(tree: Path) -> None:
    """Relative paths inside the root are read, nested ones and ones with harmless ".." included."""
    reader = FileReader(tree)
    assert reader.read_file("a.txt") == "alpha"
    assert reader.read_file("notes/b.md") == "# beta"
    assert reader.read_file("notes/../a.txt") == "alpha"


@pytest.mark.parametrize("path", ["../secret.txt", "notes/../../secret.txt", "/etc/passwd", "SECRET_ABSOLUTE"])
def test_read_file_refuses_paths_outside_the_root(tree: Path, path: str) -> None:
    """Traversal with "..", and absolute paths (even pointing inside the root), are refused."""
    if path == "SECRET_ABSOLUTE":
        path = str(tree / "a.txt")
    with pytest.raises(ValueError, match="outside the readable directory"):
        FileReader(tree).read_file(path)


def test_read_file_refuses_a_symlink_that_leads_outside(tree: Path) -> None:
    """A link inside the root pointing outside it is judged by where it leads."""
    os.symlink(tree.parent / "secret.txt", tree / "link.txt")
    with pytest.raises(ValueError, match="outside the readable directory"):
        FileReader(tree).read_file("link.txt")
    assert "link.txt" not in FileReader(tree).list_files()


def test_read_file_refuses_binary_large_and_missing_files(tree: Path) -> None:
    """Non-UTF-8 content, files over the size cap and paths that are not files are refused with the reason."""
    (tree / "big.txt").write_text("x" * (MAX_FILE_BYTES + 1), encoding="utf-8")
    reader = FileReader(tree)
    with pytest.raises(ValueError, match="not a UTF-8 text file"):
        reader.read_file("blob.bin")
    with pytest.raises(ValueError, match="larger than"):
        reader.read_file("big.txt")
    with pytest.raises(ValueError, match="is not a file"):
        reader.read_file("notes")


def test_list_files_lists_relative_paths_and_stays_inside(tree: Path) -> None:
    """Files are listed relative to the root, sorted; listing outside the root is refused."""
    reader = FileReader(tree)
    assert reader.list_files() == ["a.txt", "blob.bin", "notes/b.md"]
    assert reader.list_files("notes") == ["notes/b.md"]
    with pytest.raises(ValueError, match="outside the readable directory"):
        reader.list_files("..")


def test_file_tools_exist_only_with_a_root(tree: Path) -> None:
    """Without --files there is nothing to read files with; with it, read_file works through the registry."""
    assert list(builtin_registry()) == ["calculate", "current_time"]
    registry = builtin_registry(tree)
    assert list(registry) == ["calculate", "current_time", "read_file", "list_files"]
    result = registry.execute(ToolCall("c1", "read_file", {"path": "../secret.txt"}))
    assert result.error is not None
    assert "do not read" not in result.content
    assert json.loads(registry.call(ToolCall("c2", "read_file", {"path": "a.txt"}))) == "alpha"


def test_a_root_that_is_not_a_directory_is_refused(tree: Path) -> None:
    """--files must name an existing directory."""
    with pytest.raises(NotADirectoryError):
        FileReader(tree / "a.txt")
    with pytest.raises(FileNotFoundError):
        FileReader(tree / "missing")
