"""An id the store holds no run by is a ``RunNotFoundError``: a ``KeyError`` whose message reads as written.

An app maps it to its own answer (a 404) without catching the
``KeyError``s of its own code, and a person reading the error sees the
message, not the quoted repr a bare ``KeyError`` prints.
"""

from __future__ import annotations

import asyncio

import pytest

from fsm_agent import RunNotFoundError
from fsm_agent.persist import open_store


@pytest.mark.parametrize("run_id", ["nope", "bad\x00id"])
def test_loading_an_unknown_run_raises_run_not_found_with_a_plain_message(store_target: str, run_id: str) -> None:
    with open_store(store_target) as store:
        with pytest.raises(RunNotFoundError) as raised:
            store.load(run_id)
        assert isinstance(raised.value, KeyError)
        assert str(raised.value).startswith(f"no run {run_id!r} in ")

        async def aload() -> None:
            try:
                await store.aload(run_id)
            finally:
                await store.aclose()

        with pytest.raises(RunNotFoundError):
            asyncio.run(aload())
