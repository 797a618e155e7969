"""Each kind of output type made a schema and a parser: pydantic models, dataclasses, TypedDicts, JSON Schema, str.

An agent's ``output_type`` is read here once, when the agent is built: a
pydantic model, a dataclass or a ``TypedDict`` is checked with pydantic
(imported only for them), a JSON Schema dict with ``jsonschema`` (its
references and patterns bounded by ``answer_schema``), and ``str`` is the
text as it is.  What comes out is the ``OutputSchema`` the model is sent, the
parser of an answer's text, and the kind of value a validator must return;
``output.OutputSpec`` checks answers with them.  An answer is read as strict
JSON (no ``NaN`` or ``Infinity``), without a surrounding Markdown fence, and
nested at most ``MAX_NESTING`` levels, like tool arguments; one that fails
is an ``Invalid`` with the errors the model is shown.
"""

from __future__ import annotations

import dataclasses
import importlib
import json
import math
import re
from collections.abc import Callable
from types import ModuleType
from typing import Any

import attrs

from fsm_agent.core.answer_schema import bounded_patterns, references_problem
from fsm_agent.core.reply_checks import MAX_NESTING, nests_deeper
from fsm_agent.records import OutputSchema

Parser = Callable[[str], Any]
"""An answer's text to its value, or ``Invalid``."""

_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*\Z", re.DOTALL)

TOO_DEEP = f"the answer nests deeper than {MAX_NESTING} levels of objects and arrays"
"""The error of an answer nested past the limit tool arguments have (``reply_checks.MAX_NESTING``)."""


@attrs.frozen
class Invalid:
    """Why an answer was not accepted: ``errors`` shown to the model, and whether asking again may help."""

    errors: tuple[str, ...]
    retryable: bool = True


def _require(package: str) -> ModuleType:
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        msg = f"output_type needs the {package!r} package; install it with: pip install 'fsm-agent[output]'"
        raise ImportError(msg, name=package) from exc


def _is_pydantic_model(kind: Any) -> bool:
    # Looked up by name so that an agent without a pydantic output type never imports pydantic.
    return isinstance(kind, type) and any(
        base.__name__ == "BaseModel" and base.__module__.startswith("pydantic") for base in kind.__mro__
    )


def _is_record(kind: Any) -> bool:
    """A dataclass or a ``TypedDict`` (from ``typing`` or ``typing_extensions``, which ``is_typeddict`` misses)."""
    if not isinstance(kind, type):
        return False
    return dataclasses.is_dataclass(kind) or (issubclass(kind, dict) and hasattr(kind, "__required_keys__"))


def _schema_name(text: str) -> str:
    """A schema name every provider accepts: ``[A-Za-z0-9_-]``, 1 to 64 characters."""
    return re.sub(r"[^A-Za-z0-9_-]", "_", text)[:64] or "output"


def _strict(schema: Any) -> bool:
    """True when every object in ``schema`` requires all its properties and allows no others (OpenAI strict)."""
    if isinstance(schema, list):
        return all(_strict(item) for item in schema)
    if not isinstance(schema, dict):
        return True
    if schema.get("type") == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        if schema.get("additionalProperties") is not False or set(schema.get("required", ())) != set(properties):
            return False
    return all(_strict(value) for key, value in schema.items() if key not in ("enum", "const", "default"))


def unfenced(text: str) -> str:
    """The answer without one surrounding Markdown code fence, which models without a JSON mode often add."""
    match = _FENCE.match(text)
    return match.group(1) if match else text


def _not_finite(text: str) -> Any:
    msg = f"the number {text} is not finite, and JSON has no NaN or Infinity"
    raise ValueError(msg)


def _finite(text: str) -> float:
    """A JSON number as a float; one too large for a double (``1e999``) would be infinite, and is refused."""
    value = float(text)
    if not math.isfinite(value):
        _not_finite(text)
    return value


def _json_value(text: str) -> Any:
    """The answer parsed as strict JSON, or ``Invalid``: not JSON, a number that is not finite, or nested too deep.

    Python's ``json`` reads ``NaN`` and ``Infinity``, which JSON forbids and
    no encoder writes back as JSON; and an answer nested past the depth tool
    arguments may have would break whatever walks it next (the schema check,
    pydantic, the encoders), so both are invalid answers here.
    """
    try:
        value = json.loads(text, parse_constant=_not_finite, parse_float=_finite)
    except RecursionError:  # json's decoder stops at the recursion limit, far past MAX_NESTING
        return Invalid((TOO_DEEP,))
    except ValueError as exc:
        return Invalid((f"the answer is not JSON ({exc}); it begins {text[:80]!r}",))
    if nests_deeper(value, MAX_NESTING):
        return Invalid((TOO_DEEP,))
    return value


def schema_and_parser(output_type: Any) -> tuple[OutputSchema | None, Parser, type]:
    """The schema the model is sent (None: a plain-text answer), the answer's parser, and what a validator returns.

    What a validator must return is a value of the output type's kind (see
    ``OutputSpec._wrong_type``): the model or dataclass, a dict for a
    ``TypedDict`` or a JSON Schema, a str for ``str``.
    """
    parse: Parser
    kind: type = dict if isinstance(output_type, dict) or not isinstance(output_type, type) else output_type
    if output_type is str:
        return None, _as_text, kind
    if isinstance(output_type, dict):
        schema, name, parse = _from_json_schema(output_type)
    elif _is_pydantic_model(output_type):
        schema, name = output_type.model_json_schema(), output_type.__name__
        parse = _pydantic_parser(output_type.model_validate_json)  # a model class validates JSON itself
    elif _is_record(output_type):
        pydantic = _require("pydantic")
        try:
            adapter = pydantic.TypeAdapter(output_type)
            schema, name = adapter.json_schema(), output_type.__name__
        except pydantic.PydanticUserError as exc:  # e.g. typing.TypedDict before Python 3.12
            msg = f"output_type {output_type.__name__} cannot be checked by pydantic: {exc}"
            raise TypeError(msg) from None
        parse = _pydantic_parser(adapter.validate_json)
        if not dataclasses.is_dataclass(output_type):
            kind = dict  # a TypedDict's value is a plain dict
    else:
        msg = (
            "output_type must be a pydantic model, a dataclass, a TypedDict, a JSON Schema dict or str, "
            f"got {output_type!r}"
        )
        raise TypeError(msg)
    description = schema.get("description")
    description = description if isinstance(description, str) else ""
    return OutputSchema(_schema_name(name), schema, description, _strict(schema)), parse, kind


def plain_value(output_type: Any, value: Any) -> Any:
    """A checked answer's value in JSON form, which the type's parser reads back; ``TypeError``/``ValueError`` if not.

    A snapshot keeps it (``OutputSpec.plain``), so a finished run read back
    has its typed output without its validators run again.
    """
    if output_type is str:
        return value
    if isinstance(output_type, dict):
        return json.loads(json.dumps(value, allow_nan=False))  # a copy, and only what JSON holds
    adapter = _require("pydantic").TypeAdapter(output_type)  # a model, a dataclass or a TypedDict
    return adapter.dump_python(value, mode="json", by_alias=True)  # as the parser reads fields: by alias


def _as_text(text: str) -> Any:
    return text


def _pydantic_parser(validate_json: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        text = unfenced(text)
        parsed = _json_value(text)
        if isinstance(parsed, Invalid):
            return parsed
        try:
            return validate_json(text)
        except ValueError as exc:  # pydantic's ValidationError is a ValueError
            errors = getattr(exc, "errors", None)
            if not callable(errors):
                return Invalid((str(exc),))
            return Invalid(tuple(_pydantic_error(error) for error in errors(include_url=False)))

    return parse


def _pydantic_error(error: dict[str, Any]) -> str:
    where = ".".join(str(part) for part in error.get("loc", ())) or "(the answer)"
    return f"{where}: {error.get('msg', 'invalid')}"


def _from_json_schema(schema: dict[str, Any]) -> tuple[dict[str, Any], str, Callable[[str], Any]]:
    jsonschema = _require("jsonschema")
    referencing = _require("referencing")  # jsonschema's own dependency
    try:
        # The caller's dict may change later: the agent keeps its own copy, checks it and checks answers with it.
        frozen = json.loads(json.dumps(schema, allow_nan=False))
        validator_class = jsonschema.validators.validator_for(frozen)
        validator_class.check_schema(frozen)
    except jsonschema.SchemaError as exc:
        msg = f"output_type is not a valid JSON Schema: {exc.message}"
        raise ValueError(msg) from None
    except (TypeError, ValueError, RecursionError) as exc:
        msg = f"output_type is not a valid JSON Schema: it cannot be written as JSON ({type(exc).__name__}: {exc})"
        raise ValueError(msg) from None
    if frozen.get("type") != "object":
        msg = f'output_type JSON Schema must describe an object ("type": "object"), got type {frozen.get("type")!r}'
        raise ValueError(msg)
    problem = references_problem(frozen, referencing)
    if problem is not None:
        msg = f"output_type JSON Schema {problem}"
        raise ValueError(msg)
    # An empty registry: every reference resolves in the schema itself (checked above), and nothing is fetched.
    validator = bounded_patterns(validator_class, jsonschema, _require("regex"))(
        frozen, registry=referencing.Registry()
    )

    def parse(text: str) -> Any:
        text = unfenced(text)
        value = _json_value(text)
        if isinstance(value, Invalid):
            return value
        try:
            errors = sorted(validator.iter_errors(value), key=lambda error: list(error.absolute_path))
        except RecursionError:  # a schema recursive through properties, checked MAX_NESTING levels down
            return Invalid((TOO_DEEP,))
        if errors:
            return Invalid(tuple(_schema_error(error) for error in errors))
        return value

    return frozen, str(frozen.get("title") or "output"), parse


def _schema_error(error: Any) -> str:
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    return f"{where.lstrip('.') or '(the answer)'}: {error.message}"
