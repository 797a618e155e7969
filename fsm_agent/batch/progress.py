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
from dataclasses import dataclass
from typing import IO, Any

from fsm_agent.batch.items import BatchItem
from fsm_agent.records import RunResult


@dataclass(frozen=True)
class Counts:
    """One reading of a ``Tally``, every number taken at the same instant.

    The bar draws from one reading, not from the counts one at a time: the
    executor's thread moves them meanwhile, and a line read piecemeal could
    count a run both in flight and finished.
    """

    total: int
    done: int
    failed_by: tuple[tuple[str, int], ...]
    """``(reason, runs)`` for each reason other than ``done`` among the results taken, sorted by reason."""
    in_flight: int

    @property
    def failed(self) -> int:
        """Runs whose result was taken and did not end ``done``."""
        return sum(n for _, n in self.failed_by)

    @property
    def finished(self) -> int:
        """Runs whose result was taken."""
        return self.done + self.failed

    @property
    def waiting(self) -> int:
        """Runs neither in flight nor finished: not begun, back in line, or ended with their result not yet read.

        Back in line: waiting on another owner's lease, or to be sent again
        after its Ray worker died.  A result not yet read is here, never in
        flight: once a run has left its worker, another may take its place.
        """
        return self.total - self.finished - self.in_flight

    def line(self) -> str:
        """``done 40 · failed 3 (error 1, max_steps 2) · in flight 8``: the bar's status."""
        text = f"done {self.done} · failed {self.failed}"
        if self.failed_by:
            text += " (" + ", ".join(f"{reason} {n}" for reason, n in self.failed_by) + ")"
        return text + f" · in flight {self.in_flight}"


class Tally:
    """Runs done, failed by reason, and in flight; safe to update from the executor's thread and the caller's.

    In flight counts the executor's own reports (``start`` as a run is
    handed to a worker, ``end`` as it leaves it), never the caller's reads:
    a caller behind the executor (a busy terminal, a slow ``--out`` disk)
    must not make it look as if more runs went at once than the limit lets.
    Done and failed count the results the caller took (``finish``).
    """

    def __init__(self, total: int) -> None:
        self.total = total
        self.reasons: Counter[str] = Counter()
        self._started = 0
        self._ended = 0
        self._lock = threading.Lock()

    def start(self, item: BatchItem) -> None:
        """A run was handed to a worker: the executor's ``on_start``."""
        with self._lock:
            self._started += 1

    def end(self, item: BatchItem) -> None:
        """A run left its worker: the executor's ``on_end``, called before the caller can take its result."""
        with self._lock:
            self._ended += 1

    def finish(self, result: RunResult) -> None:
        """The caller took a run's result: counted under its reason."""
        with self._lock:
            self.reasons[result.reason] += 1

    def counts(self) -> Counts:
        """Every count as of now, read at one instant."""
        with self._lock:
            failed = tuple(sorted((reason, n) for reason, n in self.reasons.items() if reason != "done"))
            return Counts(self.total, self.reasons["done"], failed, self._started - self._ended)

    @property
    def finished(self) -> int:
        """Runs with a result."""
        return self.counts().finished

    @property
    def in_flight(self) -> int:
        """Runs handed to a worker and not yet back from it."""
        return self.counts().in_flight

    @property
    def all_done(self) -> bool:
        """Whether every run of the batch ended ``done``."""
        return self.counts().done == self.total

    def line(self) -> str:
        """``done 40 · failed 3 (error 1, max_steps 2) · in flight 8``: the bar's status, as of now."""
        return self.counts().line()

    def table(self) -> str:
        """The closing summary: runs per reason, ``done`` first, then by count, and the total."""
        with self._lock:
            reasons = dict(self.reasons)
        rows = sorted(reasons.items(), key=lambda pair: (pair[0] != "done", -pair[1], pair[0]))
        unfinished = self.total - sum(reasons.values())
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
        now = self.tally.counts()
        print(f"{now.finished}/{now.total} runs | {now.line()}", file=self._stream, flush=True)
