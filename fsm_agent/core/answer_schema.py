"""An output schema that answers can be checked against in bounded time: its references, and its patterns.

An agent's ``output_type`` schema is checked here once, when the agent is
built, so that checking an answer against it can neither fetch anything nor
recurse without end (see ``references_problem``); its ``pattern`` keywords
are matched by a matcher that gives up (see ``bounded_patterns``).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from types import ModuleType
from typing import Any

_IN_PLACE = ("allOf", "anyOf", "oneOf", "not", "if", "then", "else", "dependentSchemas", "dependencies")
"""The keywords whose schemas check the same value as the schema holding them."""
_INSIDE = (
    "properties",
    "patternProperties",
    "additionalProperties",
    "propertyNames",
    "items",
    "prefixItems",
    "additionalItems",
    "contains",
    "unevaluatedItems",
    "unevaluatedProperties",
)
"""The keywords whose schemas check a part of the value: a property, a name, an item."""
_REFERENCES = ("$ref", "$dynamicRef", "$recursiveRef")
_BY_NAME = ("properties", "patternProperties", "dependentSchemas", "dependencies")


def references_problem(schema: dict[str, Any], referencing: ModuleType) -> str | None:
    """Why ``schema``'s references cannot be checked against, or None: each must resolve in it and end somewhere.

    Resolved as ``jsonschema`` resolves them (``$id`` scopes included) in a
    registry holding only this schema, so a remote reference is refused, not
    fetched: the model is sent only this schema, and nothing is loaded from
    the network when an answer is checked.  A reference that points at
    nothing, or at something that is not a schema, is refused too.

    A loop is refused when it checks the same value again without a step
    into it: a chain of ``$ref`` and in-place keywords (``allOf``, ``anyOf``,
    ``oneOf``, ``not``, ``if``/``then``/``else``, ``dependentSchemas``) that
    comes back to where it started, which ``jsonschema`` would follow until
    Python's recursion limit.  A loop through ``properties``, ``items`` and
    the other keywords that check a part of the value (a tree whose children
    are trees) is legitimate: each round goes one level into the answer,
    whose depth is bounded.  ``$dynamicRef`` is followed to the anchor it
    names statically, and drafts before 2019-09 ignore ``$ref``'s siblings,
    as ``jsonschema`` does.
    """
    specifications = referencing.jsonschema
    spec = specifications.specification_with(schema.get("$schema", ""), default=specifications.DRAFT202012)
    legacy = spec in (specifications.DRAFT3, specifications.DRAFT4, specifications.DRAFT6, specifications.DRAFT7)
    unresolvable = referencing.exceptions.Unresolvable
    done: set[int] = set()  # schemas whose in-place chains were all followed to their end
    path: dict[int, str] = {}  # the in-place chain being followed, by schema, with where each one is
    later: list[tuple[Any, Any, str]] = []  # schemas one step into the value, each the start of a new chain

    def visit(node: Any, resolver: Any, where: str) -> str | None:
        if not isinstance(node, dict) or id(node) in done:
            return None
        if id(node) in path:
            chain = [*list(path.values())[list(path).index(id(node)) :], where]
            return (
                f"has a $ref loop that checks the same value again without a step into it, so checking an answer "
                f"never ends: {' -> '.join(chain)}; a schema may refer back to itself only through properties or items"
            )
        path[id(node)] = where
        resolver = resolver.in_subresource(spec.create_resource(node))
        for keyword in _REFERENCES:
            ref = node.get(keyword)
            if not isinstance(ref, str):
                continue
            try:
                resolved = resolver.lookup(ref)
            except unresolvable as exc:
                return f"has $ref {ref!r} at {where}, which {_unresolved(exc, referencing)}"
            if not isinstance(resolved.contents, dict | bool):
                found = type(resolved.contents).__name__
                return f"has $ref {ref!r} at {where}, which resolves to a {found}, not a schema"
            problem = visit(resolved.contents, resolved.resolver, ref)
            if problem is not None:
                return problem
        if not (legacy and "$ref" in node):
            for sub_where, sub in _subschemas(node, _IN_PLACE):
                problem = visit(sub, resolver, _joined(where, sub_where))
                if problem is not None:
                    return problem
            later.extend((sub, resolver, _joined(where, sub_where)) for sub_where, sub in _subschemas(node, _INSIDE))
        del path[id(node)]
        done.add(id(node))
        return None

    later.append((schema, referencing.Registry().resolver_with_root(spec.create_resource(schema)), "(the root)"))
    try:
        while later:
            problem = visit(*later.pop())
            if problem is not None:
                return problem
    except RecursionError:
        return "nests too deep to be checked"
    return None


def _unresolved(exc: Exception, referencing: ModuleType) -> str:
    errors = referencing.exceptions
    if isinstance(exc, errors.PointerToNowhere):
        return "points at nothing in the schema"
    if isinstance(exc, errors.NoSuchAnchor):
        return "names an anchor the schema does not define"
    return "is not in the schema itself (the model is sent only this schema, and nothing is fetched)"


def _subschemas(node: dict[str, Any], keywords: Sequence[str]) -> Iterator[tuple[str, Any]]:
    """The schemas ``node`` holds under ``keywords``, each with where it is (``allOf[1]``, ``properties.name``)."""
    for keyword in keywords:
        held = node.get(keyword)
        if isinstance(held, list):
            yield from ((f"{keyword}[{index}]", item) for index, item in enumerate(held))
        elif keyword in _BY_NAME and isinstance(held, dict):
            yield from ((f"{keyword}.{name}", item) for name, item in held.items())
        elif held is not None:
            yield keyword, held


def _joined(where: str, step: str) -> str:
    return step if where == "(the root)" else f"{where}.{step}"


PATTERN_SECONDS = 2.0
"""How long one ``pattern`` of an output schema may take on one string of an answer.

Python's ``re`` can take exponential time on a pattern that backtracks
(``^(a|a)*$``) and holds the interpreter while it does, so no deadline could
cut it: patterns are matched with the ``regex`` package (in the ``output``
extra), whose matching gives up after this long.  An answer that keeps a
pattern busy that long is an invalid answer saying so.
"""


def bounded_patterns(validator_class: Any, jsonschema: ModuleType, regex: ModuleType) -> Any:
    """``validator_class`` with its ``pattern`` keyword matched by ``regex`` within ``PATTERN_SECONDS``."""

    def pattern(validator: Any, expected: str, instance: Any, schema: dict[str, Any]) -> Iterator[Any]:
        if not validator.is_type(instance, "string"):
            return
        try:
            found = regex.search(expected, instance, timeout=PATTERN_SECONDS)
        except TimeoutError:
            why = f"matching the pattern {expected!r} took over {PATTERN_SECONDS:g} s on this text: it backtracks"
            yield jsonschema.ValidationError(why)
            return
        if found is None:
            yield jsonschema.ValidationError(f"{instance!r} does not match {expected!r}")

    return jsonschema.validators.extend(validator_class, {"pattern": pattern})
