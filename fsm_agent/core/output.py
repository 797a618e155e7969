"""Typed answers: an agent's ``output_type`` turned once into a schema, a parser and its validators.

An output type is a pydantic model, a dataclass or a ``TypedDict`` (checked
with pydantic, imported only for them), a JSON Schema dict (checked with
``jsonschema``), or ``str`` (the text as it is, for validators only).  The
schema goes to the model as an ``OutputSchema``; the final answer is parsed
and then handed through the ``output_validators`` in order.  An answer that
fails is an ``Invalid`` with the errors the model is shown; a validator that
raises ``Retry`` gives its own message, and any other exception stops the
run at once, since asking the model again cannot mend a broken validator.
Nothing here calls a model or waits: the drivers run ``check``/``acheck``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import re
from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

import attrs

from fsm_agent.errors import Retry
from fsm_agent.records import OutputSchema
from fsm_agent.tools.calling import settle

Validator = Callable[[Any], Any]
"""``fn(output) -> output`` (or an awaitable of it); raises ``fsm_agent.Retry`` to send the model back."""

RETRY_INSTRUCTION = (
    "Your final answer was not accepted:\n{errors}\n"
    "Answer again with only a JSON object that matches this JSON Schema:\n{schema}"
)
RETRY_TEXT_INSTRUCTION = "Your final answer was not accepted:\n{errors}\nAnswer again."
_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*\Z", re.DOTALL)


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


def _json_errors(text: str) -> Invalid | None:
    try:
        json.loads(text)
    except ValueError as exc:
        return Invalid((f"the answer is not JSON ({exc}); it begins {text[:80]!r}",))
    return None


class OutputSpec:
    """One agent's output type, schema and validators; ``check`` an answer's text to get its value or ``Invalid``."""

    def __init__(self, output_type: Any, validators: Sequence[Validator], retries: int) -> None:
        self.output_type = output_type
        self.validators = tuple(validators)
        self.retries = retries
        self._parse: Callable[[str], Any]
        if output_type is str:
            self.request: OutputSchema | None = None
            self._parse = _as_text
            return
        if isinstance(output_type, dict):
            schema, name, self._parse = _from_json_schema(output_type)
        elif _is_pydantic_model(output_type):
            schema, name = output_type.model_json_schema(), output_type.__name__
            self._parse = _pydantic_parser(output_type.model_validate_json)  # a model class validates JSON itself
        elif _is_record(output_type):
            pydantic = _require("pydantic")
            try:
                adapter = pydantic.TypeAdapter(output_type)
                schema, name = adapter.json_schema(), output_type.__name__
            except pydantic.PydanticUserError as exc:  # e.g. typing.TypedDict before Python 3.12
                msg = f"output_type {output_type.__name__} cannot be checked by pydantic: {exc}"
                raise TypeError(msg) from None
            self._parse = _pydantic_parser(adapter.validate_json)
        else:
            msg = (
                "output_type must be a pydantic model, a dataclass, a TypedDict, a JSON Schema dict or str, "
                f"got {output_type!r}"
            )
            raise TypeError(msg)
        description = schema.get("description")
        description = description if isinstance(description, str) else ""
        self.request = OutputSchema(_schema_name(name), schema, description, _strict(schema))

    def retry_text(self, errors: Sequence[str]) -> str:
        """The message that sends the model back: the errors, and the schema to answer with."""
        listed = "\n".join(f"- {error}" for error in errors)
        if self.request is None:
            return RETRY_TEXT_INSTRUCTION.format(errors=listed)
        return RETRY_INSTRUCTION.format(errors=listed, schema=json.dumps(self.request.schema, ensure_ascii=False))

    def check(self, text: str) -> Any:
        """The value of the answer ``text`` after every validator (an async one run to completion), or ``Invalid``."""
        value = self._parse(text)
        if isinstance(value, Invalid):
            return value
        for validator in self.validators:
            try:
                value = settle(validator(value))
            except Retry as exc:
                return Invalid((str(exc) or "a validator asked for another answer",))
            except Exception as exc:  # noqa: BLE001 - a broken validator stops the run, with what it raised
                return _broken(validator, exc)
        return value

    async def acheck(self, text: str) -> Any:
        """``check``, awaiting async validators on the running loop."""
        value = self._parse(text)
        if isinstance(value, Invalid):
            return value
        for validator in self.validators:
            try:
                value = validator(value)
                if inspect.isawaitable(value):
                    value = await value
            except Retry as exc:
                return Invalid((str(exc) or "a validator asked for another answer",))
            except Exception as exc:  # noqa: BLE001 - a broken validator stops the run, with what it raised
                return _broken(validator, exc)
        return value


def _broken(validator: Validator, exc: Exception) -> Invalid:
    name = getattr(validator, "__name__", type(validator).__name__)
    return Invalid((f"output validator {name} raised {type(exc).__name__}: {exc}",), retryable=False)


def _as_text(text: str) -> Any:
    return text


def _pydantic_parser(validate_json: Callable[[str], Any]) -> Callable[[str], Any]:
    def parse(text: str) -> Any:
        text = unfenced(text)
        not_json = _json_errors(text)
        if not_json is not None:
            return not_json
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
    validator_class = jsonschema.validators.validator_for(schema)
    try:
        validator_class.check_schema(schema)
    except jsonschema.SchemaError as exc:
        msg = f"output_type is not a valid JSON Schema: {exc.message}"
        raise ValueError(msg) from None
    if schema.get("type") != "object":
        msg = f'output_type JSON Schema must describe an object ("type": "object"), got type {schema.get("type")!r}'
        raise ValueError(msg)
    validator = validator_class(schema)
    frozen = json.loads(json.dumps(schema))  # the caller's dict may change later; the agent keeps its own copy

    def parse(text: str) -> Any:
        text = unfenced(text)
        not_json = _json_errors(text)
        if not_json is not None:
            return not_json
        value = json.loads(text)
        errors = sorted(validator.iter_errors(value), key=lambda error: list(error.absolute_path))
        if errors:
            return Invalid(tuple(_schema_error(error) for error in errors))
        return value

    return frozen, str(schema.get("title") or "output"), parse


def _schema_error(error: Any) -> str:
    where = "".join(f"[{part}]" if isinstance(part, int) else f".{part}" for part in error.absolute_path)
    return f"{where.lstrip('.') or '(the answer)'}: {error.message}"


def output_spec(output_type: Any, validators: Iterable[Any], retries: Any) -> OutputSpec | None:
    """Check an agent's output settings and build its ``OutputSpec`` (None: the answer is plain text)."""
    if output_type is None and type(validators) is tuple and not validators and type(retries) is int and retries >= 0:
        return None  # most agents: nothing below to check or build
    validators = tuple(validators)
    for validator in validators:
        if not callable(validator):
            msg = f"output_validators must hold callables, got {type(validator).__name__}"
            raise TypeError(msg)
    if isinstance(retries, bool) or not isinstance(retries, int) or retries < 0:
        msg = f"output_retries must be an integer >= 0, got {retries!r}"
        raise ValueError(msg)
    if output_type is None:
        if validators:
            msg = "output_validators need an output_type; use output_type=str to validate a plain-text answer"
            raise ValueError(msg)
        return None
    return OutputSpec(output_type, validators, retries)


def accepts_output(method: Any) -> bool:
    """Whether a model method takes the ``output`` keyword (named, or through ``**kwargs``)."""
    try:
        parameters = inspect.signature(method).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(
        p.kind is inspect.Parameter.VAR_KEYWORD
        or (p.name == "output" and p.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD))
        for p in parameters
    )
