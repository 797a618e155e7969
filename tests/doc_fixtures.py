"""The documented fixtures a docs page may ask for with ``<!-- fixture: NAME ARG... -->``.

Each sets environment variables the page's snippets read, so a snippet is
what a user would run against the real thing, pointed somewhere local:

- ``postgres``: ``DATABASE_URL``, a fresh database on the suite's throwaway
  PostgreSQL server.
- ``openai BODY...``: a loopback server answering like the OpenAI API with
  the recorded bodies ``tests/provider_bodies/openai/BODY.json`` in order;
  ``OPENAI_BASE_URL`` and ``OPENAI_API_KEY`` point the official SDK at it.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Callable, Iterator

import pytest
from provider_server import ProviderServer, body

Fixture = Callable[[list[str], pytest.FixtureRequest, contextlib.ExitStack], dict[str, str]]


def _postgres(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    cluster = request.getfixturevalue("postgres_cluster")
    return {"DATABASE_URL": cluster.new_database(f"docs_{uuid.uuid4().hex[:12]}")}


def _openai(args: list[str], request: pytest.FixtureRequest, stack: contextlib.ExitStack) -> dict[str, str]:
    server = stack.enter_context(ProviderServer())
    server.queue(*(body("openai", name) for name in args))
    return {"OPENAI_BASE_URL": server.url + "/v1", "OPENAI_API_KEY": "sk-docs"}


FIXTURES: dict[str, Fixture] = {"postgres": _postgres, "openai": _openai}


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
