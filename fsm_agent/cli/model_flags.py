"""Which model a command runs, and how it is reached and priced: the flags ``run`` and ``runs resume`` share.

``--model PROVIDER:NAME`` (or ``--agent``, the user's own agent), the
endpoint and its key, the SDK's retries and ``--price``; ``build_model``
turns them into the provider's adapter, and every mistake in them into one
``SetupError`` line.  Kept apart from the ``run`` command, which also
builds the agent around the model, drives it and reports the outcome,
because ``runs resume`` and ``batch`` reach a model the same way.
"""

from __future__ import annotations

import argparse
import os
from urllib.parse import urlsplit, urlunsplit

from fsm_agent import Price
from fsm_agent.cli import SetupError
from fsm_agent.models.named import model_named
from fsm_agent.models.provider import ProviderModel

PROVIDERS = {
    "openai": "OPENAI_API_KEY",
    "openai-responses": "OPENAI_API_KEY",
    "anthropic": "ANTHROPIC_API_KEY",
    "gemini": "GOOGLE_API_KEY",
}
"""Provider prefix of ``--model`` -> the environment variable its SDK reads the key from."""

SECOND_KEY_VARIABLES = {"gemini": "GEMINI_API_KEY"}
"""Where the key is looked for next, as the SDK does (google-genai reads ``GEMINI_API_KEY`` too)."""

# Local OpenAI-compatible servers ignore the key, but the SDK refuses to start without one.
PLACEHOLDER_KEY = "no-key-needed"

PRICE_HELP = (
    "the model's price in US dollars per million input, output and (optionally) cached input tokens, for a model "
    "genai-prices does not list (a local server): its calls are priced, and --cost-budget can count them"
)
PRICE_FLAG = "pass --price INPUT,OUTPUT (US dollars per million tokens, e.g. --price 0.15,0.60)"
"""How a command-line user gives a model its price, in the engine's refusal of a budget over an unpriced model."""

UNREACHABLE = frozenset({"APIConnectionError", "ConnectError", "ConnectionError", "ConnectionRefusedError"})
"""``model_error`` evidence types that mean the server was never reached: the SDKs' and the standard library's."""


def add_model_arguments(parser: argparse.ArgumentParser, *, agent_help: str) -> None:
    """``--model`` or ``--agent`` (one required), then the flags that reach and price a model: ``run``, ``runs resume``.

    ``--agent`` is added right after ``--model``: argparse draws a group in
    the usage as ``(--model ... | --agent ...)`` only when its flags are
    added one after the other.
    """
    who = parser.add_mutually_exclusive_group(required=True)
    who.add_argument(
        "--model",
        metavar="PROVIDER:NAME",
        help="e.g. openai:gpt-4o-mini, openai-responses:o4-mini, anthropic:claude-sonnet-4-5, gemini:gemini-2.5-flash, "
        "or openai:llama3.1 with --base-url",
    )
    who.add_argument("--agent", metavar="MODULE:FUNCTION", help=agent_help)
    parser.add_argument(
        "--base-url",
        metavar="URL",
        help="the API endpoint, e.g. http://localhost:11434/v1 for Ollama (OpenAI-compatible); "
        "with it, a missing key is not an error",
    )
    parser.add_argument(
        "--api-key-env",
        metavar="VAR",
        help="environment variable holding the API key "
        "(default: OPENAI_API_KEY, ANTHROPIC_API_KEY, or GOOGLE_API_KEY then GEMINI_API_KEY)",
    )
    parser.add_argument(
        "--max-retries", type=int, default=2, help="retries of 429/5xx/connection errors by the SDK (default 2)"
    )
    parser.add_argument("--price", type=price_flag, metavar="INPUT,OUTPUT[,CACHED]", help=PRICE_HELP)


def price_flag(text: str) -> Price:
    """``--price INPUT,OUTPUT[,CACHED]`` as a ``Price``; a usage error naming the flag if it is not one.

    Each amount is US dollars per million tokens, as ``Price`` takes them;
    ``Price`` refuses a negative or non-finite one in its own words.
    """
    amounts = text.split(",")
    if len(amounts) not in (2, 3):
        msg = f"wants INPUT,OUTPUT or INPUT,OUTPUT,CACHED (US dollars per million tokens), got {text!r}"
        raise argparse.ArgumentTypeError(msg)
    try:
        numbers = [float(amount) for amount in amounts]
    except ValueError:
        msg = f"wants numbers of US dollars per million tokens, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    try:
        return Price(*numbers)
    except ValueError as exc:  # negative, NaN or infinite
        raise argparse.ArgumentTypeError(str(exc)) from None


def build_model(spec: str, base_url: str | None, api_key_env: str | None, max_retries: int) -> ProviderModel:
    """The adapter for ``provider:name``, with its key read from the environment; ``SetupError`` if it cannot be."""
    provider, _, name = spec.partition(":")
    if provider not in PROVIDERS or not name:
        msg = f"--model wants PROVIDER:NAME with PROVIDER one of {', '.join(PROVIDERS)}, got {spec!r}"
        raise SetupError(msg)
    if max_retries < 0:
        msg = f"--max-retries must be >= 0, got {max_retries}"
        raise SetupError(msg)
    variable = api_key_env or PROVIDERS[provider]
    api_key = os.environ.get(variable)
    if not api_key and api_key_env is None and provider in SECOND_KEY_VARIABLES:
        api_key = os.environ.get(SECOND_KEY_VARIABLES[provider])
    if not api_key:
        if base_url is None or api_key_env is not None:
            msg = f"no API key: set {variable}" + ("" if api_key_env else " (or name another variable: --api-key-env)")
            raise SetupError(msg)
        api_key = PLACEHOLDER_KEY
    try:
        return model_named(spec, api_key=api_key, base_url=base_url, max_retries=max_retries)
    except ImportError as exc:
        raise SetupError(str(exc)) from None
    except Exception as exc:  # noqa: BLE001 - an SDK refusing its settings is a setup error, shown in one line
        raise SetupError(f"cannot set up the {provider} client: {exc}") from None


def endpoint(model: object, fallback: str | None) -> str:
    """The URL the model adapter talks to, without any user or password in it, for a one-line error."""
    url = getattr(model, "base_url", None) or fallback
    if url is None:
        return "the provider's default URL"
    parts = urlsplit(str(url))
    return urlunsplit(parts._replace(netloc=parts.netloc.rpartition("@")[2]))
