"""JSON text that any Python string survives: lone surrogates are escaped, everything else stays readable.

Providers do send half an emoji (a lone surrogate such as ``"\\ud83d"``).
``json.dumps(..., ensure_ascii=False)`` leaves it in the text as it is, and
encoding that text as UTF-8 (for a file, SQLite or PostgreSQL) raises
``UnicodeEncodeError``.  Escaping just those code points as ``\\udXXX`` keeps
the text valid UTF-8, and ``json.loads`` gives the very same string back.
(A high surrogate directly followed by a low one comes back as the one
character the pair encodes: JSON cannot tell the two apart.)
"""

from __future__ import annotations

import json
import re
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` with every lone surrogate escaped."""
    text = json.dumps(value, ensure_ascii=False, **options)
    # Surrogates can only occur inside JSON strings, where an escape means the same code point.
    return text if text.isascii() else _SURROGATE.sub(_escape, text)
