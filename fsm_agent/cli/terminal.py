"""What a run shows on the terminal while it goes: a live status line, streamed text, escaped model output."""

from __future__ import annotations

import re
from typing import IO

from fsm_agent import AgentRun, RunResult, TextDelta, Transition
from fsm_agent.cli import EXIT_STOPPED

_STATUS_DETAIL_CHARS = 100

# C0 controls but newline and tab, DEL and C1: what a terminal may act on rather than show; and lone
# surrogates (half an emoji), which no terminal encoding can write.
# C0 and C1 controls, lone surrogates, and the bidi controls that would reorder the rest of a line (a run id
# holding a right-to-left override would flip every column after it).
_CONTROL = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\ud800-\udfff\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def printable(text: str) -> str:
    """``text`` safe to print to a terminal: control characters become visible escapes (ESC is ``\\x1b``).

    Model text is untrusted: an escape sequence in a reply could move the
    cursor, rewrite earlier output or retitle the terminal.  Newlines and tabs
    stay, so an answer keeps its layout; ``--trace`` keeps the exact text.
    """
    return _CONTROL.sub(lambda match: _escape(ord(match[0])), text)


def one_field(text: str) -> str:
    """``text`` as one column of a tab-separated line (``runs list``): ``printable``, its tabs and newlines escaped too.

    A run id may hold them (no store refuses them), and a script reading the
    listing by lines and tabs would split the id.
    """
    return printable(text).replace("\t", "\\t").replace("\n", "\\n")


def _escape(code: int) -> str:
    return f"\\x{code:02x}" if code < 0x100 else f"\\u{code:04x}"


class Status:
    """The live line on stderr: overwritten in place on a terminal, one line per transition otherwise."""

    def __init__(self, stream: IO[str], enabled: bool) -> None:
        self.stream = stream
        self.enabled = enabled
        self.tty = enabled and stream.isatty()

    @staticmethod
    def counters(run: AgentRun) -> str:
        """Every counter the stop guards read, ``used/limit`` (no limit: just ``used``), from ``run.counters()``."""
        parts = []
        for name, (used, limit) in run.counters().items():
            # Seconds to a tenth; dollars to a millionth, or a call priced per million tokens shows as nothing.
            shown = (f"{used:.6f}" if name == "cost" else f"{used:.1f}") if isinstance(used, float) else str(used)
            if name == "cost" and run.run_context().usage.cost is None:
                shown = "unknown"  # a call nothing prices: not free
            parts.append(f"{name} {shown}" + ("" if limit is None else f"/{limit:g}"))
        return "  ".join(parts)

    def before(self, run: AgentRun) -> None:
        """Show the state whose work (model call, tool call) is about to happen."""
        if self.tty:
            self.stream.write(f"\r\x1b[K{run.state:<15} {self.counters(run)}")
            self.stream.flush()

    def after(self, run: AgentRun, edge: Transition) -> None:
        """Report the edge just taken, on its own line when the stream is not a terminal."""
        if not self.enabled or self.tty:
            return
        label = edge.reason or edge.guard
        line = f"{edge.source} -> {edge.dest}" + (f" [{label}]" if label else "")
        if edge.source == "ExecuteTool" and run.steps:
            detail = printable(run.steps[-1].detail)
            line += f"  {detail[:_STATUS_DETAIL_CHARS]}" + ("..." if len(detail) > _STATUS_DETAIL_CHARS else "")
        print(f"{line}  ({self.counters(run)})", file=self.stream)

    def clear(self) -> None:
        """Take the live line off the terminal, so streamed text starts on a clean line."""
        if self.tty:
            self.stream.write("\r\x1b[K")
            self.stream.flush()

    def end(self, run: AgentRun) -> None:
        """Leave the final counters on the terminal."""
        if self.tty:
            self.stream.write(f"\r\x1b[K{run.state:<15} {self.counters(run)}\n")
            self.stream.flush()


class TextPrinter:
    """Prints a model's text to stdout as it streams in (escaped like the answer), one line per model turn."""

    def __init__(self, out: IO[str], status: Status) -> None:
        self.out = out
        self.status = status
        self.turn: list[str] = []
        self.last = ""
        """The text of the last model turn, whole: once it is the answer, the answer was already shown."""

    def __call__(self, delta: TextDelta) -> None:
        if not self.turn:
            self.status.clear()
        self.turn.append(delta.text)
        self.out.write(printable(delta.text))
        self.out.flush()

    def end_turn(self) -> None:
        """Close the line of the turn whose reply just came in."""
        self.last = "".join(self.turn)
        if self.turn:
            self.out.write("\n")
            self.out.flush()
        self.turn = []


def drive(run: AgentRun, status: Status, printer: TextPrinter | None = None) -> RunResult | None:
    """Advance the run to ``Done`` or ``Failed``, updating the status around every transition; its result.

    A run that pauses for approval stops there (advancing it would raise):
    ``None``, and :func:`report_pause` says on what it waits.
    """
    if printer is not None:
        run.on_text(printer)
    while not (run.done or run.paused):
        status.before(run)
        edge = run.advance()
        if printer is not None and edge.source == "AwaitModel":
            printer.end_turn()
        status.after(run, edge)
    status.end(run)
    return None if run.paused else run.result


def report_pause(run: AgentRun, err: IO[str], how: str, *, held: bool = False) -> int:
    """Name on ``err`` the calls the paused ``run`` waits on and ``how`` to decide on them; exit 2, a stop.

    ``held``: it was paused already when the command took it up.
    """
    waiting = ", ".join(f"{call.name} ({call.id})" for call in run.awaiting())
    now = "still paused" if held else "paused"
    print(printable(f"{now}, waiting for decisions on: {waiting} ({how})"), file=err)
    return EXIT_STOPPED
