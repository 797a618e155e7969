"""A Griffe extension for the API reference: reST roles in docstrings shown as code.

The package's docstrings are written reST-style for the terminal and the
source (``:func:`render```, ``:class:`~fsm_agent.Model```); Markdown has no
roles, so mkdocstrings would print ``:func:`` in front of the name.  This
rewrites each role to the inline code it stands for when the API pages are
built, and changes nothing in the package.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

_ROLE = re.compile(r":(?:py:)?(?:func|class|meth|mod|attr|data|exc|obj):`~?(?P<target>[^`]+)`")


def _shown(match: re.Match[str]) -> str:
    """``:class:`~a.b.C``` -> ```C```, as Sphinx shows a ``~`` target; ``:mod:`a.b``` -> ```a.b```."""
    target = match["target"]
    return f"`{target.rsplit('.', 1)[-1]}`" if match[0].find("`~") >= 0 else f"`{target}`"


class ReSTRoles(griffe.Extension):
    """Rewrite the roles of every docstring once the package is loaded."""

    def on_object(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Rewrite ``obj``'s own docstring (aliases share their target's)."""
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(_shown, obj.docstring.value)
