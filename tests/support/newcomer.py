"""What the newcomer tests share: a weather tool that counts its calls, a scripted run that asks for it, no keys.

Why shared: the tests of a newcomer's mistakes (the API, the provider
adapters, the command line) check the same things each time: the tool was
never called, the model never asked, and no provider key leaks in from the
machine the tests run on.
"""

from __future__ import annotations

import pytest

from fsm_agent import ToolRegistry
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

PROVIDER_VARIABLES = (
    "OPENAI_API_KEY",
    "OPENAI_ADMIN_KEY",
    "OPENAI_BASE_URL",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_AUTH_TOKEN",
    "ANTHROPIC_BASE_URL",
    "GOOGLE_API_KEY",
    "GEMINI_API_KEY",
    "GOOGLE_GEMINI_BASE_URL",
)
"""Every variable an adapter reads a key or an address from."""


def without_provider_keys(monkeypatch: pytest.MonkeyPatch) -> None:
    """A machine where no provider key or address is set, as on a newcomer's first try."""
    for name in PROVIDER_VARIABLES:
        monkeypatch.delenv(name, raising=False)


class Weather:
    """A registry with one tool, ``weather``, that counts its calls in ``calls``."""

    def __init__(self) -> None:
        self.calls = 0
        self.registry = ToolRegistry()

        @self.registry.register
        def weather(city: str) -> dict[str, object]:
            """Current weather for a city."""
            self.calls += 1
            return {"city": city, "temp": 21}


def asks_for_weather() -> FakeModel:
    """A scripted model: one call to ``weather``, then an answer."""
    return FakeModel(tool_turn(tool_call("weather", id="w1", city="Paris")), reply("21 degrees."))
