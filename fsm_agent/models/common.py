"""What both provider adapters share: the lazy SDK import, the client lifecycle, the checks at their boundary.

Each rule that both providers must agree on lives here once: which tool
results count as failed, what becomes of argument text that is not a JSON
object, what a well-formed reply holds, and how credentials are kept out of
everything that leaves an adapter.  The SDKs are imported only when an
adapter is built, so ``import fsm_agent.models`` works without them.

Credentials.  An API key is stripped of surrounding whitespace when the
adapter is built (a key read from a file keeps its newline, and no HTTP
header may carry one); a key with whitespace, a control or a non-ASCII
character inside is a ``ValueError`` naming the position, never the key.
``user:password@`` in ``base_url`` is taken out of the URL and sent as the
HTTP Basic ``Authorization`` header, as httpx would have sent it, so the
URL that the SDK logs and puts into errors holds no password.  The adapter's
``base_url`` attribute and ``repr()`` show ``[redacted]`` in its place.

Errors.  Every exception leaving ``complete``/``acomplete`` is cleaned in
place along its whole chain (``__cause__``, ``__context__``, exceptions held
in ``args``): its ``args``, the SDKs' ``message`` and ``body`` and its notes
have every secret replaced by ``[redacted]``.  The provider's exception thus
stays the run's ``__cause__``, with its type and status code.  If the
formatted chain would still show a secret (an exception whose text does not
come from its arguments), a ``RedactedError`` with the cleaned text and the
original type names is raised instead, without the chain.  A connection
failure's message names the (redacted) URL it could not reach.  Not
cleaned: other attributes of the exceptions (the SDK's ``request`` object
holds the headers sent) and the local variables of traceback frames.

Replies.  A reply with no usage at all is counted as zero tokens; a usage
object that is there must hold each count the adapter reads as an integer
>= 0 (missing, null, a string, a float, NaN, infinity, a bool or a negative
number is malformed: a count half there is not taken for zero, since it
would quietly switch ``token_budget`` off).  Tool call ids and names, and
texts, must be strings.  A malformed reply is a ``MalformedReplyError`` (a
``ValueError``) naming the field, so the run stops with ``model_error``
instead of failing later on the junk; the adapter returns nothing, so that
reply is not in the run's messages.  (The openai SDK turns a numeric string
or a bool into an integer while parsing, before the adapter sees it.)
"""

from __future__ import annotations

import base64
import contextlib
import importlib
import json
import os
import re
import traceback
import unicodedata
from collections import deque
from collections.abc import Awaitable, Callable, Iterator, Sequence
from types import ModuleType, TracebackType
from typing import Any, ClassVar, Self
from urllib.parse import unquote, urlsplit, urlunsplit

from fsm_agent import Message, ModelResponse, ToolCall
from fsm_agent.tools import JSONSchema

REDACTED = "[redacted]"
# Shorter "secrets" (placeholders such as "x" for local servers) would redact ordinary words.
_MIN_SECRET_LENGTH = 8

Redaction = tuple[str, str]
"""A secret as it may appear in text, and what replaces it."""


class MalformedReplyError(ValueError):
    """A provider reply the adapter will not pass on to the engine; ``field`` names the part at fault."""

    def __init__(self, field: str, problem: str) -> None:
        super().__init__(field, problem)
        self.field = field
        self.problem = problem

    def __str__(self) -> str:
        return f"malformed provider reply: {self.field} {self.problem}"


class RedactedError(Exception):
    """Stands in for a provider error whose text kept a secret after cleaning: its cleaned text, with type names."""


def _shown(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else f"{text[:57]}..."


def reply_text(value: Any, field: str, *, nullable: bool = False) -> str:
    """A string field of a reply (null is ``""`` where ``nullable``), or ``MalformedReplyError`` naming it."""
    if value is None and nullable:
        return ""
    if not isinstance(value, str):
        raise MalformedReplyError(field, f"must be a string, got {_shown(value)}")
    return value


def reply_items(value: Any, field: str) -> list[Any]:
    """A list field of a reply (null is empty), or ``MalformedReplyError`` naming it."""
    if value is None:
        return []
    if not isinstance(value, list):
        raise MalformedReplyError(field, f"must be a list, got {_shown(value)}")
    return value


def token_count(usage: Any, name: str, *, optional: bool = False) -> int:
    """``usage.<name>`` as an integer >= 0 (null is 0 where ``optional``), or ``MalformedReplyError`` naming it."""
    value = getattr(usage, name, None)
    if value is None:
        if optional:
            return 0
        raise MalformedReplyError(f"usage.{name}", "is missing or null")
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise MalformedReplyError(f"usage.{name}", f"must be an integer >= 0, got {_shown(value)}")
    return value


def require_sdk(package: str, extra: str | None = None) -> ModuleType:
    """Import a provider SDK, or raise ``ImportError`` with the install hint for the extra (default: ``package``)."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        hint = f"pip install 'fsm-agent[{extra or package}]'"
        msg = f"the {package!r} package is not installed; install it with: {hint}"
        raise ImportError(msg, name=package) from exc


def decode_arguments(call_id: str, name: str, raw: str | None) -> ToolCall:
    """Build a ``ToolCall`` from the model's argument text; text that is not a JSON object is kept raw.

    The registry turns a call with ``raw_arguments`` into a failed tool result
    telling the model what was wrong, so broken JSON (or a cut-off call) never
    crashes a run.  Empty text means "no arguments": OpenAI-compatible servers
    send ``""`` for tools without parameters.
    """
    if raw is None or not raw.strip():
        return ToolCall(call_id, name, {})
    try:
        value = json.loads(raw)
    except ValueError:
        return ToolCall(call_id, name, {}, raw_arguments=raw)
    if not isinstance(value, dict):
        return ToolCall(call_id, name, {}, raw_arguments=raw)
    return ToolCall(call_id, name, value)


def decoded_input(call_id: str, name: str, value: Any) -> ToolCall:
    """Build a ``ToolCall`` from arguments a provider already decoded; a non-object is kept as its JSON text."""
    if isinstance(value, dict):
        return ToolCall(call_id, name, value)
    return ToolCall(call_id, name, {}, raw_arguments=json.dumps(value, ensure_ascii=False))


def encode_arguments(call: ToolCall) -> str:
    """The argument text to send back to the provider: what the model wrote if it was not decodable."""
    if call.raw_arguments is not None:
        return call.raw_arguments
    return json.dumps(call.arguments, ensure_ascii=False)


# The line ToolRegistry appends to output it cut at max_output_chars; what comes before it is the start of the text.
_TRUNCATION_MARKER = re.compile(r"\n\[truncated: \d+ of \d+ characters cut, max_output_chars=\d+\]\Z")
_SPACE = re.compile(r"[ \t\n\r]*")
_DECODER = json.JSONDecoder()


def _leading_keys(text: str) -> Iterator[str]:
    """The top-level keys of a JSON object that can be read from ``text``, the beginning of its encoding."""
    at = _skip(text, 0)
    if not text.startswith("{", at):
        return
    at += 1
    while True:
        try:
            key, at = _DECODER.raw_decode(text, _skip(text, at))
        except ValueError:
            return
        if not isinstance(key, str):
            return
        yield key
        at = _skip(text, at)
        if not text.startswith(":", at):
            return
        try:
            _, at = _DECODER.raw_decode(text, _skip(text, at + 1))
        except ValueError:
            return
        at = _skip(text, at)
        if not text.startswith(",", at):
            return
        at += 1


def _skip(text: str, at: int) -> int:
    match = _SPACE.match(text, at)
    return at if match is None else match.end()


def tool_failed(message: Message) -> bool:
    """True when a tool message reports a failure: its content is a JSON object with a top-level ``"error"``.

    That is exactly how the registry encodes every failure, so this is
    structural, never a search for the word "error" in a successful result.
    Output the registry cut at its ``max_output_chars`` is no longer whole
    JSON: its top-level keys are read as far as the cut allows, so a failure
    keeps counting as one (the registry's own failures put ``"error"``
    first; a tool's dict whose ``"error"`` key lies beyond the cut cannot be
    told from a success).
    """
    content = message.content
    marker = _TRUNCATION_MARKER.search(content)
    if marker is not None:
        return "error" in _leading_keys(content[: marker.start()])
    try:
        value = json.loads(content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def clean_key(key: Any, name: str) -> str:
    """``key`` without surrounding whitespace; if unusable, a ``ValueError`` saying why without showing the key."""
    if not isinstance(key, str):
        msg = f"{name} must be a string, got {type(key).__name__}"
        raise TypeError(msg)
    stripped = key.strip()
    if not stripped:
        msg = f"{name} is empty"
        raise ValueError(msg)
    for position, char in enumerate(stripped):
        if char.isspace() or not char.isprintable() or not char.isascii():
            what = unicodedata.name(char, f"control character U+{ord(char):04X}")
            msg = f"{name} has {what} at position {position} of {len(stripped)}, which no HTTP header can carry"
            raise ValueError(msg)
    return stripped


def redact_url(url: str) -> str:
    """``url`` for showing: the password of its ``user:password@`` replaced, no trailing slash."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        host = f"{user}:{REDACTED}@{host}" if colon else f"{user}@{host}"
    return urlunsplit(parts._replace(netloc=host)).rstrip("/")


def _userinfo_redactions(url: str) -> list[Redaction]:
    userinfo, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return []
    user, colon, password = userinfo.partition(":")
    redactions = [(f"{userinfo}@", f"{user}:{REDACTED}@" if colon else f"{user}@")]
    redactions.extend((secret, REDACTED) for secret in {password, unquote(password)} if _long(secret))
    return redactions


def split_userinfo(url: str) -> tuple[str, str | None, list[Redaction]]:
    """``url`` without ``user:password@``, the Basic ``Authorization`` value carrying it, and what to redact."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None, []
    user, _, password = userinfo.partition(":")
    # httpx's BasicAuth: the percent-decoded user and password, UTF-8, base64.
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}", [*_userinfo_redactions(url), (token, REDACTED)]


def _long(secret: str) -> bool:
    return len(secret) >= _MIN_SECRET_LENGTH


def _scrub(value: Any, redactions: Sequence[Redaction]) -> Any:
    if isinstance(value, str):
        for secret, replacement in redactions:
            value = value.replace(secret, replacement)
        return value
    if isinstance(value, bytes):
        for secret, replacement in redactions:
            value = value.replace(secret.encode(), replacement.encode())
        return value
    if isinstance(value, dict):
        return {key: _scrub(item, redactions) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(item, redactions) for item in value)
    return value


def _links(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception reachable from it (cause, context, held in args, group members), outermost first."""
    found: dict[int, BaseException] = {}
    todo: deque[BaseException] = deque([exc])
    while todo:
        link = todo.popleft()
        if id(link) in found:
            continue
        found[id(link)] = link
        todo.extend(e for e in (link.__cause__, link.__context__) if e is not None)
        todo.extend(arg for arg in link.args if isinstance(arg, BaseException))
        if isinstance(link, BaseExceptionGroup):
            todo.extend(link.exceptions)
    return list(found.values())


def _clean(link: BaseException, redactions: Sequence[Redaction]) -> None:
    link.args = tuple(_scrub(arg, redactions) for arg in link.args)
    for attribute in ("message", "body", "__notes__"):
        value = getattr(link, attribute, None)
        if isinstance(value, str | bytes | dict | list):
            # A read-only property of that name is left alone; the check in redacted() catches what it shows.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(link, attribute, _scrub(value, redactions))


def redacted(exc: Exception, redactions: Sequence[Redaction]) -> Exception:
    """``exc`` with every secret replaced along its whole chain, in place; a ``RedactedError`` if that cannot be done.

    Cleaning in place keeps the provider's exception (its type, status code
    and body) as the run's ``model_error`` cause.  The check afterwards is
    the promise itself: nothing ``traceback`` would print holds a secret.
    """
    if not redactions:
        return exc
    links = _links(exc)
    for link in links:
        _clean(link, redactions)
    shown = "".join(traceback.format_exception(exc)) + "".join(repr(link) for link in links)
    if not any(secret in shown for secret, _ in redactions):
        return exc
    text = "; caused by ".join("".join(traceback.format_exception_only(link)).strip() for link in links)
    return RedactedError(_scrub(text, redactions))


class ProviderModel:
    """Lifecycle and error handling shared by the adapters; subclasses convert requests and responses.

    The adapter closes only the clients it built; a client passed in belongs
    to the caller.  The async client is built on first use of ``acomplete``,
    so a synchronous user never opens one.  Without ``client``, one is built
    from the settings given, each credential and the base URL falling back
    to the SDK's environment variables; a client passed in is used as it is,
    after checking that its credentials can go into a header.
    """

    model: str
    _CREDENTIALS: ClassVar[dict[str, str]]
    """Each credential the SDK client takes, with the environment variable it falls back to."""
    _BASE_URL_VARIABLE: ClassVar[str]

    def __init__(
        self,
        sdk: ModuleType,
        client: Any,
        async_client: Any,
        *,
        api_key: str | None,
        base_url: str | None,
        max_retries: int | None,
        timeout: float | None,
    ) -> None:
        settings = {"api_key": api_key, "base_url": base_url, "max_retries": max_retries, "timeout": timeout}
        given = {key: value for key, value in settings.items() if value is not None}
        if client is not None and given:
            msg = f"pass either client or {', '.join(given)}, not both: configure the client you pass instead"
            raise TypeError(msg)
        self._sdk = sdk
        self._headers: dict[str, str] = {}
        self._redactions: list[Redaction] = []
        self._owns_client = client is None
        if client is None:
            client = self._new_client(self._client_options(given))
        else:
            self._check_credentials(client)
        self.client = client
        self._async_client = async_client
        self._owns_async_client = False
        self.base_url = redact_url(self._client_url(client))
        """The URL requests go to, with a password in it shown as ``[redacted]``: for naming it in messages."""

    def _client_options(self, given: dict[str, Any]) -> dict[str, Any]:
        options = dict(given)
        for name, variable in self._CREDENTIALS.items():
            value = options.get(name, os.environ.get(variable) or None)
            if value is not None:
                options[name] = clean_key(value, name if name in given else variable)
        url = options.get("base_url", os.environ.get(self._BASE_URL_VARIABLE) or None)
        if url is not None:
            options["base_url"], authorization, self._redactions = split_userinfo(str(url))
            if authorization is not None:
                # The SDKs let default headers override their own auth header, as httpx's URL userinfo did.
                self._headers = {"Authorization": authorization}
                options["default_headers"] = self._headers
        return options

    def _check_credentials(self, client: Any) -> None:
        for name in self._CREDENTIALS:
            value = self._client_credential(client, name)
            if value is not None and clean_key(value, f"the client's {name}") != value:
                msg = f"the client's {name} has whitespace around it (a newline read from a file?); strip it first"
                raise ValueError(msg)

    # How a client shows its URL and credentials; an SDK whose client lacks these attributes overrides them.
    def _client_url(self, client: Any) -> str:
        return str(client.base_url)

    def _client_credential(self, client: Any, name: str) -> Any:
        return getattr(client, name, None)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, base_url={self.base_url!r})"

    # What each adapter supplies: the conversion both ways, the SDK clients and the SDK call itself.
    def build_request(self, messages: Sequence[Message], tools: list[JSONSchema]) -> dict[str, Any]:
        """The keyword arguments of the SDK call for this conversation."""
        raise NotImplementedError

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one SDK response."""
        raise NotImplementedError

    def _send(self, request: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _new_client(self, options: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _new_async_client(self) -> Any:
        raise NotImplementedError

    def _secrets(self) -> list[Redaction]:
        """Every credential the clients hold, as it may appear in text; only these are redacted from errors."""
        redactions = list(self._redactions)
        for client in (self.client, self._async_client):
            if client is None:
                continue
            for name in self._CREDENTIALS:
                value = self._client_credential(client, name)
                if isinstance(value, str) and _long(value.strip()):
                    redactions.append((value.strip(), REDACTED))
            redactions.extend(_userinfo_redactions(self._client_url(client)))
        return redactions

    def _failure(self, exc: Exception) -> Exception:
        """What leaves the adapter for ``exc``: its secrets redacted, and a connection failure naming the URL."""
        failure = redacted(exc, self._secrets())
        if failure is exc and isinstance(exc, self._sdk.APIConnectionError):
            cause = exc.__cause__
            detail = f" ({type(cause).__name__}: {cause})" if cause is not None and str(cause) else ""
            if isinstance(exc, self._sdk.APITimeoutError):
                text = f"Request timed out: no answer from {self.base_url}{detail}"
            else:
                text = f"Connection error: cannot reach {self.base_url}{detail}"
            exc.message = text
            exc.args = (text,)
        return failure

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Send the conversation and return the model's next message (the engine's ``Model`` protocol)."""
        try:
            return self.parse(self._send(self.build_request(messages, tools)))
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        # Raised outside the except block, so the stand-in has no __context__ holding the secret.
        raise failure

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """``complete`` over the SDK's async client, for the async driver."""
        try:
            request = self.build_request(messages, tools)
            if self._async_client is None:
                self._async_client = self._new_async_client()
                self._owns_async_client = True
            return self.parse(await self._asend(self._async_client, request))
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        raise failure

    def _guarded(self, work: Callable[[], ModelResponse]) -> ModelResponse:
        """``work()``, with whatever leaves it cleaned as ``complete`` cleans it (for the streaming calls)."""
        try:
            return work()
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        raise failure

    async def _aguarded(self, work: Callable[[Any], Awaitable[ModelResponse]]) -> ModelResponse:
        """``await work(async_client)``, cleaned as ``acomplete`` cleans it; the async client is built on first use."""
        try:
            if self._async_client is None:
                self._async_client = self._new_async_client()
                self._owns_async_client = True
            return await work(self._async_client)
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        raise failure

    def close(self) -> None:
        """Close the sync client if this adapter built it (use ``aclose`` once ``acomplete`` was used)."""
        if self._owns_client:
            self.client.close()

    async def aclose(self) -> None:
        """Close every client this adapter built, the async one included."""
        if self._owns_async_client and self._async_client is not None:
            await self._async_client.close()
        self.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()


def check_params(params: dict[str, Any], reserved: Sequence[str], adapter: str) -> None:
    """Refuse extra request parameters that the adapter fills itself, at construction rather than mid-run."""
    clash = sorted(set(params) & set(reserved))
    if clash:
        msg = f"{adapter} sets {', '.join(clash)} itself from the conversation and tools; do not pass them as params"
        raise TypeError(msg)
