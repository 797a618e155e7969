"""The built-in guards of one expression, as that expression: what the compiled fires write in line.

A call per guard was a third of a transition (``make bench``), so the
generated fires (``core.firing``) test a built-in guard of one ``return``
by its expression instead of calling it.  The expression is read from the
guard's own source, so each guard is written once, as the function the
table, the drawing and the tests name: a guard changed is a fire changed.
Names other than ``run`` are read through ``guards`` (what a test patches
there is what the fire calls), and a top-level ``bool(...)`` is dropped,
as an ``if`` asks for the truth anyway.  Where the source cannot be read
(an install without ``.py`` files) every guard is called, which is slower
and the same.  ``tests/test_compiled_fires.py`` holds each expression to
its guard.
"""

from __future__ import annotations

import ast
import builtins
import functools
import inspect

from fsm_agent.definition import guards
from fsm_agent.definition.guards import Guard


@functools.cache
def _functions() -> dict[str, ast.FunctionDef]:
    """The function definitions of the ``guards`` module by name; none if its source cannot be read."""
    try:
        tree = ast.parse(inspect.getsource(guards))
    except (OSError, TypeError, SyntaxError):
        return {}
    return {node.name: node for node in tree.body if isinstance(node, ast.FunctionDef)}


class _ThroughGuards(ast.NodeTransformer):
    """``name`` -> ``guards.name`` for every name but ``run`` and the builtins."""

    def visit_Name(self, node: ast.Name) -> ast.AST:
        if node.id == "run" or hasattr(builtins, node.id):
            return node
        return ast.copy_location(ast.Attribute(ast.Name("guards", ast.Load()), node.id, ast.Load()), node)


@functools.cache
def inline_expression(guard: Guard) -> str | None:
    """``guard`` as one expression over ``run`` if it is a built-in guard of one ``return``, else None."""
    if getattr(guard, "__module__", None) != guards.__name__:
        return None  # a user's guard may raise ConditionError, which only a call is wrapped to catch
    function = _functions().get(getattr(guard, "__name__", ""))
    if function is None or [argument.arg for argument in function.args.args] != ["run"]:
        return None
    body = function.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]  # the docstring
    if len(body) != 1 or not isinstance(body[0], ast.Return) or body[0].value is None:
        return None
    expression = body[0].value
    if isinstance(expression, ast.Call) and isinstance(expression.func, ast.Name) and expression.func.id == "bool":
        (expression,) = expression.args
    return ast.unparse(_ThroughGuards().visit(expression))
