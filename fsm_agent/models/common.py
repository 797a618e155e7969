"""What both provider adapters share: the lazy SDK import, the client lifecycle, argument decoding, key redaction.

Each rule that both providers must agree on lives here once: which tool
results count as failed, what becomes of argument text that is not a JSON
object, and how an API key is kept out of an error message.  The SDKs are
imported only when an adapter is built, so ``import fsm_agent.models`` works
without them.
"""

from __future__ import annotations

import contextlib
import importlib
import json
from collections.abc import Iterator, Sequence
from types import ModuleType, TracebackType
from typing import Any, Self

from fsm_agent.records import Message, ModelResponse, ToolCall
from fsm_agent.tools import JSONSchema

REDACTED = "[redacted]"
# Shorter "secrets" (placeholders such as "x" for local servers) would redact ordinary words.
_MIN_SECRET_LENGTH = 8


def require_sdk(package: str) -> ModuleType:
    """Import a provider SDK, or raise ``ImportError`` with the one-line install hint."""
    try:
        return importlib.import_module(package)
    except ImportError as exc:
        msg = f"the {package!r} package is not installed; install it with: pip install 'fsm-agent[{package}]'"
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


def tool_failed(message: Message) -> bool:
    """True when a tool message reports a failure: its content is a JSON object with a top-level ``"error"``.

    That is exactly how the registry encodes every failure, so this is
    structural, never a search for the word "error" in a successful result.
    """
    try:
        value = json.loads(message.content)
    except ValueError:
        return False
    return isinstance(value, dict) and "error" in value


def _scrub(value: Any, secrets: Sequence[str]) -> Any:
    if isinstance(value, str):
        for secret in secrets:
            value = value.replace(secret, REDACTED)
        return value
    if isinstance(value, dict):
        return {key: _scrub(item, secrets) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(item, secrets) for item in value)
    return value


def redact(exc: BaseException, secrets: Sequence[str | None]) -> None:
    """Replace every occurrence of ``secrets`` in the exception's message and body, in place.

    The exception itself must stay the provider's (the run's ``model_error``
    keeps it as ``__cause__``), so it is cleaned rather than wrapped: some
    servers echo the credentials they rejected, and the message ends up in
    the run's evidence, in logs and on the terminal.
    """
    keys = [s for s in secrets if s and len(s) >= _MIN_SECRET_LENGTH]
    if not keys:
        return
    exc.args = tuple(_scrub(arg, keys) for arg in exc.args)
    for attribute in ("message", "body"):
        if isinstance(getattr(exc, attribute, None), str | dict | list):
            setattr(exc, attribute, _scrub(getattr(exc, attribute), keys))


class ProviderModel:
    """Lifecycle and error handling shared by the adapters; subclasses convert requests and responses.

    The adapter closes only the clients it built; a client passed in belongs
    to the caller.  The async client is built on first use of ``acomplete``,
    so a synchronous user never opens one.
    """

    def __init__(self, client: Any, owns_client: bool, async_client: Any) -> None:
        self.client = client
        self._owns_client = owns_client
        self._async_client = async_client
        self._owns_async_client = False

    # What each adapter supplies: the conversion both ways and the SDK call itself.
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

    def _new_async_client(self) -> Any:
        raise NotImplementedError

    def _secrets(self) -> list[str | None]:
        # Every credential a client may hold; only these are redacted from provider errors.
        return [getattr(client, "api_key", None) for client in (self.client, self._async_client)]

    def complete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """Send the conversation and return the model's next message (the engine's ``Model`` protocol)."""
        request = self.build_request(messages, tools)
        with self._redacting():
            response = self._send(request)
        return self.parse(response)

    async def acomplete(self, messages: Sequence[Message], tools: list[JSONSchema]) -> ModelResponse:
        """``complete`` over the SDK's async client, for the async driver."""
        request = self.build_request(messages, tools)
        if self._async_client is None:
            self._async_client = self._new_async_client()
            self._owns_async_client = True
        with self._redacting():
            response = await self._asend(self._async_client, request)
        return self.parse(response)

    @contextlib.contextmanager
    def _redacting(self) -> Iterator[None]:
        try:
            yield
        except Exception as exc:
            redact(exc, self._secrets())
            raise

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
