"""Fixtures only the batch tests use (the shared ones are in tests/conftest.py)."""

from __future__ import annotations

import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from support.sdk import skip_unless_installed

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent


@pytest.fixture(scope="module")
def cluster() -> Iterator[None]:
    """One small local Ray instance for the module: two CPUs, no dashboard, the tests' modules importable."""
    skip_unless_installed("ray", reason="the ray extra is installed by `make test`")
    import ray

    ray.init(
        address="local",  # not a cluster that happens to run on the machine (RAY_ADDRESS, `ray start`)
        num_cpus=2,
        include_dashboard=False,
        log_to_driver=False,
        logging_level=logging.WARNING,
        runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join([str(TESTS), str(ROOT)])}},
    )
    yield
    ray.shutdown()
