"""Typed answers: an answer's text checked against the agent's ``output_type``, then through its validators.

An ``OutputSpec`` holds what ``output_kinds`` made of the output type (the
``OutputSchema`` the model is sent, the parser of an answer), and the
``output_validators``.  The final answer is parsed and then handed through
the validators in order.  An answer that fails is an ``Invalid`` with the
errors the model is shown, and ``retry_text`` sends the model back with
them; a validator that raises ``Retry`` gives its own message, and any
other exception stops the run at once, since asking the model again cannot
mend a broken validator.

Everything an answer can make the check do is bounded: the parser reads
strict JSON nested at most ``MAX_NESTING`` levels against a schema checked
when the agent is built (``output_kinds``), and with a deadline the check
runs on a worker thread that is given up when the run's time is up.
Nothing here calls a model: the drivers run ``check``/``acheck``.
"""

from __future__ import annotations

import inspect
import json
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any

from fsm_agent.core.output_kinds import Invalid, Parser, plain_value, schema_and_parser
from fsm_agent.errors import Retry
from fsm_agent.records import OutputSchema
from fsm_agent.tools.calling import DeadlineError, awaited_within, in_daemon_worker, settle, within_deadline

Validator = Callable[[Any], Any]
"""``fn(output) -> output`` (or an awaitable of it); raises ``fsm_agent.Retry`` to send the model back."""

NOT_ACCEPTED = "Your final answer was not accepted:\n{errors}"
"""What a model is told of an answer that failed its check; a retry asks it again after this."""
RETRY_INSTRUCTION = NOT_ACCEPTED + "\nAnswer again with only a JSON object that matches this JSON Schema:\n{schema}"
RETRY_TEXT_INSTRUCTION = NOT_ACCEPTED + "\nAnswer again."
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


class OutputSpec:
    """One agent's output type, schema and validators; ``check`` an answer's text to get its value or ``Invalid``."""

    def __init__(self, output_type: Any, validators: Sequence[Validator], retries: int) -> None:
        self.output_type = output_type
        self.validators = tuple(validators)
        self.retries = retries
        self.request: OutputSchema | None
        self._parse: Parser
        # What a validator must return: a value of the output type's kind (see _wrong_type).
        self._kind: type
        self.request, self._parse, self._kind = schema_and_parser(output_type)

    def retry_text(self, errors: Sequence[str]) -> str:
        """The message that sends the model back: the errors, and the schema to answer with."""
        listed = "\n".join(f"- {error}" for error in errors)
        if self.request is None:
            return RETRY_TEXT_INSTRUCTION.format(errors=listed)
        return RETRY_INSTRUCTION.format(errors=listed, schema=json.dumps(self.request.schema, ensure_ascii=False))

    def plain(self, value: Any) -> Any:
        """The checked ``value`` in JSON form, for a snapshot to keep; None unless it reads back as that same value.

        Read back by the output type (``restored``), it must give a value
        equal to ``value``, else a read back would return a value the run
        never returned: a type whose own validators change what they read
        (one that doubles a number doubles it again), a field written
        masked (a secret), a key the type drops, a number JSON cannot hold.
        Each is kept as None, and a reader checks the answer's text again.
        """
        try:
            plain = plain_value(self.output_type, value)
            json.dumps(plain, allow_nan=False)  # what JSON holds, NaN and infinities not
        except (TypeError, ValueError):  # pydantic's errors are ValueErrors: a value its type cannot write
            return None
        return plain if self.restored(plain) == value else None

    def restored(self, plain: Any) -> Any:
        """The value a snapshot kept (``plain``), parsed as an answer is but not validated again; else ``Invalid``.

        A finished run read back (a repeated request, a batch run again, a
        sub-agent's answer to a resumed parent) has the output its run
        returned: its validators are user code, perhaps a paid model call,
        and are not run twice for one answer.  ``Invalid`` when nothing was
        kept or the output type no longer reads it: the reader then checks
        the answer's text again.
        """
        if plain is None:
            return Invalid(("no value kept",))
        if self.request is None:  # a str answer
            return plain if isinstance(plain, str) else Invalid(("the kept value is no text",))
        return self._parse(json.dumps(plain))

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
        try:
            return await awaited_within(self._acheck(text, in_daemon_worker), timeout, "output check")
        except DeadlineError:
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
