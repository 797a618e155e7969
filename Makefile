# Every target sets up .venv on first use, so a fresh clone needs only `make demo` / `make test`.
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: help install demo test test-load test-quick dist lint bench diagram docs docs-serve fuzz clean

help:  ## list the targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | sed -E 's/:.*## /\t/' | expand -t 12

$(STAMP): pyproject.toml
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "fsm_agent needs Python 3.11+, found " + sys.version.split()[0])'
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install --quiet --disable-pip-version-check -e '.[dev,openai,anthropic,gemini,postgres,mcp,otel,output,prices,ui,agui,ray,docs]'
	@touch $(STAMP)

install: $(STAMP)  ## create .venv with the package (editable) and every extra; the command is .venv/bin/fsm-agent

demo: $(STAMP)  ## run the scripted demonstration: four stops and a natural finish; pictures in diagrams/runs/
	$(PY) -m fsm_agent demo --out diagrams/runs

# The suite's stop-path coverage goes to build/ (ignored by git); `make docs` shows it on docs/how-to/stop-coverage.md.
# --durations: the 30 slowest tests are printed, so a CI run says where its time went (CI is kept under 25 minutes).
# -n: pytest-xdist's workers, each test file on one of them (--dist loadfile: a file's fixtures, such as its Ray
# instance, are made once).  Two on two cores: most tests wait on a server, a lease or a child process, so one
# process kept the machine at a load of about 1.
WORKERS ?= 2
# The test runs write bytecode caches (__pycache__, ignored by git) even where the environment says not to: without
# them each run compiles the package and rewrites the asserts of every test module again, 6 of a quick run's seconds.
PYTEST = env -u PYTHONDONTWRITEBYTECODE $(PY) -m pytest
test: $(STAMP)  ## run the whole test suite (about 16 minutes on 2 cores: PostgreSQL, Chromium, Ray, a wheel install)
	$(PYTEST) -q -n $(WORKERS) --dist loadfile --durations=30 --fsm-coverage=build/fsm-coverage/report.json

# .ci/under-load starts the hogs, always stops them (however the suite ends), and prints how long it took.
test-load: $(STAMP)  ## the same suite with two CPU hogs beside it, as on a busy CI machine; prints how long it took
	.ci/under-load $(MAKE) --no-print-directory test

# Left out: every test marked `system` (it starts PostgreSQL, headless Chromium, Ray or a process: the command line,
# mkdocs, node, a wheel build, a child it kills) and every one marked `slow` (it waits or searches for half a second
# or more by design: see docs/contributing/testing.md).  The Hypothesis tests search a quarter of CI's examples
# (FSM_AGENT_HYPOTHESIS=quick); --durations shows any test that has grown slow unmarked.  --dist worksteal: no test
# left here shares a costly fixture across its file, so an idle worker takes the other's queued tests.
# QUICK_WORKERS: three on two cores.  The quick tests' workers are busy only about two thirds of the time (measured:
# 252 s of tests took 163 s of CPU; the rest waits on threads, stores and short leases), so a third worker fills
# those waits: 2 min 23 s on two workers, 1 min 52 s on three, 1 min 45 s on four (where one race test, since fixed,
# showed a load two workers never made).
QUICK_WORKERS ?= 3
test-quick: $(STAMP)  ## the suite without the tests that start a real component or are slow: for while you work
	FSM_AGENT_HYPOTHESIS=quick $(PYTEST) -q -n $(QUICK_WORKERS) --dist worksteal --durations=10 -m "not system and not slow"

dist: $(STAMP)  ## build the sdist and the wheel into dist/ (install one: pip install --find-links dist fsm-agent)
	rm -rf dist
	$(PY) -m build --outdir dist .

lint: $(STAMP)  ## ruff (check and format) on the package, tests and benchmarks; mypy --strict on the package
	$(PY) -m ruff check fsm_agent tests benchmarks _fsm_agent_pytest.py
	$(PY) -m ruff format --check fsm_agent tests benchmarks _fsm_agent_pytest.py
	$(PY) -m mypy

diagram: $(STAMP)  ## prove the table stops, draw the machine: diagrams/agent_loop.*, the rendered blocks of README.md and docs/
	$(PY) -m fsm_agent check fsm_agent:TABLE
	$(PY) -m fsm_agent diagram --update-readme README.md --update-docs docs

# Never --quiet: it drops warnings before --strict counts them.  NO_MKDOCS_2_WARNING silences Material's
# end-of-life banner, which is printed on every run and is no warning of the build.
docs: $(STAMP)  ## build the documentation site into site/, failing on any warning
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict --site-dir site

docs-serve: $(STAMP)  ## serve the documentation site with live reload on http://127.0.0.1:8000/
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs serve

bench: $(STAMP)  ## engine vs a plain loop; async driver; per-step cost at 64-4096 turns; batches; stores; lease takeover; import time; instructions per run
	@# Every benchmark runs even when one misses its target; the exit status says whether any did.
	@rm -f .bench_results.jsonl; status=0; for b in engine async scaling batch store lease import instructions; do \
		$(PY) -m benchmarks.bench_$$b || status=1; done; $(PY) -m benchmarks.targets || status=1; exit $$status

fuzz: $(STAMP)  ## property, differential and stateful tests, 4000 examples each; 40 mid-batch kills per driver and store
	FSM_AGENT_HYPOTHESIS=fuzz $(PY) -m pytest -q tests/core/test_properties.py tests/core/test_differential.py \
		tests/core/test_stateful.py tests/persist/test_shared_runs_stateful.py tests/batch/test_batch_kills.py

clean:  ## remove the virtual environment and caches
	rm -rf $(VENV) dist build .pytest_cache .mypy_cache .ruff_cache .hypothesis *.egg-info
