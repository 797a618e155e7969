"""What a batch has done so far, as counts, as one status line, as a live bar and as a closing table.

The counts and the text are plain data and pure functions (tested as text);
only ``Bar`` touches a terminal, through ``tqdm``, which measures the rate
and the time left.
"""

from __future__ import annotations

import sys
import threading
import time
from collections import Counter
from typing import IO, Any

from fsm_agent.batch.items import BatchItem
from fsm_agent.records import RunResult


class Tally:
    """Runs done, failed by reason, and in flight; safe to update from the executor's thread and the caller's."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.reasons: Counter[str] = Counter()
        self._started = 0
        self._ended = 0
        self._lock = threading.Lock()

    def start(self, item: BatchItem) -> None:
        """A run began (or was handed to a worker)."""
        with self._lock:
            self._started += 1

    def finish(self, result: RunResult) -> None:
        """A run ended with ``result``; one that never began is counted, but was never in flight."""
        with self._lock:
            self.reasons[result.reason] += 1
            if result.evidence.get("started") is not False:
                self._ended += 1

    @property
    def finished(self) -> int:
        """Runs with a result."""
        return sum(self.reasons.values())

    @property
    def in_flight(self) -> int:
        """Runs begun and not yet ended."""
        return self._started - self._ended

    @property
    def all_done(self) -> bool:
        """Whether every run of the batch ended ``done``."""
        return self.reasons["done"] == self.total

    def line(self) -> str:
        """``done 40 · failed 3 (max_steps 2, error 1) · in flight 8``: the bar's status."""
        failed = {reason: n for reason, n in sorted(self.reasons.items()) if reason != "done"}
        text = f"done {self.reasons['done']} · failed {sum(failed.values())}"
        if failed:
            text += " (" + ", ".join(f"{reason} {n}" for reason, n in failed.items()) + ")"
        return text + f" · in flight {self.in_flight}"

    def table(self) -> str:
        """The closing summary: runs per reason, ``done`` first, then by count, and the total."""
        rows = sorted(self.reasons.items(), key=lambda pair: (pair[0] != "done", -pair[1], pair[0]))
        unfinished = self.total - self.finished
        if unfinished:
            rows.append(("not run", unfinished))
        width = max([len("reason"), *(len(reason) for reason, _ in rows)])
        lines = [f"{'reason':<{width}}  {'runs':>6}"]
        lines += [f"{reason:<{width}}  {n:>6}" for reason, n in rows]
        lines.append(f"{'total':<{width}}  {self.total:>6}")
        return "\n".join(lines)


class Bar:
    """A live progress bar on ``stream`` (stderr by default): runs finished of the total, the tally, rate and ETA.

    Without ``tqdm`` installed (it comes with the ``ray`` extra), the same
    line is printed plainly, at most once a second.
    """

    def __init__(self, tally: Tally, stream: IO[str] | None = None) -> None:
        self.tally = tally
        self._stream = stream or sys.stderr
        self._shown = 0.0
        try:
            from tqdm import tqdm  # optional: only a batch that shows progress needs it
        except ImportError:
            self._bar: Any = None
            return
        self._bar = tqdm(
            total=tally.total,
            unit="run",
            file=self._stream,
            dynamic_ncols=True,
            mininterval=0.25,
            smoothing=0.1,
            # The tally goes in as the description: tqdm would put ", " before a postfix.
            bar_format="{n_fmt}/{total_fmt} runs |{bar:20}| {desc} [{elapsed}<{remaining}, {rate_fmt}]",
        )
        self._bar.set_description_str(tally.line(), refresh=False)

    def say(self, text: str) -> None:
        """Print a line above the bar (what the batch is doing while it starts), leaving the bar drawn below it."""
        if self._bar is None:
            print(text, file=self._stream, flush=True)
        else:
            self._bar.write(text, file=self._stream)

    def update(self, result: RunResult) -> None:
        """Count one finished run and redraw (at most a few times a second)."""
        self.tally.finish(result)
        if self._bar is None:
            if time.monotonic() - self._shown >= 1.0:
                self._plain()
            return
        self._bar.set_description_str(self.tally.line(), refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        """Draw the final line and leave it on the terminal."""
        if self._bar is None:
            self._plain()
            return
        self._bar.set_description_str(self.tally.line(), refresh=False)
        self._bar.close()

    def _plain(self) -> None:
        self._shown = time.monotonic()
        print(f"{self.tally.finished}/{self.tally.total} runs | {self.tally.line()}", file=self._stream, flush=True)
