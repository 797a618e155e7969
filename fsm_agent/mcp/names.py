"""The names an MCP server's tools get in a ``ToolRegistry``: unique, and ones every provider accepts.

MCP lets a server call a tool ``a.b``, ``ü`` or a name of 128 characters;
OpenAI and Anthropic accept only 1-64 letters, digits, ``_`` and ``-``.  The
rule gives the same names for the same tools, in whatever order the server
lists them:

- a name providers accept is kept;
- any other has each character but letters, digits, ``_`` and ``-`` replaced
  by ``_`` (``a.b`` becomes ``a_b``), when that fits in 64 characters and is
  no other tool's name, kept or replaced;
- otherwise (too long, or ``a.b`` beside ``a_b``, ``ü`` beside ``ö``) it is
  the first 55 characters of the replaced name, ``_`` and the first 8 hex
  digits of the SHA-256 of the server's name (UTF-8): ``a_b_`` followed by
  8 hex digits.  No tool wins by being listed first, and the name still says
  which tool it is.

The server is always called by its own name.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Sequence

_PROVIDER_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
_OTHER_CHARS = re.compile(r"[^A-Za-z0-9_-]")
_MOST = 64
_DIGITS = 8


def replaced(name: str) -> str:
    """``name`` with each character but letters, digits, ``_`` and ``-`` replaced by ``_`` (a name kept: itself)."""
    return _OTHER_CHARS.sub("_", name)


def provider_names(names: Sequence[str]) -> dict[str, str]:
    """Each of a server's tool names -> its name in the registry, by the module's rule; no two are the same."""
    kept = {name for name in names if _PROVIDER_NAME.fullmatch(name)}
    plain = {name: replaced(name) for name in names if name not in kept}
    wanted = Counter([*kept, *plain.values()])
    chosen = {name: name for name in kept}
    chosen.update({name: new for name, new in plain.items() if 0 < len(new) <= _MOST and wanted[new] == 1})
    taken = set(chosen.values())
    for name in sorted(set(plain) - set(chosen)):  # sorted: a longer suffix (see _suffixed) never depends on order
        chosen[name] = _suffixed(plain[name], name, taken)
        taken.add(chosen[name])
    return chosen


def _suffixed(replaced: str, name: str, taken: set[str]) -> str:
    """``replaced`` cut to fit, ``_`` and hex digits of the hash of ``name``: 8, more only if a name is taken."""
    digest = hashlib.sha256(name.encode("utf-8", "surrogatepass")).hexdigest()
    for digits in range(_DIGITS, _MOST):
        candidate = f"{replaced[: _MOST - 1 - digits]}_{digest[:digits]}"
        if candidate not in taken:
            return candidate
    # Only a server listing each of the 56 longer names of this tool as a tool of its own gets here.
    msg = f"no unique name for the MCP tool {name!r}: the server lists every name it could have"
    raise ValueError(msg)
