"""What every provider adapter shares: the lazy SDK import, the client lifecycle and its errors, cleaned.

The SDKs are imported only when an adapter is built, so ``import
fsm_agent.models`` works without them.  The checks at the adapters'
boundary live beside this module: ``replies`` (what a well-formed reply
holds) and ``redaction`` (credentials kept out of everything that leaves an
adapter).

A typed agent passes its answer's schema as ``output=``
(:class:`~fsm_agent.records.OutputSchema`) to every call; each adapter's
``build_request`` asks its provider for that schema natively (its docstring
names the request field), and ``output_clash`` is the one error for params
that already set that field.

A provider's context-length error (the conversation no longer fits the
model's window) leaves an adapter as :class:`~fsm_agent.ContextOverflowError`,
the SDK's error its ``__cause__``: each adapter's ``_context_overflow`` says
which answers those are, and ``_failure`` (which every call goes through)
raises it, cleaned of secrets like any other error.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType, TracebackType
from typing import Any, ClassVar, Self

from fsm_agent import Message, ModelResponse, OutputSchema
from fsm_agent.errors import ContextOverflowError
from fsm_agent.models.redaction import (
    REDACTED,
    Redaction,
    clean_key,
    long_enough,
    redact_url,
    redacted,
    split_userinfo,
    userinfo_redactions,
)
from fsm_agent.tools import JSONSchema


def require_sdk(package: str, extra: str | None = None) -> ModuleType:
    """Import a provider SDK, or raise ``ImportError`` with the install hint for the extra (default: ``package``)."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        hint = f"pip install 'fsm-agent[{extra or package}]'"
        msg = f"the {package!r} package is not installed; install it with: {hint}"
        raise ImportError(msg, name=package) from exc


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
    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of the SDK call for this conversation, asking for ``output``'s schema if given."""
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
                if isinstance(value, str) and long_enough(value.strip()):
                    redactions.append((value.strip(), REDACTED))
            redactions.extend(userinfo_redactions(self._client_url(client)))
        return redactions

    def _context_overflow(self, exc: Exception) -> ContextOverflowError | None:
        """``exc`` as a ``ContextOverflowError`` if it is the provider's context-length error, else ``None``.

        Each adapter recognises its own provider's answer (its SDK's error
        class plus the documented code or message); the ``__cause__`` and the
        redaction are ``_failure``'s.
        """
        return None

    def _failure(self, exc: Exception) -> Exception:
        """What leaves the adapter for ``exc``, secrets redacted: a context overflow as such, else ``_cleaned``."""
        overflow = self._context_overflow(exc)
        if overflow is None:
            return self._cleaned(exc)
        overflow.__cause__ = exc  # as ``raise overflow from exc`` would set it
        # The provider's message goes into the overflow's text, so the whole chain is cleaned as one.
        return redacted(overflow, self._secrets())

    def _cleaned(self, exc: Exception) -> Exception:
        """``exc`` with its secrets redacted, and a connection failure naming the URL."""
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

    def complete(
        self, messages: Sequence[Message], tools: list[JSONSchema], *, output: OutputSchema | None = None
    ) -> ModelResponse:
        """Send the conversation and return the model's next message (the engine's ``Model`` protocol).

        ``output`` (a typed agent's answer schema; ``None``: a plain-text
        answer) is asked for natively, as ``build_request`` says.
        """
        try:
            return self.parse(self._send(self.build_request(messages, tools, output)))
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        # Raised outside the except block, so the stand-in has no __context__ holding the secret.
        raise failure

    async def acomplete(
        self, messages: Sequence[Message], tools: list[JSONSchema], *, output: OutputSchema | None = None
    ) -> ModelResponse:
        """``complete`` over the SDK's async client, for the async driver."""
        try:
            request = self.build_request(messages, tools, output)
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


def overflow_in(message: Any, pattern: str) -> ContextOverflowError | None:
    """``message`` as a ``ContextOverflowError`` if ``pattern`` finds it there; its two groups are tokens, then limit.

    For the providers whose context-length error is known by its message
    (the input's length and the window in it), not by a code of its own.
    """
    found = re.search(pattern, message) if isinstance(message, str) else None
    if found is None:
        return None
    return ContextOverflowError(message, tokens=int(found[1]), limit=int(found[2]))


def check_params(params: dict[str, Any], reserved: Sequence[str], adapter: str) -> None:
    """Refuse extra request parameters that the adapter fills itself, at construction rather than mid-run."""
    clash = sorted(set(params) & set(reserved))
    if clash:
        msg = f"{adapter} sets {', '.join(clash)} itself from the conversation and tools; do not pass them as params"
        raise TypeError(msg)


def output_clash(adapter: str, params: Sequence[str], output: OutputSchema, field: str) -> ValueError:
    """The error for ``params`` that set the request ``field`` through which ``output`` is asked for.

    Raised when a call is built, not at construction: the same adapter
    serves untyped agents, to which those params go as they are.
    """
    names = ", ".join(params)
    msg = (
        f"{adapter} params set {names}, and the agent's output type {output.name!r} asks for its answer "
        f"through {field}: remove {names} from the model's params, or the output_type from the agent"
    )
    return ValueError(msg)
