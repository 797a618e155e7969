"""A stream is typed as the generator it is, so ``contextlib.closing``/``aclosing`` of it type-checks.

streaming.md tells a reader that leaves an ``astream()`` early to close it
with ``contextlib.aclosing``; typed as an ``AsyncIterator`` (which has no
``aclose``), that line was a ``mypy --strict`` error in a user's program.
"""

from __future__ import annotations

import typing

import pytest

from fsm_agent import Agent, AgentRun


@pytest.mark.parametrize(
    ("method", "kind"),
    [
        (Agent.stream, "Generator"),
        (AgentRun.stream, "Generator"),
        (Agent.astream, "AsyncGenerator"),
        (AgentRun.astream, "AsyncGenerator"),
    ],
)
def test_each_stream_method_returns_a_generator_type_that_can_be_closed(method: typing.Any, kind: str) -> None:
    returned = method.__annotations__["return"]  # a string: the package's annotations are postponed
    assert returned.split("[")[0] == kind
