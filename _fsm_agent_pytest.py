"""fsm_agent's pytest plugin as pytest loads it in every session: its options, and nothing of fsm_agent imported.

pytest imports every installed plugin when it starts, in every session of
anyone who installed fsm_agent, whatever they test.  Importing any module
inside the package imports the package itself (the engine and its drivers),
so the entry point is this module of its own, as Hypothesis's is
(``_hypothesis_pytestplugin``).  It declares the options and, only when
``--fsm-coverage`` is given, loads ``fsm_agent.pytest_plugin``, which
records and reports stop-path coverage.
"""

from __future__ import annotations

import pytest

DEFAULT_REPORT = "fsm-coverage.json"
"""Where ``--fsm-coverage`` without a path writes the report (the drawing beside it, ``.svg``)."""


def pytest_addoption(parser: pytest.Parser) -> None:
    """``--fsm-coverage[=REPORT.json]`` and ``--fsm-coverage-fail-under=PCT``."""
    group = parser.getgroup("fsm-coverage", "fsm_agent stop-path coverage")
    group.addoption(
        "--fsm-coverage",
        nargs="?",
        const=DEFAULT_REPORT,
        default=None,
        metavar="REPORT.json",
        dest="fsm_coverage",
        help=f"count the rows of fsm_agent's table that runs in this session take; write the report "
        f"(default {DEFAULT_REPORT}) and its drawing (.svg) beside it",
    )
    group.addoption(
        "--fsm-coverage-fail-under",
        type=float,
        default=None,
        metavar="PCT",
        dest="fsm_coverage_fail_under",
        help="fail the session if fewer than PCT percent of the table's rows were taken",
    )


def pytest_configure(config: pytest.Config) -> None:
    """Register the recorder when ``--fsm-coverage`` is given; refuse a threshold without it."""
    path = config.getoption("fsm_coverage")
    fail_under = config.getoption("fsm_coverage_fail_under")
    if path is None:
        if fail_under is not None:
            msg = "--fsm-coverage-fail-under needs --fsm-coverage"
            raise pytest.UsageError(msg)
        return
    if not str(path).endswith(".json"):
        # nargs="?" takes the next word: `--fsm-coverage tests/` would make tests/ the report.
        msg = f"--fsm-coverage takes a .json path after '=' (--fsm-coverage=report.json), got {path!r}"
        raise pytest.UsageError(msg)
    if hasattr(config, "workerinput"):
        return  # a pytest-xdist worker: its own process, whose runs the main session cannot count anyway
    from fsm_agent.pytest_plugin import CoveragePlugin

    config.pluginmanager.register(CoveragePlugin(config.invocation_params.dir / path, fail_under), "fsm-coverage")
