"""The adapter's side of the base: its provider's facts and its wire mapping, which each adapter fills in.

An adapter is one class, a :class:`~fsm_agent.models.provider.ProviderModel`:
at its top the facts this class declares (``finish_reasons``,
``overflow_pattern``, ``reserved_params``, the SDK and its extra, ...),
below them the methods this class leaves to it (``build_request`` and
``parse``, the SDK's calls and clients, how its stream opens) and a
:class:`StreamReader` for its stream's events.  What the base does with
them (the client's lifecycle, the four calls, their errors) is
``provider``'s, so each side reads on its own.
"""

from __future__ import annotations

from collections.abc import AsyncIterable, Callable, Iterable, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, AbstractContextManager
from typing import Any, ClassVar

from fsm_agent import Message, ModelResponse, OutputSchema
from fsm_agent.tools import JSONSchema


class AdapterSide:
    """What each adapter declares and supplies: its provider's facts, its wire mapping, its SDK's clients and calls."""

    # --- the provider's facts: each adapter declares these at the top of its class ----------------------------
    sdk_package: ClassVar[str]
    """The SDK's import name (``"openai"``, ``"google.genai"``), imported when the adapter is built."""
    sdk_extra: ClassVar[str]
    """The ``fsm-agent[...]`` extra that installs the SDK, named in the ``ImportError`` when it is missing."""
    credentials: ClassVar[Mapping[str, str]]
    """Each credential the SDK client takes, with the environment variable it falls back to."""
    base_url_variable: ClassVar[str]
    """The environment variable the SDK reads the base URL from."""
    reserved_params: ClassVar[tuple[str, ...]]
    """The request keys the adapter fills from the conversation and tools; refused in ``params`` at construction."""
    request_method: ClassVar[tuple[str, str] | None] = None
    """The SDK call ``params`` go to (module, qualified name), whose keywords they are checked against when built."""
    output_field: ClassVar[str]
    """The request field a typed agent's answer schema is asked for through (named when ``params`` already set it)."""
    finish_reasons: ClassVar[Mapping[str, str]]
    """The provider's finish signal -> the engine's ``stop_reason``.

    Any other signal is passed on unchanged, so the engine stops the run with
    ``model_error`` naming it (the reply kept) instead of taking an unknown
    signal for an answer; the adapter's own docstring says which refinements
    apply on top (tool calls under a plain stop, a refusal field).
    """
    overflow_pattern: ClassVar[str | None] = None
    """Finds the context-length error in an invalid-request message: group 1 the input's tokens, group 2 the window.

    ``None`` where the adapter tells that error by other means (OpenAI's, by its error code).
    """

    model: str

    # --- what each adapter supplies: the wire mapping both ways, the SDK's clients and its calls -------------
    def build_request(
        self, messages: Sequence[Message], tools: list[JSONSchema], output: OutputSchema | None = None
    ) -> dict[str, Any]:
        """The keyword arguments of the SDK call for this conversation, asking for ``output``'s schema if given."""
        raise NotImplementedError

    def parse(self, response: Any) -> ModelResponse:
        """The engine's view of one SDK response, streamed or not."""
        raise NotImplementedError

    def _send(self, client: Any, request: dict[str, Any]) -> Any:
        raise NotImplementedError

    async def _asend(self, client: Any, request: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _open_stream(self, client: Any, request: dict[str, Any]) -> AbstractContextManager[Iterable[Any]]:
        """The SDK's stream of events for ``request``, to be read inside a ``with`` block."""
        raise NotImplementedError

    async def _aopen_stream(
        self, client: Any, request: dict[str, Any]
    ) -> AbstractAsyncContextManager[AsyncIterable[Any]]:
        """``_open_stream`` on the async client, to be read inside an ``async with`` block."""
        raise NotImplementedError

    def _stream_reader(self) -> StreamReader:
        """A new reader for one call's stream events (see :class:`StreamReader`)."""
        raise NotImplementedError

    def _new_client(self, options: dict[str, Any]) -> Any:
        raise NotImplementedError

    def _new_async_client(self) -> Any:
        raise NotImplementedError

    def _invalid_request(self, exc: Exception) -> Any:
        """The message of ``exc`` if it is the provider's answer to an invalid request, for ``overflow_pattern``."""
        return None


class StreamReader:
    """How one call's stream events read: the answer text each carries, and the whole response they add up to.

    Each adapter's reader knows only its wire events; one is made per call,
    so it may keep what the events add up to (or let the SDK's stream keep it).
    """

    def read(self, event: Any) -> Iterable[Any]:
        """Take ``event`` in; the pieces of answer text it carries, to be handed on (empty ones are skipped)."""
        raise NotImplementedError

    def response(self, stream: Any) -> Any:
        """The whole response the events added up to, once ``stream`` (the opened stream) is read to its end."""
        raise NotImplementedError


def hand_on(pieces: Iterable[Any], on_text: Callable[[str], None]) -> None:
    """Hand each piece of answer text a reader gave on to ``on_text``: only text, and empty pieces skipped."""
    for piece in pieces:
        if isinstance(piece, str) and piece:
            on_text(piece)
