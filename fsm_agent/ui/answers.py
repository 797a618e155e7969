"""The viewer's JSON answers: text as the store keeps it, half an emoji included.

Providers send lone surrogates (half an emoji) and the stores keep them;
Starlette's ``JSONResponse`` encodes its text as UTF-8, which cannot hold
one, so a run holding one was a 500.  ``JSONText`` writes each as its JSON
escape (``fsm_agent.jsontext``), which a browser reads back as the same text.
"""

from __future__ import annotations

from typing import Any

from starlette.responses import JSONResponse

from fsm_agent.jsontext import dumps


class JSONText(JSONResponse):
    """A ``JSONResponse`` whose body holds any text a run holds."""

    def render(self, content: Any) -> bytes:
        return dumps(content, allow_nan=False, separators=(",", ":")).encode("utf-8")


def event_data(value: Any) -> str:
    """``value`` as one server-sent event's ``data`` line's text."""
    return dumps(value)
