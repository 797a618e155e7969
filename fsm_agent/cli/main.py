"""``python -m fsm_agent <command> ...``: the parser and the exit codes every command shares.

Each command lives in the module of ``fsm_agent.cli`` named for it and
registers its own sub-parser; this module only dispatches and turns usage
errors and Ctrl-C into the documented exit codes (see :mod:`fsm_agent.cli`).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from typing import NoReturn

from fsm_agent.cli import EXIT_CODES, EXIT_INTERRUPTED, EXIT_SETUP

DESCRIPTION = (
    "An LLM tool-calling agent loop as an explicit state machine: run it against a model or over a batch,\n"
    "list, show, resume and view the stored runs, draw the machine."
)
EPILOG = "exit codes, the same for every command:\n" + "\n".join(f"  {code:<5}{text}" for code, text in EXIT_CODES)


class UsageError(Exception):
    """A flag or argument argparse rejected; the message is argparse's, prefixed with the command."""


class CommandParser(argparse.ArgumentParser):
    """An ``ArgumentParser`` whose usage errors exit 1 (a set-up error), not argparse's 2, which means a stop here."""

    def error(self, message: str) -> NoReturn:
        """Raise instead of exiting, so ``main`` prints one line and returns the set-up exit code."""
        raise UsageError(f"{self.prog}: {message} (see --help)")


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per command module."""
    # Raw: the exit codes stay one to a line; the commands' own parsers still wrap their text.
    parser = CommandParser(
        prog="python -m fsm_agent",
        description=DESCRIPTION,
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # Sub-parsers are built with the parent's class, so every command's usage errors exit 1 too.
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Imported here so `python -m fsm_agent --help` does not need optional extras.
    from fsm_agent.cli import batch, check, demo, diagram, run, runs, ui

    batch.add_command(commands)
    check.add_command(commands)
    demo.add_command(commands)
    diagram.add_command(commands)
    run.add_command(commands)
    runs.add_command(commands)
    ui.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code (0, 1, 2 or 130)."""
    try:
        args = build_parser().parse_args(argv)
    except UsageError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        code: int = args.handler(args)
    except KeyboardInterrupt:
        print("\ninterrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    return code


if __name__ == "__main__":
    sys.exit(main())
