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
from collections.abc import Callable, Mapping
from typing import Any

_SURROGATE = re.compile("[\ud800-\udfff]")


def _escape(match: re.Match[str]) -> str:
    return f"\\u{ord(match[0]):04x}"


def dumps(value: Any, **options: Any) -> str:
    """``json.dumps(value, ensure_ascii=False, **options)`` with every lone surrogate escaped."""
    text = json.dumps(value, ensure_ascii=False, **options)
    # Surrogates can only occur inside JSON strings, where an escape means the same code point.
    return text if text.isascii() else _SURROGATE.sub(_escape, text)


_JSON_SCALARS = (str, int, float, type(None))  # bool is an int


def not_json(value: object, name: str) -> str | None:
    """Where ``value`` (called ``name``) holds what JSON cannot encode, as ``"name['data'] is of type bytes"``; or None.

    What ``json.dumps`` encodes is fine (so a snapshot, a store and
    ``RunResult.to_json`` can write it): dicts whose keys are strings,
    numbers, booleans or None, lists, tuples, strings, numbers, booleans and
    None.  Walked without recursion; ``value`` must not contain itself (a
    caller bounds its nesting first, as the check of a reply does).
    """
    pending: list[tuple[str, object]] = [(name, value)]
    while pending:
        path, item = pending.pop()
        if isinstance(item, _JSON_SCALARS):
            continue
        if isinstance(item, dict):
            for key in item:
                if not isinstance(key, _JSON_SCALARS):
                    return f"{path} has a key JSON cannot encode: {key!r}"
            pending.extend((f"{path}[{key!r}]", inner) for key, inner in reversed(item.items()))
        elif isinstance(item, list | tuple):
            pending.extend((f"{path}[{index}]", inner) for index, inner in reversed(list(enumerate(item))))
        else:
            return f"{path} is of type {type(item).__name__}"
    return None


def versioned(
    source: dict[str, Any] | str,
    what: str,
    kind: tuple[str, int],
    migrations: Mapping[int, Callable[[dict[str, Any]], dict[str, Any]]],
    error: type[Exception],
) -> dict[str, Any]:
    """A versioned JSON document (a dict or its text) of ``kind`` (format, version), older versions migrated up.

    Snapshots and recordings alike: the wrong format or an unknown version is
    ``error`` naming what this version reads (a version is a whole number:
    ``true`` or ``1.0`` is none); a migration that fails is too.
    """
    if isinstance(source, str):
        try:
            source = json.loads(source)
        except ValueError as exc:
            msg = f"{what} is not valid JSON: {exc}"
            raise error(msg) from exc
    if not isinstance(source, dict):
        msg = f"{what} must be a JSON object, got {type(source).__name__}"
        raise error(msg)
    form, current = kind
    version = source.get("version")
    whole = isinstance(version, int) and not isinstance(version, bool)  # true == 1 == 1.0, but no version
    if source.get("format") != form or not (whole and (version == current or version in migrations)):
        readable = ", ".join(str(v) for v in (*migrations, current))
        msg = f"unsupported {what} {(source.get('format'), version)}; this version reads {form!r} versions {readable}"
        raise error(msg)
    try:
        while source["version"] != current:
            source = migrations[source["version"]](source)
    except (KeyError, TypeError, ValueError) as exc:
        msg = f"{what} version {version} could not be migrated: {type(exc).__name__}: {exc}"
        raise error(msg) from exc
    return source


def input_digest(text: str) -> str:
    """The sha256 of any Python string, lone surrogates included: what a sub-agent's stored run keeps of its input.

    Why: a stored answer is taken only for the same input; the run that
    stores it and the recording that finds it compute it alike.
    """
    import hashlib  # OpenSSL's, loaded by the first sub-agent call rather than by import fsm_agent

    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def no_json_text(source: object, exc: BaseException) -> str | None:
    """``source`` as an error shows it (60 characters at most) if it is a text that is no JSON at all (``exc``'s cause).

    Such a text is most often a name given where a document's own text is
    read (a run id, a file's path): the caller's error says what to pass
    instead.  Any other source, or a text that starts like a document
    (``{``), gets None: ``exc`` says where that breaks.
    """
    if not isinstance(source, str) or not isinstance(exc.__cause__, ValueError) or source.lstrip().startswith("{"):
        return None
    return source if len(source) <= 60 else f"{source[:57]}..."
