"""What both OpenAI adapters share: the SDK client, its key and URL, and the async twin built from it.

Chat Completions and the Responses API are two endpoints of one client, so
everything about the client (the ``OPENAI_API_KEY`` and ``OPENAI_BASE_URL``
variables, the keyword arguments, the async client made with the sync one's
settings) is written once here; each adapter only builds and reads its
endpoint's requests.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

from fsm_agent.models.provider import ProviderModel, check_params, require_sdk

if TYPE_CHECKING:
    import openai


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
    (``_RESERVED``).  Without the ``openai`` package this raises
    ``ImportError`` saying how to install it.
    """

    client: openai.OpenAI
    _CREDENTIALS: ClassVar[dict[str, str]] = {"api_key": "OPENAI_API_KEY"}
    _BASE_URL_VARIABLE = "OPENAI_BASE_URL"
    _RESERVED: ClassVar[tuple[str, ...]] = ()

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
        sdk = require_sdk("openai")
        check_params(params, self._RESERVED, type(self).__name__)
        super().__init__(
            sdk, client, async_client, api_key=api_key, base_url=base_url, max_retries=max_retries, timeout=timeout
        )
        self.model = model
        self.params = self._request_params(params)

    @staticmethod
    def _request_params(params: dict[str, Any]) -> dict[str, Any]:
        """The ``params`` every request gets; an adapter adds its own defaults here."""
        return params

    def _new_client(self, options: dict[str, Any]) -> Any:
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
