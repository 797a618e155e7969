"""How much of one tool's output the model sees: the registry's cap, and the marker that says what was cut.

Output longer than ``max_output_chars`` keeps its first characters and a
line saying how many were cut, so one tool cannot flood the conversation
and the model still knows the text is not whole.
"""

from __future__ import annotations

from typing import Any

DEFAULT_MAX_OUTPUT_CHARS = 100_000
"""The default cap on one tool's output: about 25k tokens, far above a useful answer, far below a flood."""


def clip(text: str, cap: int) -> tuple[str, int]:
    """``text`` cut to ``cap`` characters plus a marker saying how many were cut, and that number."""
    cut = len(text) - cap
    if cut <= 0:
        return text, 0
    return f"{text[:cap]}\n[truncated: {cut} of {len(text)} characters cut, max_output_chars={cap}]", cut


def max_output_chars(value: Any) -> int | None:
    """``value`` as a registry's cap (None: no cap); anything but an integer >= 1 or None is a ``ValueError``."""
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
        msg = f"max_output_chars must be an integer >= 1, or None for no cap, got {value!r}"
        raise ValueError(msg)
    return value
