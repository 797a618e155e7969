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
by name and order.  The provider's facts (the finish-reason mapping
``finish_reasons``, which 400 is a context overflow, ...) sit at the top of
:class:`GeminiModel`; the wire format both ways is in
:mod:`fsm_agent.models.gemini_wire`.  The
SDK retries 408, 429 and 5xx answers and connection errors, ``max_retries``
times (default 2); it ignores ``Retry-After``, so on a client the adapter
builds, each retry waits as long as the server asked (up to two minutes;
asked for longer, the error goes out at once), as the other SDKs do.  A
typed agent's answer schema is asked for natively: JSON mode
(``response_mime_type="application/json"``) with the schema as
``response_json_schema`` (see :func:`~fsm_agent.models.gemini_wire.to_gemini_output`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent import Message, ModelResponse, OutputSchema
from fsm_agent.models.adapter_side import StreamReader
from fsm_agent.models.gemini_wire import (
    JSON_MIME_TYPE,
    OUTPUT_FIELDS,
    answer_texts,
    assembled,
    from_gemini_response,
    to_gemini_contents,
    to_gemini_output,
    to_gemini_tools,
)
from fsm_agent.models.provider import ProviderModel
from fsm_agent.models.redaction import clean_key, redacted
from fsm_agent.models.replies import not_json, wire_safe
from fsm_agent.models.retry_after import MAX_RETRY_AFTER, server_delay
from fsm_agent.tools import JSONSchema

if TYPE_CHECKING:
    from google import genai


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
    The client built here waits as long as a ``Retry-After`` asks before a
    retry, as the other SDKs do; a client passed in retries as configured.
    Called with ``output=`` (a typed agent), the config asks for that schema
    natively: ``response_mime_type="application/json"`` and
    ``response_json_schema``, the JSON answer arriving as an ordinary text
    part.  Params that set ``response_schema``, ``response_json_schema`` or
    a ``response_mime_type`` other than JSON are then refused with
    ``ValueError`` (without ``output`` they are sent as given).  Before
    Gemini 3 the API answers JSON mode with function declarations with 400
    ("Function calling with a response mime type: 'application/json' is
    unsupported"), so a typed agent with tools needs a Gemini 3 model.
    Without the ``google-genai`` package this raises ``ImportError`` saying
    how to install it.  Keys and errors are handled as for the other
    adapters (:mod:`fsm_agent.models.redaction`).
    """

    sdk_package = "google.genai"
    sdk_extra = "gemini"
    credentials: ClassVar[Mapping[str, str]] = {"api_key": "GOOGLE_API_KEY"}
    second_key_variable = "GEMINI_API_KEY"
    """Where the key is read from when ``GOOGLE_API_KEY`` is not set, as the SDK reads it."""
    base_url_variable = "GOOGLE_GEMINI_BASE_URL"
    default_url = "https://generativelanguage.googleapis.com/"
    reserved_params = ("model", "contents", "system_instruction", "tools")
    output_field = " and ".join(OUTPUT_FIELDS)
    finish_reasons: ClassVar[Mapping[str, str]] = {
        "STOP": "end_turn",
        "MAX_TOKENS": "max_tokens",
        "SAFETY": "refusal",
        "RECITATION": "refusal",
        "BLOCKLIST": "refusal",
        "PROHIBITED_CONTENT": "refusal",
        "SPII": "refusal",
    }
    """Gemini ``finishReason`` -> engine ``stop_reason``.

    ``STOP`` with function calls is ``tool_use``.  ``MALFORMED_FUNCTION_CALL``
    is not a stop: the call Gemini could not produce becomes a tool call whose
    arguments are Gemini's message, so the registry fails it and the model is
    told, and can correct it (the failure counts toward ``tool_failures``).  A
    prompt blocked before any candidate (``promptFeedback.blockReason``) is a
    ``refusal``.  A candidate with no content (null, or no parts) is a
    ``MalformedReplyError`` naming its finish reason, unless the reason says
    why it is empty (a refusal, ``MAX_TOKENS``, a malformed call).
    """
    # A 400 INVALID_ARGUMENT: "The input token count (1200293) exceeds the maximum number of tokens allowed (1048576)."
    overflow_pattern = r"input token count \((\d+)\) exceeds the maximum number of tokens allowed \((\d+)\)"

    client: genai.Client

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
        sdk = self._load_sdk(params)
        # A misspelt config field is refused here, not at the first model call.
        sdk.types.GenerateContentConfig(**params)
        super().__init__(
            sdk, client, None, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.model = model
        self.params = params

    def _client_options(self, given: dict[str, Any]) -> dict[str, Any]:
        options = super()._client_options(given)
        second = self.second_key_variable
        if "api_key" not in options and os.environ.get(second):
            options["api_key"] = clean_key(os.environ[second], second)
        return options

    def _new_client(self, options: dict[str, Any]) -> Any:
        if not options.get("api_key"):  # the SDK's own words name neither variable
            msg = "GeminiModel has no API key: set GOOGLE_API_KEY (or GEMINI_API_KEY), or pass api_key=..."
            raise ValueError(msg)
        types = self._sdk.types
        retries = options.get("max_retries", 2)
        http = types.HttpOptions(
            base_url=options.get("base_url"),
            headers=options.get("default_headers"),
            timeout=None if options.get("timeout") is None else int(options["timeout"] * 1000),
            retry_options=types.HttpRetryOptions(attempts=retries + 1),
        )
        client = self._sdk.Client(api_key=options.get("api_key"), vertexai=False, http_options=http)
        _honour_retry_after(client._api_client, self)  # noqa: SLF001 - the SDK's retries have no public hook
        return client

    def _new_async_client(self) -> Any:
        return self.client.aio

    # The SDK's client (and its aio side) exposes neither its key nor its URL publicly.
    def _client_url(self, client: Any) -> str:
        url = client._api_client._http_options.base_url  # noqa: SLF001 - no public accessor
        return str(url or self.default_url)

    def _client_credential(self, client: Any, name: str) -> Any:
        return getattr(client._api_client, name, None)  # noqa: SLF001 - no public accessor

    # How a retry waits: methods, so a test can record the waits instead of waiting them.
    def _pause(self, seconds: float) -> None:
        time.sleep(seconds)

    async def _apause(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _invalid_request(self, exc: Exception) -> Any:
        """The message of a 400 ``INVALID_ARGUMENT`` (the SDK's ``ClientError``); other 400s do not overflow."""
        if not isinstance(exc, self._sdk.errors.ClientError) or exc.code != 400 or exc.status != "INVALID_ARGUMENT":
            return None
        return exc.message

    def _cleaned(self, exc: Exception) -> Exception:
        if isinstance(exc, json.JSONDecodeError):
            # The SDK parses the body itself: a page that is not JSON (a proxy's, with status 200) is shown as such.
            exc = not_json(exc.doc)
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

    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of ``models.generate_content``: model, contents and a config."""
        types = self._sdk.types
        system, contents = to_gemini_contents(messages)
        config: dict[str, Any] = dict(self.params)
        if system:
            config["system_instruction"] = system
        if tools:
            config["tools"] = to_gemini_tools(tools)
        if output is not None:
            config.update(self._output_config(output))
        plain = wire_safe({"contents": contents, "config": config})
        # Built from Gemini's own JSON so a thought signature's base64 is read as the bytes it stands for.
        built = [types.Content.model_validate_json(json.dumps(c)) for c in plain["contents"]]
        return {"model": self.model, "contents": built, "config": types.GenerateContentConfig(**plain["config"])}

    def _output_config(self, output: OutputSchema) -> dict[str, Any]:
        """The config fields asking for ``output``; ``ValueError`` if the params already ask for another answer."""
        clash = [name for name in ("response_schema", *OUTPUT_FIELDS) if self.params.get(name) is not None]
        if self.params.get("response_mime_type") == JSON_MIME_TYPE:
            clash.remove("response_mime_type")  # the same JSON mode the schema needs
        if clash:
            raise self._output_clash(output, clash)
        return to_gemini_output(output)

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one ``GenerateContentResponse``."""
        return from_gemini_response(response, self.finish_reasons)

    def _send(self, client: Any, request: dict[str, Any]) -> Any:
        return client.models.generate_content(**request)

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        return await client.models.generate_content(**request)

    # Streamed as chunks, which are put back together (gemini_wire.assembled) and read as an unstreamed reply.
    def _open_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return contextlib.nullcontext(client.models.generate_content_stream(**request))

    async def _aopen_stream(self, client: Any, request: dict[str, Any]) -> Any:
        return contextlib.nullcontext(await client.models.generate_content_stream(**request))

    def _stream_reader(self) -> StreamReader:
        return _Chunks(self._sdk)

    async def aclose(self) -> None:
        """Close the client's async side and the client itself, if this adapter built it."""
        if self._owns_client:
            await self.client.aio.aclose()
        self.close()


class _Chunks(StreamReader):
    """Gemini's streamed chunks, kept to be put back together; their answer text handed on, thoughts not."""

    def __init__(self, sdk: ModuleType) -> None:
        self._types = sdk.types
        self._chunks: list[Any] = []

    def read(self, event: Any) -> Iterable[Any]:
        self._chunks.append(event)
        return answer_texts(event)

    def response(self, stream: Any) -> Any:
        return assembled(self._types, self._chunks)


def _asked(state: Any) -> float | None:
    """The wait the failed attempt's answer asked for (its ``Retry-After``), if any."""
    outcome = state.outcome
    error = outcome.exception() if outcome is not None and outcome.failed else None
    return server_delay(getattr(getattr(error, "response", None), "headers", None))


def _asked_or(backoff: Callable[[Any], float]) -> Callable[[Any], float]:
    """A tenacity wait: what the server asked for, when it asked for a wait the retry honours, else ``backoff``."""

    def wait(state: Any) -> float:
        delay = _asked(state)
        return delay if delay is not None and 0 < delay <= MAX_RETRY_AFTER else backoff(state)

    return wait


def _unless_asked_too_long(retriable: Callable[[Any], bool]) -> Callable[[Any], bool]:
    """A tenacity retry test: ``retriable``, except when the server asked for a wait past ``MAX_RETRY_AFTER``."""

    def retry(state: Any) -> bool:
        delay = _asked(state)
        return retriable(state) and (delay is None or delay <= MAX_RETRY_AFTER)

    return retry


def _honour_retry_after(api: Any, model: GeminiModel) -> None:
    """Make the SDK's retries (tenacity's, sync and async) wait as long as the server asked, through ``model``.

    Which answers are retried, and how often, stays the SDK's; only the wait
    changes: the server's ``Retry-After`` when it gave one, else the SDK's
    backoff, and no retry when it asked for more than ``MAX_RETRY_AFTER``.
    The wait is cut short by the run's deadline: the async driver cancels
    it; the sync driver stops the run and leaves the call behind.
    """
    # Looked up at each wait, so the model's _pause and _apause can be swapped after the client is built.
    sleeps = {"_retry": lambda s: model._pause(s), "_async_retry": lambda s: model._apause(s)}  # noqa: SLF001
    for name, sleep in sleeps.items():
        retrying = getattr(api, name)
        wait, retry = _asked_or(retrying.wait), _unless_asked_too_long(retrying.retry)
        setattr(api, name, retrying.copy(wait=wait, retry=retry, sleep=sleep))
