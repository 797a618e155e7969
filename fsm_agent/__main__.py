"""Command line: ``python -m fsm_agent <command> ...``; each command lives in the module named for it."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence


def build_parser() -> argparse.ArgumentParser:
    """The top-level parser with one subcommand per feature module."""
    parser = argparse.ArgumentParser(prog="python -m fsm_agent", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    # Imported here so `python -m fsm_agent --help` does not need optional extras.
    import fsm_agent.cli
    import fsm_agent.demo
    import fsm_agent.diagram
    import fsm_agent.runs_command

    fsm_agent.demo.add_command(commands)
    fsm_agent.diagram.add_command(commands)
    fsm_agent.cli.add_command(commands)
    fsm_agent.runs_command.add_command(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Parse ``argv`` and run the chosen command; returns the process exit code."""
    args = build_parser().parse_args(argv)
    code: int = args.handler(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
