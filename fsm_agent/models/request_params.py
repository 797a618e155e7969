"""The request keywords an adapter is given (``params``), checked when it is built against what its SDK call takes.

An SDK refuses a keyword it does not know (``temprature=0.1``) only when the
request is made, which a run reports as a ``model_error`` at its first model
call; read from the SDK call's signature, the same mistake is a ``TypeError``
when the adapter is built.  Where that signature cannot be read (a version of
the SDK built otherwise, or one taking ``**kwargs``), nothing is refused here
and the SDK refuses at the first call, as before.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Collection, Mapping
from typing import Any

_KEYWORD = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)


def check_params(
    adapter: str, params: Mapping[str, Any], reserved: Collection[str], request_method: tuple[str, str] | None
) -> None:
    """A ``TypeError`` for ``params`` the adapter sets itself (``reserved``), or that its SDK call does not take.

    ``request_method`` is the SDK call (module, qualified name), such as
    ``("openai.resources.responses", "Responses.create")``; ``None`` for an
    adapter that checks its params another way (Gemini's config model).
    """
    clash = sorted(set(params) & set(reserved))
    if clash:
        names = ", ".join(clash)
        msg = f"{adapter} sets {names} itself from the conversation and tools; do not pass them as params"
        raise TypeError(msg)
    taken = None if request_method is None or not params else sdk_keywords(*request_method)
    unknown = [] if taken is None else sorted(set(params) - taken)
    if unknown:
        import difflib

        named = []
        for name in unknown:
            close = difflib.get_close_matches(name, sorted(taken or ()), n=1)
            named.append(f"{name!r} (did you mean {close[0]!r}?)" if close else repr(name))
        call = request_method[1] if request_method is not None else "the SDK call"
        msg = (
            f"{adapter} got {', '.join(named)}, which the SDK's {call}() does not take: correct the keyword, "
            "or send a field the SDK lacks in extra_body={...}"
        )
        raise TypeError(msg)


def sdk_keywords(module: str, qualified_name: str) -> frozenset[str] | None:
    """The keywords the SDK function ``module.qualified_name`` takes, or None where its signature does not say."""
    try:
        found: Any = importlib.import_module(module)
        for part in qualified_name.split("."):
            found = getattr(found, part)
        parameters = inspect.signature(found).parameters.values()
    except (ImportError, AttributeError, TypeError, ValueError):
        return None
    if any(parameter.kind is inspect.Parameter.VAR_KEYWORD for parameter in parameters):
        return None  # it takes any keyword: none can be told misspelt
    return frozenset(parameter.name for parameter in parameters if parameter.kind in _KEYWORD) - {"self"}
