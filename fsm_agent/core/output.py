"""Typed answers: an agent's ``output_type`` turned once into a schema, a parser and its validators.

An output type is a pydantic model, a dataclass or a ``TypedDict`` (checked
with pydantic, imported only for them), a JSON Schema dict (checked with
``jsonschema``), or ``str`` (the text as it is, for validators only).  The
schema goes to the model as an ``OutputSchema``; the final answer is parsed
and then handed through the ``output_validators`` in order.  An answer that
fails is an ``Invalid`` with the errors the model is shown; a validator that
raises ``Retry`` gives its own message, and any other exception stops the
run at once, since asking the model again cannot mend a broken validator.

Everything an answer can make the check do is bounded: the schema's
references are resolved and checked for loops when the agent is built, an
answer is read as strict JSON (no ``NaN`` or ``Infinity``) and nested at
most ``MAX_NESTING`` levels, like tool arguments, and with a deadline the
check runs on a worker thread that is given up when the run's time is up.
Nothing here calls a model: the drivers run ``check``/``acheck``.
"""

from __future__ import annotations

import dataclasses
import importlib
import inspect
import json
import math
import re
from collections.abc import Awaitable, Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

import attrs

from fsm_agent.core.answer_schema import bounded_patterns, references_problem
from fsm_agent.core.ledger import MAX_NESTING, nests_deeper
from fsm_agent.errors import Retry
from fsm_agent.records import OutputSchema
from fsm_agent.tools.calling import DeadlineError, in_daemon_worker, settle, within_deadline

Validator = Callable[[Any], Any]
"""``fn(output) -> output`` (or an awaitable of it); raises ``fsm_agent.Retry`` to send the model back."""

RETRY_INSTRUCTION = (
    "Your final answer was not accepted:\n{errors}\n"
    "Answer again with only a JSON object that matches this JSON Schema:\n{schema}"
)
RETRY_TEXT_INSTRUCTION = "Your final answer was not accepted:\n{errors}\nAnswer again."
_FENCE = re.compile(r"\A\s*```(?:json)?[ \t]*\n(.*?)\n?```\s*\Z", re.DOTALL)
TOO_DEEP = f"the answer nests deeper than {MAX_NESTING} levels of objects and arrays"
"""The error of an answer nested past the limit tool arguments have (``ledger.MAX_NESTING``)."""
OUT_OF_TIME = "the answer's check was still running when the run's timeout passed"
"""The error of a check (parsing, the schema, the validators) cut at the run's deadline."""
TOO_LATE = "the run's timeout passed before the answer could be checked"
"""The error of an answer whose check would start after the deadline: it is not started, as a call would not be."""


def past_deadline(value: Any) -> tuple[bool, str | None]:
    """Whether a check's value says the run's timeout passed, and what was in flight then (the check, or nothing).

    Such a check decides nothing about the answer: the run stops on
    ``timeout`` (the ``expired`` edge out of ``Dispatch``), as a call cut at
    the deadline does, and a resume with more time checks the answer again.
    """
    if isinstance(value, Invalid) and value.errors in ((OUT_OF_TIME,), (TOO_LATE,)):
        return True, ("the answer's check" if value.errors == (OUT_OF_TIME,) else None)
    return False, None


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


class OutputSpec:
    """One agent's output type, schema and validators; ``check`` an answer's text to get its value or ``Invalid``."""

    def __init__(self, output_type: Any, validators: Sequence[Validator], retries: int) -> None:
        self.output_type = output_type
        self.validators = tuple(validators)
        self.retries = retries
        self._parse: Callable[[str], Any]
        # What a validator must return: a value of the output type's kind (see _wrong_type).
        self._kind: type = dict if isinstance(output_type, dict) or not isinstance(output_type, type) else output_type
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
            if not dataclasses.is_dataclass(output_type):
                self._kind = dict  # a TypedDict's value is a plain dict
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

    def check(self, text: str, timeout: float | None = None) -> Any:
        """The value of the answer ``text`` after every validator (an async one run to completion), or ``Invalid``.

        With a ``timeout`` (the seconds the run has left) the check runs on a
        daemon worker and is given up when they pass: the schema's patterns
        and the validators are code an answer can keep busy.  A worker that
        is given up runs on (Python cannot stop a thread); its outcome is
        dropped.  The answer is then ``Invalid`` (``OUT_OF_TIME``), which the
        driver turns into a ``timeout`` stop (``past_deadline``).  No time
        left: the check is not started (``TOO_LATE``), as a call would not be.
        """
        if timeout is None:
            return self._check(text)
        if timeout <= 0:
            return Invalid((TOO_LATE,))
        try:
            return within_deadline(lambda: self._check(text), timeout, "output check")
        except DeadlineError:
            return Invalid((OUT_OF_TIME,))

    def _check(self, text: str) -> Any:
        value = self._parse(text)
        if isinstance(value, Invalid):
            return value
        for validator in self.validators:
            try:
                returned = settle(validator(value))
            except Retry as exc:
                return Invalid((str(exc) or "a validator asked for another answer",))
            except Exception as exc:  # noqa: BLE001 - a broken validator stops the run, with what it raised
                return _broken(validator, exc)
            wrong = self._wrong_type(validator, returned)
            if wrong is not None:
                return wrong
            value = returned
        return value

    async def acheck(self, text: str, timeout: float | None = None) -> Any:
        """``check`` for the event loop: async validators awaited on it, the rest (parsing included) on a thread.

        Parsing, the schema check and a sync validator can take any time, and
        on the loop they would hold up every other task.  Without a timeout
        they go to ``asyncio.to_thread`` (about 0.1 ms a hop, against a model
        call of 300 ms or more); with one, to a daemon worker under
        ``asyncio.timeout``, so one given up at the deadline never holds up
        ``asyncio.run``'s exit, which waits for the loop's own threads.
        """
        import asyncio  # here, not at the top: import fsm_agent loads no asyncio

        if timeout is None:
            return await self._acheck(text, asyncio.to_thread)
        if timeout <= 0:
            return Invalid((TOO_LATE,))
        deadline = asyncio.timeout(timeout)
        try:
            async with deadline:
                return await self._acheck(text, in_daemon_worker)
        except TimeoutError:
            if not deadline.expired():
                raise
            return Invalid((OUT_OF_TIME,))

    async def _acheck(self, text: str, offload: Callable[[Callable[[Any], Any], Any], Awaitable[Any]]) -> Any:
        value = await offload(self._parse, text)
        if isinstance(value, Invalid):
            return value
        for validator in self.validators:
            try:
                if inspect.iscoroutinefunction(validator):
                    returned = await validator(value)
                else:
                    returned = await offload(validator, value)
                    if inspect.isawaitable(returned):  # a sync callable that hands back an awaitable
                        returned = await returned
            except Retry as exc:
                return Invalid((str(exc) or "a validator asked for another answer",))
            except Exception as exc:  # noqa: BLE001 - a broken validator stops the run, with what it raised
                return _broken(validator, exc)
            wrong = self._wrong_type(validator, returned)
            if wrong is not None:
                return wrong
            value = returned
        return value

    def _wrong_type(self, validator: Validator, value: Any) -> Invalid | None:
        """Why the value ``validator`` returned is not of the output type's kind (None: it is).

        The kind, not the whole type: an instance of the model or dataclass,
        a dict for a ``TypedDict`` or a JSON Schema, a str for ``str``.  A
        validator may change the value's fields (add a label, round a
        number); what they hold is its own business.  A value of another kind
        (``None`` from a validator that forgot its ``return``) is a broken
        validator: the run stops on ``output_invalid``, not retryable, since
        asking the model again cannot mend it.
        """
        kind = self._kind
        if isinstance(value, kind):
            return None
        shown = repr(value)
        shown = shown if len(shown) <= 80 else f"{shown[:77]}..."
        error = f"output validator {_name(validator)} returned {type(value).__name__} {shown}"
        return Invalid((f"{error}, expected a {kind.__name__}",), retryable=False)


def _name(validator: Validator) -> str:
    return str(getattr(validator, "__name__", type(validator).__name__))


def _broken(validator: Validator, exc: Exception) -> Invalid:
    return Invalid((f"output validator {_name(validator)} raised {type(exc).__name__}: {exc}",), retryable=False)


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
