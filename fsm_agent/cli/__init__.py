"""The command line, ``python -m fsm_agent COMMAND``: one module per command, none imported on the run path.

Every command exits with one of these codes, so a script can tell a mistake
in its own set-up from a run that stopped:

- ``0`` done: the answer printed, the diagram or the listing written;
- ``1`` a set-up or usage error (a bad flag, no API key, an unreachable
  server, a store file that is not SQLite), one line on stderr naming what is
  at fault;
- ``2`` a run stopped: its reason and evidence on stderr;
- ``130`` interrupted (Ctrl-C), as shells report a SIGINT.
"""

from __future__ import annotations

import importlib
import inspect
import os
import sys
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

EXIT_DONE = 0
EXIT_SETUP = 1
EXIT_STOPPED = 2
EXIT_INTERRUPTED = 130

EXIT_CODES = (
    (EXIT_DONE, "done: the answer printed, the diagram or the listing written"),
    (EXIT_SETUP, "a set-up or usage error: one line on stderr naming what is at fault"),
    (EXIT_STOPPED, "a run stopped: its reason and evidence on stderr"),
    (EXIT_INTERRUPTED, "interrupted (Ctrl-C)"),
)
"""Each exit code with what it means, as the top-level ``--help`` lists them."""


def described(doc: str | None) -> str:
    """A command module's docstring as its ``--help`` shows it: the first paragraph, without the double backticks.

    The docstrings are written for the reference docs; a terminal would
    show their markup as it is.
    """
    return (doc or "").split("\n\n")[0].replace("``", "")


class SetupError(Exception):
    """Something the user chose prevents the command from starting; the message is the one line shown."""


def out_file(path: Path, flag: str) -> Path:
    """``path``, its folder made as every flag that writes a file makes it; a ``SetupError`` if it cannot be written.

    Why: checked before the command makes anything (a run, a store file,
    an emptied output file), so a refusal leaves nothing half-done, and a
    file asked for is never lost after the work that fills it was done.
    """
    if path.is_dir():
        msg = f"{flag} {path} is a directory: give the file to write, e.g. {path / 'out.json'}"
        raise SetupError(msg)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        msg = f"cannot write {flag} {path}: {exc}"
        raise SetupError(msg) from None
    if not os.access(path.parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        msg = f"cannot write {flag} {path}: permission denied"
        raise SetupError(msg)
    return path


def import_named(spec: str, flag: str, usable: Callable[[Any], bool] = callable) -> Any:
    """What ``MODULE:NAME`` names, if ``usable`` says it is; else a ``SetupError`` in one line naming ``flag``.

    The module is looked for in the current directory first, as ``python -m``
    does: a user's agent module next to their inputs is found.
    """
    module_name, sep, name = spec.partition(":")
    if not sep or not module_name or not name:
        msg = f"{flag} wants MODULE:FUNCTION, got {spec!r}"
        raise SetupError(msg)
    if module_name.endswith(".py") or "/" in module_name or os.sep in module_name:
        raise SetupError(_a_path_given(module_name, name, flag))
    if module_name.startswith("."):
        msg = f"{flag}: {module_name!r} is a relative module name: write the module's full name, without the dot"
        raise SetupError(msg)
    sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        msg = f"{flag}: cannot import {module_name!r}: {exc}"
        raise SetupError(msg) from None
    except Exception as exc:  # noqa: BLE001  # a typo or a failing set-up in the user's module: one line, no frames
        raise SetupError(f"{flag}: cannot import {module_name!r}: {_import_failure(exc)}") from None
    found = getattr(module, name, None)
    if found is None:
        msg = f"{flag}: {module_name} has no function {name!r}"
        raise SetupError(msg)
    if not usable(found) or inspect.iscoroutinefunction(found):
        raise SetupError(f"{flag}: {module_name}.{_not_a_factory(found, name)}")
    return found


def _import_failure(exc: Exception) -> str:
    """What went wrong running the user's module, in one line: the exception, its message and where it was raised.

    Why: the frames of a traceback are mostly the package's own and the
    import machinery's; the user needs their file and line, as Python's own
    ``File "shop.py", line 4`` names it.
    """
    if isinstance(exc, SyntaxError):
        where = f"{exc.filename}, line {exc.lineno}"
        said = exc.msg
    else:
        frames = traceback.extract_tb(exc.__traceback__)
        where = f"{frames[-1].filename}, line {frames[-1].lineno}" if frames else "unknown place"
        said = str(exc)
    text = " ".join(said.split())
    return f"{type(exc).__name__} in {where}" + (f": {text}" if text else "")


def _a_path_given(path: str, name: str, flag: str) -> str:
    """The one line for a file path where ``MODULE`` goes: the module spelling to write, or that no such file exists.

    Why: importing ``./shop.py`` raises a traceback about relative imports and
    ``shop.py`` says "No module named 'shop.py'": neither names the fix.
    """
    file = path if path.endswith(".py") else f"{path}.py"
    module = os.path.splitext(os.path.basename(file))[0]
    if not os.path.isfile(file) and not os.path.isdir(path):
        return f"{flag}: no such file {file!r}; MODULE is a module name: write {module}:{name}, run from its directory"
    where = os.path.dirname(os.path.abspath(file))
    elsewhere = "" if where == os.getcwd() else f", run from the file's directory ({where})"
    return f"{flag}: MODULE is a module name, not a file: write {module}:{name}{elsewhere}"


def _not_a_factory(found: Any, name: str) -> str:
    """What ``found``, which ``MODULE:NAME`` names, is instead of a plain function: an object, or an ``async def``."""
    if callable(found):  # an async def: the command line calls the factory, it does not await it
        return f"{name} is an async def; make it a plain def that returns the agent (the command line calls it)"
    kind = type(found).__name__
    article = "an" if kind[:1].lower() in "aeiou" else "a"
    return f"{name} is {article} {kind}, not a function; name a function that returns it (def make(): return {name})"
