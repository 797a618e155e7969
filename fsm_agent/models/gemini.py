"""The Google Gemini adapter over the official ``google-genai`` SDK, with thought signatures round-tripped.

Gemini's conversation is a list of ``user`` and ``model`` contents made of
parts: system messages become ``system_instruction``, tool calls
``functionCall`` parts and tool results ``functionResponse`` parts, all the
results of one turn in one user content, in the order of the calls.  A
thinking model signs its parts (``thoughtSignature``); a function call sent
back without its signature is refused with 400, so a reply with signed or
thought parts keeps its parts as they arrived (``ProviderData``) and they go
back verbatim.  Gemini may omit call ids: the adapter then derives one from
the response id and the call's position (stable for the same reply, unique
in a run) and never sends it, since the API pairs such calls and responses
by name and order.  The wire format both ways, and the finish-reason mapping
``FINISH_REASONS``, are in :mod:`fsm_agent.models.gemini_wire`.  The
SDK retries 408, 429 and 5xx answers and connection errors, ``max_retries``
times (default 2).
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent import Message, ModelResponse
from fsm_agent.models.gemini_wire import (
    assembled,
    from_gemini_response,
    hand_on,
    to_gemini_contents,
    to_gemini_tools,
)
from fsm_agent.models.provider import ProviderModel, check_params, require_sdk
from fsm_agent.models.redaction import clean_key, redacted
from fsm_agent.tools import JSONSchema

if TYPE_CHECKING:
    from google import genai

_RESERVED = ("model", "contents", "system_instruction", "tools")
_DEFAULT_URL = "https://generativelanguage.googleapis.com/"


class GeminiModel(ProviderModel):
    """A :class:`~fsm_agent.Model` over the official ``google-genai`` SDK's Gemini API (``generate_content``).

    Without ``client`` one is built from ``api_key`` (default: the
    ``GOOGLE_API_KEY`` environment variable, else ``GEMINI_API_KEY``, as the
    SDK reads them), ``base_url`` (default ``GOOGLE_GEMINI_BASE_URL`` or
    Google's), ``max_retries`` (default 2) and ``timeout`` (seconds).  A
    ``client`` you pass is used as configured (its own retry options) and
    never closed here; ``acomplete`` uses its ``aio`` side.  ``params`` are
    ``GenerateContentConfig`` fields added to every request
    (``thinking_config``, ``temperature``, ``max_output_tokens``, ...).
    Without the ``google-genai`` package this raises ``ImportError`` saying
    how to install it.  Keys and errors are handled as for the other
    adapters (:mod:`fsm_agent.models.redaction`).
    """

    client: genai.Client
    _CREDENTIALS: ClassVar[dict[str, str]] = {"api_key": "GOOGLE_API_KEY"}
    _BASE_URL_VARIABLE = "GOOGLE_GEMINI_BASE_URL"
    _SECOND_KEY_VARIABLE = "GEMINI_API_KEY"

    def __init__(
        self,
        model: str,
        client: genai.Client | None = None,
        *,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> None:
        sdk = require_sdk("google.genai", "gemini")
        check_params(params, _RESERVED, "GeminiModel")
        # A misspelt config field is refused here, not at the first model call.
        sdk.types.GenerateContentConfig(**params)
        super().__init__(
            sdk, client, None, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.model = model
        self.params = params

    def _client_options(self, given: dict[str, Any]) -> dict[str, Any]:
        options = super()._client_options(given)
        second = self._SECOND_KEY_VARIABLE
        if "api_key" not in options and os.environ.get(second):
            options["api_key"] = clean_key(os.environ[second], second)
        return options

    def _new_client(self, options: dict[str, Any]) -> Any:
        types = self._sdk.types
        retries = options.get("max_retries", 2)
        http = types.HttpOptions(
            base_url=options.get("base_url"),
            headers=options.get("default_headers"),
            timeout=None if options.get("timeout") is None else int(options["timeout"] * 1000),
            retry_options=types.HttpRetryOptions(attempts=retries + 1),
        )
        return self._sdk.Client(api_key=options.get("api_key"), vertexai=False, http_options=http)

    def _new_async_client(self) -> Any:
        return self.client.aio

    # The SDK's client (and its aio side) exposes neither its key nor its URL publicly.
    def _client_url(self, client: Any) -> str:
        url = client._api_client._http_options.base_url  # noqa: SLF001 - no public accessor
        return str(url or _DEFAULT_URL)

    def _client_credential(self, client: Any, name: str) -> Any:
        return getattr(client._api_client, name, None)  # noqa: SLF001 - no public accessor

    def _failure(self, exc: Exception) -> Exception:
        failure = redacted(exc, self._secrets())
        # Recent SDKs send through httpx2, a fork with the same exception tree, so the class names are compared.
        kinds = {cls.__name__ for cls in type(exc).__mro__ if cls.__module__.startswith("httpx")}
        if failure is exc and "TransportError" in kinds:
            cause = f" ({type(exc).__name__}: {exc})" if str(exc) else ""
            if "TimeoutException" in kinds:
                exc.args = (f"Request timed out: no answer from {self.base_url}{cause}",)
            else:
                exc.args = (f"Connection error: cannot reach {self.base_url}{cause}",)
        return failure

    def build_request(self, messages: Sequence[Message], tools: list[JSONSchema]) -> dict[str, Any]:
        """The keyword arguments of ``models.generate_content``: model, contents and a config."""
        types = self._sdk.types
        system, contents = to_gemini_contents(messages)
        config: dict[str, Any] = dict(self.params)
        if system:
            config["system_instruction"] = system
        if tools:
            config["tools"] = to_gemini_tools(tools)
        # Built from Gemini's own JSON so a thought signature's base64 is read as the bytes it stands for.
        built = [types.Content.model_validate_json(json.dumps(c)) for c in contents]
        return {"model": self.model, "contents": built, "config": types.GenerateContentConfig(**config)}

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one ``GenerateContentResponse``."""
        return from_gemini_response(response)

    def _send(self, request: dict[str, Any]) -> Any:
        return self.client.models.generate_content(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.models.generate_content(**request)

    # --- streaming: the same request, the text handed on as it arrives ------------------------------------

    def complete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], None]
    ) -> ModelResponse:
        """``complete`` over ``generate_content_stream``: ``on_text`` gets each piece of answer text as it arrives.

        The chunks are put back together (:func:`assembled`) and read as an
        unstreamed reply, so signatures, finish reason and usage mean the same.
        """

        def work() -> ModelResponse:
            chunks = []
            for chunk in self.client.models.generate_content_stream(**self.build_request(messages, tools)):
                hand_on(chunk, on_text)
                chunks.append(chunk)
            return self.parse(assembled(self._sdk.types, chunks))

        return self._guarded(work)

    async def acomplete_stream(
        self, messages: Sequence[Message], tools: list[JSONSchema], on_text: Callable[[str], None]
    ) -> ModelResponse:
        """``complete_stream`` over the client's ``aio`` side, for the async driver."""

        async def work(client: Any) -> ModelResponse:
            chunks = []
            async for chunk in await client.models.generate_content_stream(**self.build_request(messages, tools)):
                hand_on(chunk, on_text)
                chunks.append(chunk)
            return self.parse(assembled(self._sdk.types, chunks))

        return await self._aguarded(work)

    async def aclose(self) -> None:
        """Close the client's async side and the client itself, if this adapter built it."""
        if self._owns_client:
            await self.client.aio.aclose()
        self.close()
