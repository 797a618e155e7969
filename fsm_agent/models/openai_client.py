"""What both OpenAI adapters share: the SDK client, its key and URL, and the async twin built from it.

Chat Completions and the Responses API are two endpoints of one client, so
everything about the client (the ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``
variables, the keyword arguments, the async client made with the sync one's
settings) is written once here; each adapter only builds and reads its
endpoint's requests.  So is the context-length error both endpoints answer
with (code ``context_length_exceeded``), which leaves either adapter as
:class:`~fsm_agent.ContextOverflowError`, and the same 400 as the
OpenAI-compatible servers word it (vLLM, llama.cpp's server).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent.errors import ContextOverflowError
from fsm_agent.models.provider import ProviderModel

if TYPE_CHECKING:
    import openai

CONTEXT_LENGTH_EXCEEDED = "context_length_exceeded"
"""The ``error.code`` of OpenAI's context-length error, on Chat Completions and the Responses API alike."""

# How its message states the window and the input, in the wordings OpenAI has used:
# "This model's maximum context length is 128000 tokens. However, your messages resulted in 130512 tokens. ...",
# "Input tokens exceed the configured limit of 272000 tokens. Your messages resulted in 3148588 tokens. ...",
# "... However, you requested 4120 tokens (3120 in the messages, 1000 in the completion). ..." (the input is 3120).
# The Responses API's "Your input exceeds the context window of this model. ..." states neither.
_LIMIT = re.compile(r"(?:maximum context length is|configured limit of) (\d+) tokens", re.IGNORECASE)
_INPUT = re.compile(r"resulted in (\d+) tokens|\((\d+) in (?:the messages|your prompt)", re.IGNORECASE)


# OpenAI-compatible servers answer the same 400 without OpenAI's code.  vLLM (type BadRequestError, code 400), in
# its versions' wordings: "This model's maximum context length is 4096 tokens. However, you requested 1000 output
# tokens and your prompt contains at least 3500 input tokens, ...", "... However, your request has 5000 input
# tokens. ...", "You passed 8193 input tokens and requested 0 output tokens. However, the model's context length is
# only 8192 tokens, ...", "'max_tokens' or 'max_completion_tokens' is too large: 8000. This model's maximum context
# length is 4096 tokens and your request has 2778 input tokens ...".  A request that leaves no room for its
# max_tokens counts, as Anthropic's does: a shorter history is what makes it fit.  llama.cpp's server says
# "request (13392 tokens) exceeds the available context size (8192 tokens), ..." with type
# exceed_context_size_error and the two numbers as n_prompt_tokens and n_ctx.
_COMPATIBLE_LIMIT = re.compile(
    r"maximum context length is (\d+) tokens|context length is only (\d+) tokens"
    r"|available context size \((\d+) tokens\)",
    re.IGNORECASE,
)
_COMPATIBLE_INPUT = re.compile(
    r"(?:at least|request has|you passed) (\d+) input tokens|request \((\d+) tokens\)|\((\d+) in the messages",
    re.IGNORECASE,
)
EXCEED_CONTEXT_SIZE = "exceed_context_size_error"
"""The ``error.type`` of llama.cpp's server for a prompt longer than its context."""


def _number(found: re.Match[str] | None) -> int | None:
    """The one group of ``found``'s alternatives that matched, as a number."""
    return None if found is None else next(int(group) for group in found.groups() if group is not None)


def compatible_overflow(error: dict[str, Any], message: Any) -> ContextOverflowError | None:
    """A ``ContextOverflowError`` for an OpenAI-compatible server's 400 ``error`` object, if it is that error."""
    if not isinstance(message, str):
        return None
    limit = _COMPATIBLE_LIMIT.search(message)
    if limit is None and error.get("type") != EXCEED_CONTEXT_SIZE:
        return None
    tokens, window = error.get("n_prompt_tokens"), error.get("n_ctx")
    return ContextOverflowError(
        message,
        tokens=tokens if type(tokens) is int else _number(_COMPATIBLE_INPUT.search(message)),
        limit=window if type(window) is int else _number(limit),
    )


def context_overflow(code: Any, message: Any) -> ContextOverflowError | None:
    """A ``ContextOverflowError`` for an OpenAI error object with ``code`` and ``message``, if it is that error."""
    if code != CONTEXT_LENGTH_EXCEEDED or not isinstance(message, str):
        return None
    limit, tokens = _LIMIT.search(message), _INPUT.search(message)
    return ContextOverflowError(
        message,
        tokens=None if tokens is None else int(tokens[1] or tokens[2]),
        limit=None if limit is None else int(limit[1]),
    )


class OpenAIClientModel(ProviderModel):
    """A :class:`~fsm_agent.Model` over the official ``openai`` SDK's client (see the two adapters).

    Without ``client`` one is built from ``api_key`` (default: the
    ``OPENAI_API_KEY`` environment variable), ``base_url`` (default
    ``OPENAI_BASE_URL`` or OpenAI's), ``max_retries`` (default 2, the SDK's:
    429, 5xx and connection errors are retried with exponential backoff) and
    ``timeout`` (seconds, default the SDK's).  A ``client`` you pass is used
    as configured and never closed here; ``async_client`` likewise, else
    ``acomplete`` builds one with the sync client's settings.  ``params`` go
    into every request unchanged, except the keys the adapter sets itself
    (``reserved_params``).  Without the ``openai`` package this raises
    ``ImportError`` saying how to install it.
    """

    sdk_package = "openai"
    sdk_extra = "openai"
    credentials: ClassVar[Mapping[str, str]] = {"api_key": "OPENAI_API_KEY"}
    base_url_variable = "OPENAI_BASE_URL"
    # The context-length error is told by its code (CONTEXT_LENGTH_EXCEEDED), or by a compatible server's wording,
    # not by one pattern: see _context_overflow.

    client: openai.OpenAI

    def __init__(
        self,
        model: str,
        client: openai.OpenAI | None = None,
        *,
        async_client: openai.AsyncOpenAI | None = None,
        api_key: str | None = None,
        base_url: str | None = None,
        max_retries: int | None = None,
        timeout: float | None = None,
        **params: Any,
    ) -> None:
        sdk = self._load_sdk(params)
        super().__init__(
            sdk, client, async_client, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.model = model
        self.params = self._request_params(params)

    @staticmethod
    def _request_params(params: dict[str, Any]) -> dict[str, Any]:
        """The ``params`` every request gets; an adapter adds its own defaults here."""
        return params

    def _context_overflow(self, exc: Exception) -> ContextOverflowError | None:
        """OpenAI's context-length error: code ``context_length_exceeded``, as a 400 or as a streamed error event.

        The 400 is the SDK's ``BadRequestError`` (its ``body`` is the error
        object); an error event inside a Responses API stream is the SDK's
        plain ``APIError`` with that object as ``body``.  The same code on
        any other status is left as it is.  A 400 of an OpenAI-compatible
        server says it in words of its own (``compatible_overflow``).
        """
        sdk = self._sdk
        if not isinstance(exc, sdk.APIError) or isinstance(exc, sdk.APIConnectionError):
            return None
        if isinstance(exc, sdk.APIStatusError) and not isinstance(exc, sdk.BadRequestError):
            return None
        body = exc.body if isinstance(exc.body, dict) else {}
        message = body.get("message", exc.message)
        overflow = context_overflow(exc.code, message)
        if overflow is None and isinstance(exc, sdk.BadRequestError):
            overflow = compatible_overflow(body, message)
        return overflow

    def _new_client(self, options: dict[str, Any]) -> Any:
        # The SDK refuses a missing key naming keys of other kinds (admin, workload identity): refused here instead.
        if not options.get("api_key"):
            kind = type(self).__name__
            msg = f"{kind} has no key: set OPENAI_API_KEY, or pass api_key=... (any text for a server that checks none)"
            raise ValueError(msg)
        return self._sdk.OpenAI(**options)

    def _new_async_client(self) -> Any:
        client = self.client
        return self._sdk.AsyncOpenAI(
            api_key=client.api_key,
            organization=client.organization,
            project=client.project,
            base_url=client.base_url,
            max_retries=client.max_retries,
            timeout=client.timeout,
            default_headers=self._headers or None,
        )
