"""``runs export RUN_ID --out FILE.json``: a stored run as a recording, to replay in tests.

The recording (``fsm_agent.persist.recording``) holds every model request
and reply, every tool result, the trace and the limits, and the runs of the
run's sub-agents; ``fsm_agent.testing.replay`` runs an agent against it.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from fsm_agent.cli import EXIT_DONE, SetupError
from fsm_agent.jsontext import dumps as json_text
from fsm_agent.persist.recording import export


def add_parser(actions: Any) -> argparse.ArgumentParser:
    """Register the ``export`` action of ``runs``; the caller adds ``--store``."""
    parser: argparse.ArgumentParser = actions.add_parser(
        "export",
        help="write a run as a recording (JSON) to replay in tests",
        description="Write a stored run, its sub-agents' runs nested, as a self-contained JSON recording: "
        "each model request and reply, each tool result, the trace and the limits "
        "(fsm_agent.testing.replay runs an agent against it).",
    )
    parser.add_argument("run_id")
    parser.add_argument("--out", type=Path, required=True, metavar="FILE.json", help="where to write it (- for stdout)")
    return parser


def main(store: Any, args: argparse.Namespace) -> int:
    """Write the recording of ``args.run_id`` to ``args.out``; a missing run is a ``KeyError`` for the caller.

    An ``--out`` that cannot be written (a directory, no permission) is a
    ``SetupError`` naming it; a directory is refused before the run is read.
    """
    to_stdout = str(args.out) == "-"
    if not to_stdout and args.out.is_dir():
        msg = f"--out {args.out} is a directory: give the file to write, e.g. {args.out / 'run.json'}"
        raise SetupError(msg)
    text = json_text(export(store, args.run_id), indent=1) + "\n"
    if to_stdout:
        sys.stdout.write(text)
        return EXIT_DONE
    try:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text, encoding="utf-8")
    except OSError as exc:
        msg = f"cannot write --out {args.out}: {exc}"
        raise SetupError(msg) from None
    print(f"wrote {args.out}", file=sys.stderr)
    return EXIT_DONE
