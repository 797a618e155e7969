"""The command-line reference as Markdown, read from the argparse parsers themselves, so it cannot drift.

``make diagram`` writes it into the ``cli`` block of
``docs/reference/cli.md`` (with the table's blocks, see
``fsm_agent.render.markdown``), and a test fails when the committed page
differs from a fresh render.  Every command, and every action of ``runs``,
gets its description, its usage and one row per argument with its help and
default.  The usage is formatted at a fixed width, so the page does not
depend on the terminal that ran ``make``.
"""

from __future__ import annotations

import argparse
import html
import re
from collections.abc import Iterator

from fsm_agent.cli import EXIT_CODES

WIDTH = 80
"""Columns of the usage blocks: the terminal's width must not change the committed page."""

_CODE = re.compile(r"(`[^`]*`)")
_SPECIAL = re.compile(r"[\\\[\]|]|(?<!\w)[*_]|[*_](?!\w)")


def _plain(text: str) -> str:
    """Text outside code spans, with what Markdown would read as markup escaped (``<`` as an entity)."""
    return _SPECIAL.sub(lambda found: "\\" + found[0], text.replace("&", "&amp;").replace("<", "&lt;"))


def _md(text: str) -> str:
    """Help text as Markdown table-cell text: backquoted spans stay code, every other markup character is escaped."""
    parts = _CODE.split(" ".join(text.split()))
    return "".join(_code(part[1:-1]) if _CODE.fullmatch(part) else _plain(part) for part in parts)


def _code(text: str) -> str:
    """``text`` as code in a table cell.

    A ``|`` would split the row, and an escaped one stays escaped inside a
    code span for Python-Markdown (while GitHub needs the escape), so code
    holding one is written as HTML with the pipe as an entity, which both
    show as ``|``.
    """
    if "|" not in text:
        return f"`{text}`"
    return f"<code>{html.escape(text, quote=False).replace('|', '&#124;')}</code>"


def _subcommands(parser: argparse.ArgumentParser) -> Iterator[tuple[str, str, argparse.ArgumentParser]]:
    """(name, one-line help, parser) of each sub-command of ``parser``, in the order they were added."""
    for action in parser._actions:  # noqa: SLF001 - argparse has no public way to list a parser's arguments
        if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - nor to tell its sub-parsers
            helps = {choice.dest: choice.help or "" for choice in action._choices_actions}  # noqa: SLF001
            for name, sub in action.choices.items():
                yield name, helps.get(name, ""), sub


def _arguments(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    """The arguments a user gives: neither ``--help`` nor the sub-command choice nor a suppressed one."""
    return [
        action
        for action in parser._actions  # noqa: SLF001 - see _subcommands
        if not isinstance(action, argparse._HelpAction | argparse._SubParsersAction)  # noqa: SLF001
        and action.help != argparse.SUPPRESS
    ]


def _usage_part(action: argparse.Action) -> str:
    """One argument as the usage line writes it: ``--store FILE|URL``, ``question``, ``COMMAND ...``."""
    if isinstance(action, argparse._SubParsersAction):  # noqa: SLF001 - see _subcommands
        return f"{_metavar(action)} ..."
    written = invocation(action).split(", ")[0] if action.nargs == 0 else invocation(action)
    if isinstance(action, argparse.BooleanOptionalAction):
        written = " | ".join(action.option_strings)
    return written


def usage(parser: argparse.ArgumentParser) -> str:
    """The command's usage, options before positionals as argparse orders them, wrapped at ``WIDTH`` columns.

    Written here rather than taken from argparse, whose wrapping differs
    between Python versions: the committed page must be the same on each.
    """
    actions = [a for a in parser._actions if a.help != argparse.SUPPRESS]  # noqa: SLF001 - see _subcommands
    groups = parser._mutually_exclusive_groups  # noqa: SLF001
    group_of = {id(a): g for g in groups for a in g._group_actions}  # noqa: SLF001
    parts, seen = [], set()
    for action in [a for a in actions if a.option_strings] + [a for a in actions if not a.option_strings]:
        group = group_of.get(id(action))
        if group is not None:
            if id(group) in seen:
                continue
            seen.add(id(group))
            inner = " | ".join(_usage_part(a) for a in group._group_actions)  # noqa: SLF001
            parts.append(f"({inner})" if group.required else f"[{inner}]")
        elif action.required or not action.option_strings:
            parts.append(_usage_part(action))
        else:
            parts.append(f"[{_usage_part(action)}]")
    lead = f"usage: {parser.prog} "
    lines, line = [], lead
    for part in parts:
        if len(line) + len(part) > WIDTH and line.strip() != lead.strip():
            lines.append(line.rstrip())
            line = " " * len(lead)
        line += part + " "
    lines.append(line.rstrip())
    return "\n".join(lines)


def _metavar(action: argparse.Action) -> str:
    if action.metavar is not None:
        return str(action.metavar)
    if action.choices is not None:
        return "{" + ",".join(str(choice) for choice in action.choices) + "}"
    return action.dest if not action.option_strings else action.dest.upper()


def invocation(action: argparse.Action) -> str:
    """How the argument is written: ``question``, ``--store FILE|URL``, ``--stream, --no-stream``."""
    if not action.option_strings:
        return _metavar(action)
    flags = ", ".join(action.option_strings)
    if action.nargs == 0:
        return flags
    shown = _metavar(action)
    takes = {"?": f"[{shown}]", "*": f"[{shown} ...]", "+": f"{shown} [{shown} ...]"}
    return f"{flags} {takes.get(str(action.nargs), shown)}"


def help_text(action: argparse.Action, prog: str) -> str:
    """The argument's help with ``%(default)s`` and the like filled in, as argparse does."""
    if not action.help:
        return ""
    params = {name: value for name, value in vars(action).items() if value is not argparse.SUPPRESS}
    params["prog"] = prog
    if params.get("choices") is not None:
        params["choices"] = ", ".join(str(choice) for choice in params["choices"])
    return action.help % params


def default(action: argparse.Action) -> str:
    """The default worth showing: none for a flag that is off, a missing value or an empty list."""
    value = action.default
    if value is None or value is argparse.SUPPRESS or value is False or value == []:
        return ""
    return _code(str(value))


def _notes(action: argparse.Action, parser: argparse.ArgumentParser) -> str:
    """Required, or one of a group whose flags exclude each other."""
    notes = []
    for group in parser._mutually_exclusive_groups:  # noqa: SLF001 - see _subcommands
        if action in group._group_actions:  # noqa: SLF001
            others = [a.option_strings[0] for a in group._group_actions if a is not action]  # noqa: SLF001
            either = "one of it and " if group.required else "not with "
            notes.append(either + ", ".join(_code(flag) for flag in others))
    if action.required and action.option_strings and "required" not in (action.help or ""):
        notes.append("required")
    return f" ({'; '.join(notes)})" if notes else ""


def _sentence(text: str) -> str:
    """A ``--help`` line as a sentence: capitalised, with a full stop."""
    text = " ".join(text.split())
    return text[:1].upper() + text[1:] + ("" if text.endswith(".") else ".")


def _anchor(name: str) -> str:
    """The heading id MkDocs' ``toc`` gives ``## `runs list` ``."""
    return name.replace(" ", "-")


def _overview(parser: argparse.ArgumentParser, prefix: str) -> list[str]:
    """A table of the sub-commands with their one-line help, each linking to its section."""
    rows = [
        f"| [`{prefix}{name}`](#{_anchor(prefix + name)}) | {_md(_sentence(summary))} |"
        for name, summary, _ in _subcommands(parser)
    ]
    return ["| command | what it does |", "|---|---|", *rows, ""] if rows else []


def _section(parser: argparse.ArgumentParser, name: str, summary: str, level: int) -> list[str]:
    lines = [f"{'#' * level} `{name}`", ""]
    described = parser.description or summary  # the description says more; the summary is in the overview
    if described:
        lines += [_md(_sentence(described)), ""]
    lines += ["```text", usage(parser), "```", ""]
    lines += _overview(parser, f"{name} ")
    arguments = _arguments(parser)
    if arguments:
        lines += ["| argument | what it does | default |", "|---|---|---|"]
        for action in arguments:
            described = _md(help_text(action, parser.prog)) + _notes(action, parser)
            lines.append(f"| {_code(invocation(action))} | {described} | {default(action)} |")
        lines.append("")
    for sub_name, sub_summary, sub in _subcommands(parser):
        lines += _section(sub, f"{name} {sub_name}", sub_summary, level + 1)
    return lines


def cli_reference(parser: argparse.ArgumentParser | None = None) -> str:
    """Markdown for every command and flag of ``python -m fsm_agent`` (by default the real parser)."""
    if parser is None:
        from fsm_agent.cli.main import build_parser  # the command modules import this one's package

        parser = build_parser()
    description = " ".join((parser.description or "").split())
    lines = [description, "", "```text", usage(parser), "```", ""]
    lines += ["Every command takes `-h`/`--help`. Every command exits with one of these codes:", ""]
    lines += ["| code | meaning |", "|---:|---|"]
    lines += [f"| {code} | {_md(text)} |" for code, text in EXIT_CODES]
    lines.append("")
    lines += _overview(parser, "")
    for name, summary, sub in _subcommands(parser):
        lines += _section(sub, name, summary, 2)
    return "\n".join(lines).rstrip()
