"""The adapters' base: each provider's facts declared, its client's lifecycle, the calls and their errors, written once.

An adapter is one class.  At its top, its provider's facts, as the class
attributes :class:`ProviderModel` declares (``finish_reasons``,
``overflow_pattern``, ``reserved_params``, the SDK and its extra, ...);
below them, its wire mapping: ``build_request`` and ``parse``, how its
stream opens and how a ``StreamReader`` reads its events (that side,
declared, is ``adapter_side``'s).  Everything else is here: the SDK
imported only when an adapter is built (so ``import fsm_agent.models``
works without them), the client built from settings or passed in, the
four calls, sync and async twins differing only by ``await``, and what
leaves them.  The checks at the adapters' boundary live
beside this module: ``replies`` (what a well-formed reply holds) and
``redaction`` (credentials kept out of everything that leaves an adapter).

A typed agent's answer schema (``output=``) is asked for natively through
the adapter's ``output_field``; a provider's context-length error leaves a
call as :class:`~fsm_agent.ContextOverflowError`, the SDK's error its
``__cause__``, cleaned of secrets like any other error.
"""

from __future__ import annotations

import importlib
import os
import re
from collections.abc import Awaitable, Callable, Sequence
from types import ModuleType, TracebackType
from typing import Any, Self

from fsm_agent import Message, ModelResponse, OutputSchema
from fsm_agent.errors import ContextOverflowError
from fsm_agent.models.adapter_side import AdapterSide, hand_on
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
from fsm_agent.models.request_params import check_params
from fsm_agent.tools import JSONSchema


class ProviderModel(AdapterSide):
    """What every adapter shares: its provider's facts read, the client's lifecycle, the four calls and their errors.

    The adapter closes only the clients it built; a client passed in belongs
    to the caller.  The async client is built on first use of an async call,
    so a synchronous user never opens one.  Without ``client``, one is built
    from the settings given, each credential and the base URL falling back
    to the SDK's environment variables; a client passed in is used as it is,
    after checking that its credentials can go into a header.
    """

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

    @classmethod
    def _load_sdk(cls, params: dict[str, Any]) -> ModuleType:
        """The SDK (an ``ImportError`` with the install command without it), and ``params`` checked (``check_params``).

        An adapter's first step when built, so a mistake is refused at
        construction rather than mid-run.
        """
        try:
            sdk = importlib.import_module(cls.sdk_package)
        except ImportError as exc:
            hint = f"pip install 'fsm-agent[{cls.sdk_extra}]'"
            msg = f"the {cls.sdk_package!r} package is not installed; install it with: {hint}"
            raise ImportError(msg, name=cls.sdk_package) from exc
        check_params(cls.__name__, params, cls.reserved_params, cls.request_method)
        return sdk

    def _client_options(self, given: dict[str, Any]) -> dict[str, Any]:
        options = dict(given)
        for name, variable in self.credentials.items():
            value = options.get(name, os.environ.get(variable) or None)
            if value is not None:
                options[name] = clean_key(value, name if name in given else variable)
        url = options.get("base_url", os.environ.get(self.base_url_variable) or None)
        if url is not None:
            options["base_url"], authorization, self._redactions = split_userinfo(str(url))
            if authorization is not None:
                # The SDKs let default headers override their own auth header, as httpx's URL userinfo did.
                self._headers = {"Authorization": authorization}
                options["default_headers"] = self._headers
        return options

    def _check_credentials(self, client: Any) -> None:
        for name in self.credentials:
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

    # --- the calls: the engine's Model protocol, sync and async alike -------------------------------------------
    def complete(
        self, messages: Sequence[Message], tools: list[JSONSchema], *, output: OutputSchema | None = None
    ) -> ModelResponse:
        """Send the conversation and return the model's next message (the engine's ``Model`` protocol).

        ``output`` (a typed agent's answer schema; ``None``: a plain-text
        answer) is asked for natively, as ``build_request`` says.
        """

        def call() -> ModelResponse:
            return self.parse(self._send(self.client, self.build_request(messages, tools, output)))

        return self._guarded(call)

    async def acomplete(
        self, messages: Sequence[Message], tools: list[JSONSchema], *, output: OutputSchema | None = None
    ) -> ModelResponse:
        """``complete`` over the SDK's async client, for the async driver."""

        async def call(client: Any) -> ModelResponse:
            return self.parse(await self._asend(client, self.build_request(messages, tools, output)))

        return await self._aguarded(call)

    def complete_stream(
        self,
        messages: Sequence[Message],
        tools: list[JSONSchema],
        on_text: Callable[[str], None],
        *,
        output: OutputSchema | None = None,
    ) -> ModelResponse:
        """``complete`` over a streamed response: ``on_text`` gets each piece of the reply's text as it arrives.

        The adapter's reader adds the events up to the whole response, which
        ``parse`` reads as it reads an unstreamed one, so a cut, refused or
        tool-calling reply means the same.
        """

        def call() -> ModelResponse:
            reader = self._stream_reader()
            with self._open_stream(self.client, self.build_request(messages, tools, output)) as events:
                for event in events:
                    hand_on(reader.read(event), on_text)
                response = reader.response(events)
            return self.parse(response)

        return self._guarded(call)

    async def acomplete_stream(
        self,
        messages: Sequence[Message],
        tools: list[JSONSchema],
        on_text: Callable[[str], None],
        *,
        output: OutputSchema | None = None,
    ) -> ModelResponse:
        """``complete_stream`` over the SDK's async client, for the async driver."""

        async def call(client: Any) -> ModelResponse:
            reader = self._stream_reader()
            async with await self._aopen_stream(client, self.build_request(messages, tools, output)) as events:
                async for event in events:
                    hand_on(reader.read(event), on_text)
                response = reader.response(events)
            return self.parse(response)

        return await self._aguarded(call)

    def _guarded(self, call: Callable[[], ModelResponse]) -> ModelResponse:
        """``call()``, whatever leaves it cleaned by ``_failure``."""
        try:
            return call()
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        # Raised outside the except block, so the stand-in has no __context__ holding the secret.
        raise failure

    async def _aguarded(self, call: Callable[[Any], Awaitable[ModelResponse]]) -> ModelResponse:
        """``await call(async_client)``, cleaned as ``_guarded`` cleans it; the async client is built on first use."""
        try:
            if self._async_client is None:
                self._async_client = self._new_async_client()
                self._owns_async_client = True
            return await call(self._async_client)
        except Exception as exc:
            failure = self._failure(exc)
            if failure is exc:
                raise
        raise failure

    # --- errors: what leaves a call -----------------------------------------------------------------------------
    def _secrets(self) -> list[Redaction]:
        """Every credential the clients hold, as it may appear in text; only these are redacted from errors."""
        redactions = list(self._redactions)
        for client in (self.client, self._async_client):
            if client is None:
                continue
            for name in self.credentials:
                value = self._client_credential(client, name)
                if isinstance(value, str) and long_enough(value.strip()):
                    redactions.append((value.strip(), REDACTED))
            redactions.extend(userinfo_redactions(self._client_url(client)))
        return redactions

    def _context_overflow(self, exc: Exception) -> ContextOverflowError | None:
        """``exc`` as a ``ContextOverflowError`` if it is the provider's context-length error, else ``None``.

        Here: an invalid-request message (``_invalid_request``) that
        ``overflow_pattern`` finds; an adapter that tells the error otherwise
        overrides this.  The ``__cause__`` and the redaction are ``_failure``'s.
        """
        if self.overflow_pattern is None:
            return None
        message = self._invalid_request(exc)
        found = re.search(self.overflow_pattern, message) if isinstance(message, str) else None
        if found is None:
            return None
        return ContextOverflowError(message, tokens=int(found[1]), limit=int(found[2]))

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

    def _output_clash(self, output: OutputSchema, params: Sequence[str] = ()) -> ValueError:
        """The error for ``params`` (default: ``output_field`` itself) that already set the field ``output`` needs.

        Raised when a call is built, not at construction: the same adapter
        serves untyped agents, to which those params go as they are.
        """
        names = ", ".join(params or [self.output_field])
        msg = (
            f"{type(self).__name__} params set {names}, and the agent's output type {output.name!r} asks for its "
            f"answer through {self.output_field}: remove {names} from the model's params, or the output_type from "
            "the agent"
        )
        return ValueError(msg)

    # --- closing ------------------------------------------------------------------------------------------------
    def close(self) -> None:
        """Close the sync client if this adapter built it (use ``aclose`` once an async call was made)."""
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
