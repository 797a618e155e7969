"""Keeping credentials out of everything that leaves a provider adapter: keys, URLs and whole exception chains.

Credentials.  An API key is stripped of surrounding whitespace when the
adapter is built (a key read from a file keeps its newline, and no HTTP
header may carry one); a key with whitespace, a control or a non-ASCII
character inside is a ``ValueError`` naming the position, never the key.
``user:password@`` in ``base_url`` is taken out of the URL and sent as the
HTTP Basic ``Authorization`` header, as httpx would have sent it, so the
URL that the SDK logs and puts into errors holds no password, and neither
do the adapter's ``base_url`` attribute and ``repr()``.  Only in the URL of
a ``client=`` passed in, which keeps its userinfo, is the password shown as
``[redacted]``.

Errors.  Every exception leaving ``complete``/``acomplete`` is cleaned in
place along its whole chain (``__cause__``, ``__context__``, exceptions held
in ``args``): its ``args``, the SDKs' ``message`` and ``body`` and its notes
have every secret replaced by ``[redacted]``.  The provider's exception thus
stays the run's ``__cause__``, with its type and status code.  If the
formatted chain would still show a secret (an exception whose text does not
come from its arguments), a ``RedactedError`` with the cleaned text and the
original type names is raised instead, without the chain.  A connection
failure's message names the (redacted) URL it could not reach.  Not
cleaned: other attributes of the exceptions (the SDK's ``request`` object
holds the headers sent) and the local variables of traceback frames.
"""

from __future__ import annotations

import base64
import contextlib
import traceback
import unicodedata
from collections import deque
from collections.abc import Sequence
from typing import Any
from urllib.parse import unquote, urlsplit, urlunsplit

REDACTED = "[redacted]"
# Shorter "secrets" (placeholders such as "x" for local servers) would redact ordinary words.
_MIN_SECRET_LENGTH = 8

Redaction = tuple[str, str]
"""A secret as it may appear in text, and what replaces it."""


class RedactedError(Exception):
    """Stands in for a provider error whose text kept a secret after cleaning: its cleaned text, with type names."""


def clean_key(key: Any, name: str) -> str:
    """``key`` without surrounding whitespace; if unusable, a ``ValueError`` saying why without showing the key."""
    if not isinstance(key, str):
        msg = f"{name} must be a string, got {type(key).__name__}"
        raise TypeError(msg)
    stripped = key.strip()
    if not stripped:
        msg = f"{name} is empty"
        raise ValueError(msg)
    for position, char in enumerate(stripped):
        if char.isspace() or not char.isprintable() or not char.isascii():
            what = unicodedata.name(char, f"control character U+{ord(char):04X}")
            msg = f"{name} has {what} at position {position} of {len(stripped)}, which no HTTP header can carry"
            raise ValueError(msg)
    return stripped


def redact_url(url: str) -> str:
    """``url`` for showing: the password of its ``user:password@`` replaced, no trailing slash."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if at:
        user, colon, _ = userinfo.partition(":")
        host = f"{user}:{REDACTED}@{host}" if colon else f"{user}@{host}"
    return urlunsplit(parts._replace(netloc=host)).rstrip("/")


def userinfo_redactions(url: str) -> list[Redaction]:
    userinfo, at, _ = urlsplit(url).netloc.rpartition("@")
    if not at:
        return []
    user, colon, password = userinfo.partition(":")
    redactions = [(f"{userinfo}@", f"{user}:{REDACTED}@" if colon else f"{user}@")]
    redactions.extend((secret, REDACTED) for secret in {password, unquote(password)} if long_enough(secret))
    return redactions


def split_userinfo(url: str) -> tuple[str, str | None, list[Redaction]]:
    """``url`` without ``user:password@``, the Basic ``Authorization`` value carrying it, and what to redact."""
    parts = urlsplit(url)
    userinfo, at, host = parts.netloc.rpartition("@")
    if not at:
        return url, None, []
    user, _, password = userinfo.partition(":")
    # httpx's BasicAuth: the percent-decoded user and password, UTF-8, base64.
    token = base64.b64encode(f"{unquote(user)}:{unquote(password)}".encode()).decode()
    return urlunsplit(parts._replace(netloc=host)), f"Basic {token}", [*userinfo_redactions(url), (token, REDACTED)]


def long_enough(secret: str) -> bool:
    """Whether ``secret`` is long enough to redact without redacting ordinary words."""
    return len(secret) >= _MIN_SECRET_LENGTH


def _scrub(value: Any, redactions: Sequence[Redaction]) -> Any:
    if isinstance(value, str):
        for secret, replacement in redactions:
            value = value.replace(secret, replacement)
        return value
    if isinstance(value, bytes):
        for secret, replacement in redactions:
            value = value.replace(secret.encode(), replacement.encode())
        return value
    if isinstance(value, dict):
        return {key: _scrub(item, redactions) for key, item in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_scrub(item, redactions) for item in value)
    return value


def _links(exc: BaseException) -> list[BaseException]:
    """``exc`` and every exception reachable from it (cause, context, held in args, group members), outermost first."""
    found: dict[int, BaseException] = {}
    todo: deque[BaseException] = deque([exc])
    while todo:
        link = todo.popleft()
        if id(link) in found:
            continue
        found[id(link)] = link
        todo.extend(e for e in (link.__cause__, link.__context__) if e is not None)
        todo.extend(arg for arg in link.args if isinstance(arg, BaseException))
        if isinstance(link, BaseExceptionGroup):
            todo.extend(link.exceptions)
    return list(found.values())


def _clean(link: BaseException, redactions: Sequence[Redaction]) -> None:
    link.args = tuple(_scrub(arg, redactions) for arg in link.args)
    for attribute in ("message", "body", "__notes__"):
        value = getattr(link, attribute, None)
        if isinstance(value, str | bytes | dict | list):
            # A read-only property of that name is left alone; the check in redacted() catches what it shows.
            with contextlib.suppress(AttributeError, TypeError):
                setattr(link, attribute, _scrub(value, redactions))


def redacted(exc: Exception, redactions: Sequence[Redaction]) -> Exception:
    """``exc`` with every secret replaced along its whole chain, in place; a ``RedactedError`` if that cannot be done.

    Cleaning in place keeps the provider's exception (its type, status code
    and body) as the run's ``model_error`` cause.  The check afterwards is
    the promise itself: nothing ``traceback`` would print holds a secret.
    """
    if not redactions:
        return exc
    links = _links(exc)
    for link in links:
        _clean(link, redactions)
    shown = "".join(traceback.format_exception(exc)) + "".join(repr(link) for link in links)
    if not any(secret in shown for secret, _ in redactions):
        return exc
    text = "; caused by ".join("".join(traceback.format_exception_only(link)).strip() for link in links)
    return RedactedError(_scrub(text, redactions))
