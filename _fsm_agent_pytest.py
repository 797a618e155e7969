"""fsm_agent's pytest plugin as pytest loads it in every session: options and a fixture, no fsm_agent import.

pytest imports every installed plugin when it starts, in every session of
anyone who installed fsm_agent, whatever they test.  Importing any module
inside the package imports the package itself (the engine and its drivers),
so the entry point is this module of its own, as Hypothesis's is
(``_hypothesis_pytestplugin``).  It declares the options and, only when
``--fsm-coverage`` is given, loads ``fsm_agent.pytest_plugin``, which
records and reports stop-path coverage.  The ``fsm_recording`` fixture
imports fsm_agent only in the tests that ask for it.
"""

from __future__ import annotations

from typing import Any

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


RECORDINGS = "recordings"
"""The folder beside a test file that ``fsm_recording`` reads recordings from."""


@pytest.fixture
def fsm_recording(request: pytest.FixtureRequest) -> Any:
    """The recording ``recordings/NAME.json`` beside the test file, to replay an agent against it.

    NAME is the test function's name, or the one given with
    ``@pytest.mark.fsm_recording("NAME")``.  The fixture is a
    ``fsm_agent.testing.replay.RecordingFile``: ``fsm_recording(agent)``
    replays the recording and returns the run's result, or raises
    ``ReplayDivergence`` where the agent departs from it.
    """
    from fsm_agent.testing.replay import RecordingFile

    marker = request.node.get_closest_marker("fsm_recording")
    name = marker.args[0] if marker is not None and marker.args else request.node.originalname
    return RecordingFile(request.path.parent / RECORDINGS / f"{name}.json")


def pytest_configure(config: pytest.Config) -> None:
    """Declare the ``fsm_recording`` marker; register the recorder when ``--fsm-coverage`` is given."""
    config.addinivalue_line(
        "markers", f"fsm_recording(name): the recording {RECORDINGS}/<name>.json that the fsm_recording fixture reads"
    )
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
    from fsm_agent.pytest_plugin import CoveragePlugin

    config.pluginmanager.register(CoveragePlugin(config.invocation_params.dir / path, fail_under), "fsm-coverage")
