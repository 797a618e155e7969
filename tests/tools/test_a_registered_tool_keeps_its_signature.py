"""``@tools.register`` hands the function back typed as it was, so a user's ``mypy --strict`` still checks its calls.

Typed as returning a bare ``Callable[..., Any]``, a decorated tool became
``def (*Any, **Any) -> Any`` to a type checker: a wrong argument or a
misused result in the user's own code went unseen.  Checked by running
mypy on a user's program, as the user does.
"""

from __future__ import annotations

from pathlib import Path

import pytest

PROGRAM = '''
from fsm_agent import ToolRegistry

tools = ToolRegistry()


@tools.register
def add(a: int, b: int) -> int:
    """Add two numbers."""
    return a + b


@tools.register(name="times")
def multiply(a: int, b: int) -> int:
    """Multiply two numbers."""
    return a * b


reveal_type(add)
reveal_type(multiply)
'''


def test_a_decorated_tool_keeps_its_parameters_and_return_type_for_mypy(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from mypy import api

    program = tmp_path / "program.py"
    program.write_text(PROGRAM, encoding="utf-8")
    root = Path(__file__).resolve().parents[2]  # the package as the clone holds it, whatever way it is installed
    monkeypatch.setenv("MYPYPATH", str(root))
    out, err, status = api.run(["--strict", "--cache-dir", str(tmp_path / "cache"), str(program)])
    revealed = [line.split("Revealed type is ")[1] for line in out.splitlines() if "Revealed type is" in line]
    assert revealed == ['"def (a: int, b: int) -> int"'] * 2, out + err
    assert status == 0, out + err
