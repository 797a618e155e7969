"""The documented fixtures a docs page may ask for with ``<!-- fixture: NAME ARG... -->``.

Each sets environment variables the page's snippets read, so a snippet is
what a user would run against the real thing, pointed somewhere local:

- ``postgres``: ``DATABASE_URL``, a fresh database on the suite's throwaway
  PostgreSQL server.
- ``openai BODY...``: a loopback server answering like the OpenAI API with
  the recorded bodies ``tests/support/provider_bodies/openai/BODY.json`` in order;
  ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` point the official SDK at it.
  A ``BODY`` written ``openai_responses/NAME`` is a Responses API body
  (``tests/support/provider_bodies/openai_responses/NAME.json``), so one page can
  show Chat Completions and the Responses API against one server.
- ``openai_responses BODY...``: the same server, with the Responses API
  bodies ``tests/support/provider_bodies/openai_responses/BODY.json`` in order.
- ``openai_runs N``: the same server for ``N`` runs that may go at once (a
  batch on Ray workers): a request whose last message is a tool result is
  answered with ``openai/final_answer``, any other with ``openai/tool_call``
  (``add`` with ``a=2, b=3``), so each run gets its tool turn and then its
  answer, whatever order the runs' requests arrive in.
- ``anthropic BODY...``: a loopback server answering like the Anthropic
  Messages API with ``tests/support/provider_bodies/anthropic/BODY.json`` in order;
  ``ANTHROPIC_BASE_URL`` and ``ANTHROPIC_API_KEY`` point the official SDK at it.
- ``gemini BODY...``: a loopback server answering like the Gemini API with
  ``tests/support/provider_bodies/gemini/BODY.json`` in order; ``GOOGLE_GEMINI_BASE_URL``
  (which ``google-genai`` reads for its base URL) and ``GOOGLE_API_KEY`` point
  the official SDK at it.

A ``BODY`` without a ``.json`` file but with a ``.sse`` one (``stream_...``)
is served as that recorded event stream, for a snippet that streams.  Every
provider server enforces its API's rules about reasoning content
(``provider_rules``): thinking blocks, reasoning items and thought signatures
must come back as they were issued, or the request gets the provider's 400.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from support.provider_rules import anthropic_thinking, gemini_thought_signatures, openai_reasoning
from support.provider_server import BODIES, ProviderServer, Received, Reply, Rule, body, streamed

Fixture = Callable[[list[str], pytest.FixtureRequest, contextlib.ExitStack], dict[str, str]]


def _postgres(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    cluster = request.getfixturevalue("postgres_cluster")
    return {"DATABASE_URL": cluster.new_database(f"docs_{uuid.uuid4().hex[:12]}")}


def _recorded(provider: str, name: str) -> Reply | dict[str, Any]:
    """``provider_bodies/<provider>/<name>``: its ``.json`` body, else its ``.sse`` stream (``DIR/NAME`` picks DIR)."""
    if "/" in name:
        provider, name = name.split("/", 1)
    if (BODIES / provider / f"{name}.json").exists():
        return body(provider, name)
    if (BODIES / provider / f"{name}.sse").exists():
        return streamed(provider, name)
    msg = f"no recorded body {name!r} in tests/support/provider_bodies/{provider}/"
    raise ValueError(msg)


def _serve(stack: contextlib.ExitStack, rule: Rule, replies: list[Reply | dict[str, Any]]) -> ProviderServer:
    server = stack.enter_context(ProviderServer())
    server.rules.append(rule)
    server.queue(*replies)
    return server


def _openai(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    server = _serve(stack, openai_reasoning, [_recorded("openai", name) for name in args])
    return {"OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-docs"}


def _openai_responses(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    return _openai([f"openai_responses/{name}" for name in args], request, stack)


def _by_turn(received: Received) -> dict[str, Any]:
    """A tool call for a conversation that has no tool result last, the answer for one that has."""
    messages = (received.json or {}).get("messages") or [{}]
    return body("openai", "final_answer" if messages[-1].get("role") == "tool" else "tool_call")


def _openai_runs(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    (runs,) = args
    server = _serve(stack, openai_reasoning, [Reply(_by_turn) for _ in range(2 * int(runs))])
    return {"OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-docs"}


def _anthropic(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    server = _serve(stack, anthropic_thinking, [_recorded("anthropic", name) for name in args])
    return {"ANTHROPIC_BASE_URL": server.url, "ANTHROPIC_API_KEY": "sk-ant-docs"}


def _gemini(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    server = _serve(stack, gemini_thought_signatures, [_recorded("gemini", name) for name in args])
    return {"GOOGLE_GEMINI_BASE_URL": server.url, "GOOGLE_API_KEY": "docs-gemini-key"}


FIXTURES: dict[str, Fixture] = {
    "postgres": _postgres,
    "openai": _openai,
    "openai_responses": _openai_responses,
    "openai_runs": _openai_runs,
    "anthropic": _anthropic,
    "gemini": _gemini,
}


@contextlib.contextmanager
def environment(specs: list[list[str]], request: pytest.FixtureRequest) -> Iterator[dict[str, str]]:
    """The variables the page's fixtures set, their servers running until the page is done."""
    with contextlib.ExitStack() as stack:
        env: dict[str, str] = {}
        for name, *args in specs:
            if name not in FIXTURES:
                msg = f"unknown docs fixture {name!r}; known: {sorted(FIXTURES)}"
                raise ValueError(msg)
            env.update(FIXTURES[name](args, request, stack))
        yield env
