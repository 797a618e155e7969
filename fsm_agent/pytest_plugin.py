"""The pytest hooks of stop-path coverage (``pytest --fsm-coverage``): record the session, write and sum up the report.

pytest loads ``_fsm_agent_pytest`` (the entry point, which imports nothing
of fsm_agent) in every session; it registers :class:`CoveragePlugin` only
when ``--fsm-coverage`` is given.  The recording and the report are
``fsm_agent.testing.coverage``; the drawing is ``fsm_agent.render.dot``.

Under pytest-xdist (``pytest -n``) each worker counts its own runs and hands
its counts to the controller as it finishes (``workeroutput``, the channel
xdist gives plugins); the controller adds them up and writes the one report.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import attrs
import pytest

from fsm_agent.definition.table import TABLE
from fsm_agent.records import Transition
from fsm_agent.render.dot import to_dot, write_picture
from fsm_agent.testing.coverage import Recorder, below, summary, taken_by_index

WORKER_COUNTS = "fsm_coverage_counts"
"""The key of an xdist worker's ``workeroutput`` its rows' counts travel under."""


class CoveragePlugin:
    """Counts the rows every run in the session takes; at its end writes ``path`` and its drawing, and sums up."""

    def __init__(self, path: Path, fail_under: float | None) -> None:
        self.path = path
        self.fail_under = fail_under
        self.recorder = Recorder()
        self.report: dict[str, Any] | None = None
        self.drawing: Path | None = None
        self.failed = False

    def pytest_configure(self, config: pytest.Config) -> None:
        """Start counting before collection, so runs made while importing test modules count too."""
        self.recorder.start()

    def pytest_unconfigure(self, config: pytest.Config) -> None:
        """Stop counting even if the session never finished."""
        self.recorder.stop()

    @pytest.hookimpl(optionalhook=True)
    def pytest_testnodedown(self, node: Any, error: object) -> None:
        """An xdist worker finished: add the rows its runs took to this (the controller's) counts."""
        for source, trigger, dest, guard, reason, taken in node.workeroutput.get(WORKER_COUNTS, ()):
            self.recorder(Transition(source, trigger, dest, guard, reason), taken)

    def pytest_sessionfinish(self, session: pytest.Session) -> None:
        """Write the report and its drawing; fail a passing session whose row coverage is under the threshold.

        An xdist worker writes nothing: it hands its counts to the controller.
        """
        self.recorder.stop()
        workeroutput = getattr(session.config, "workeroutput", None)
        if workeroutput is not None:
            # Plain lists: what crosses to the controller must be what execnet can send.
            workeroutput[WORKER_COUNTS] = [[*attrs.astuple(entry), n] for entry, n in self.recorder.counts.items()]
            return
        self.report = report = self.recorder.report()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.path.write_text(json.dumps(report, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        # Without Graphviz's dot, the DOT text is written instead (same stem, .dot).
        self.drawing = write_picture(to_dot(TABLE, taken=taken_by_index(report)), self.path.with_suffix(".svg"))
        if self.fail_under is not None and below(report, self.fail_under):
            self.failed = True
            if session.exitstatus == pytest.ExitCode.OK:
                session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter: pytest.TerminalReporter) -> None:
        """The session's coverage in one line, where the report went, and the threshold missed if it was."""
        if self.report is None:
            return
        terminalreporter.write_sep("-", "fsm_agent stop-path coverage")
        terminalreporter.write_line(summary(self.report))
        terminalreporter.write_line(f"report: {self.path}; drawing: {self.drawing}")
        if self.failed:
            percent = self.report["totals"]["percent"]
            line = f"FAIL: row coverage {percent}% is under --fsm-coverage-fail-under={self.fail_under:g}"
            terminalreporter.write_line(line, red=True, bold=True)
