"""The sync and async drivers' loops take the same steps in the same order: only ``await`` and the call differ.

Each loop is read from the driver's source, its ``await`` and the ``a`` of
each awaited twin taken out; what is left must be the other loop, line for
line, except where the async driver awaits its call inside a timeout, which
the sync driver leaves to its caller's thread (``SyncDriver._bounded``).
"""

from __future__ import annotations

import ast
import difflib
import inspect
import textwrap
from collections.abc import Callable
from typing import Any

from fsm_agent.drivers.aio import AsyncDriver
from fsm_agent.drivers.sync import SyncDriver

TWINS = {
    "_amove": "_move",
    "_aadvance": "_advance",
    "_acheck": "_check",
    "_acompact": "_compact",
    "ahold": "hold",
    "_aafter_reply": "_after_reply",
    "_aprocessed": "_processed",
    "_aheld_in_time": "_held_in_time",
}
"""The async driver's names of the sync driver's steps."""


class _AsSync(ast.NodeTransformer):
    """An async function's body as the sync driver would write it: no ``await``, its twins by their sync names."""

    def visit_Await(self, node: ast.Await) -> Any:
        return self.visit(node.value)

    def visit_Attribute(self, node: ast.Attribute) -> Any:
        self.generic_visit(node)
        node.attr = TWINS.get(node.attr, node.attr)
        return node

    def visit_Call(self, node: ast.Call) -> Any:
        self.generic_visit(node)
        node.keywords = [k for k in node.keywords if k.arg != "parallel"]  # the async driver plans a turn's calls
        return node


def _body(function: Callable[..., Any]) -> list[str]:
    """The statements of ``function``'s body as normalized source lines, its docstring and comments left out."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    node = tree.body[0]
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    body = node.body[1:] if ast.get_docstring(node) else node.body
    module = _AsSync().visit(ast.Module(body=body, type_ignores=[]))
    return ast.unparse(module).splitlines()


def test_the_two_drivers_advance_a_run_by_the_same_steps_and_differ_only_in_how_a_call_is_cut_off() -> None:
    sync, async_ = _body(SyncDriver._move), _body(AsyncDriver._amove)
    matcher = difflib.SequenceMatcher(a=sync, b=async_, autojunk=False)
    differ = [(sync[i1:i2], async_[j1:j2]) for tag, i1, i2, j1, j2 in matcher.get_opcodes() if tag != "equal"]
    assert differ == [
        (
            ["    self._make_call(effect)"],
            ["    expired = self._acarry(effect)", "    if expired is not None:", "        return expired"],
        )
    ]


def test_the_two_drivers_finish_a_run_by_the_same_loop() -> None:
    assert _body(SyncDriver._finish) == _body(AsyncDriver.afinish)
