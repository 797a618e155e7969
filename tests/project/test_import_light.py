"""``import fsm_agent`` stays light: the stores' modules load on first use, and every public name still imports."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import fsm_agent
import fsm_agent.persist

STORE_MODULES = ("fsm_agent.persist", "sqlite3", "psycopg", "hashlib")
ASYNC_MODULES = ("asyncio", "concurrent.futures", "ssl", "socket")
"""What ``asyncio`` brings: most of the cost of the import, for programs that never await."""


def _loaded_after(code: str, modules: tuple[str, ...] = STORE_MODULES) -> list[str]:
    """The modules of ``modules`` (and their submodules) a fresh interpreter has loaded after running ``code``."""
    probe = f"{code}\nimport json, sys\nprint(json.dumps(sorted(m for m in sys.modules if m.startswith({modules!r}))))"
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout
    loaded: list[str] = json.loads(out)
    return loaded


@pytest.mark.subprocess
def test_importing_the_package_loads_no_store_module() -> None:
    """Neither the stores (``sqlite3``, the SQL plans) nor ``hashlib`` are loaded by ``import fsm_agent``."""
    assert _loaded_after("import fsm_agent") == []


@pytest.mark.subprocess
def test_importing_the_package_loads_no_asyncio() -> None:
    """``import fsm_agent`` loads neither ``asyncio`` nor what it brings (``ssl``, sockets, ``concurrent.futures``)."""
    assert _loaded_after("import fsm_agent", ASYNC_MODULES) == []


@pytest.mark.subprocess
def test_importing_the_package_loads_no_logging() -> None:
    """``logging`` (with ``traceback`` and ``textwrap``) is not loaded by the import; a raising hook is still logged."""
    assert _loaded_after("import fsm_agent", ("logging", "traceback", "textwrap")) == []
    raising = (
        "import logging, fsm_agent\nfrom fsm_agent.testing import FakeModel, reply\n"
        "told = []\n"
        "class Keep(logging.Handler):\n"
        "    def emit(self, record): told.append(record.getMessage())\n"
        "logging.getLogger('fsm_agent').addHandler(Keep())\n"
        "agent = fsm_agent.Agent(FakeModel(reply('hi')), fsm_agent.ToolRegistry())\n"
        "agent.on('transition', lambda event: 1 / 0)\n"
        "assert agent.run('go').final == 'hi'\n"
        "assert told and told[0].startswith(\"fsm_agent hook 'transition'\"), told"
    )
    assert _loaded_after(raising, ("logging",)) == ["logging"]


@pytest.mark.subprocess
def test_a_sync_run_whose_tools_fail_or_have_a_deadline_loads_no_asyncio() -> None:
    """The sync driver, a tool that raises and one under ``tool_timeout`` never import ``asyncio``."""
    code = (
        "from fsm_agent import Agent, ToolRegistry\n"
        "from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn\n"
        "tools = ToolRegistry()\n"
        "def boom() -> int:\n"
        "    raise ValueError('no')\n"
        "tools.register(boom)\n"
        "for timeout in (None, 5.0):\n"
        "    model = FakeModel(tool_turn(tool_call('boom')), reply('done'))\n"
        "    result = Agent(model, tools, tool_timeout=timeout).run('go')\n"
        "    assert 'raised ValueError: no' in result.messages[2].content, result.messages\n"
    )
    assert _loaded_after(code, ASYNC_MODULES) == []


@pytest.mark.subprocess
def test_a_run_without_a_store_loads_no_store_module_on_either_driver() -> None:
    """``run`` and ``arun`` with no ``store=`` never import the stores."""
    code = (
        "import asyncio\n"
        "from fsm_agent import Agent, ToolRegistry\n"
        "from fsm_agent.testing import FakeModel, reply\n"
        "assert Agent(FakeModel(reply('hi')), ToolRegistry()).run('x').final == 'hi'\n"
        "assert asyncio.run(Agent(FakeModel(reply('hi')), ToolRegistry()).arun('x')).final == 'hi'\n"
    )
    assert _loaded_after(code) == []


def test_the_stores_names_import_from_the_package_as_before() -> None:
    """``from fsm_agent import SqliteStore`` (and the other three) gives the stores' own classes, listed by ``dir``."""
    from fsm_agent import PostgresStore, SqliteStore, Store, StoredRun

    assert (SqliteStore, PostgresStore, Store, StoredRun) == (
        fsm_agent.persist.SqliteStore,
        fsm_agent.persist.PostgresStore,
        fsm_agent.persist.Store,
        fsm_agent.persist.StoredRun,
    )
    assert {"PostgresStore", "SqliteStore", "Store", "StoredRun"} <= set(dir(fsm_agent))


@pytest.mark.subprocess
def test_every_name_of_all_imports_in_a_fresh_interpreter() -> None:
    """``from fsm_agent import *`` binds every name of ``__all__``, the lazy ones included."""
    code = "from fsm_agent import *\nimport fsm_agent\nprint(all(n in globals() for n in fsm_agent.__all__))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "True"


def test_an_unknown_name_is_still_an_attribute_error() -> None:
    """The lazy ``__getattr__`` answers only for its own names."""
    with pytest.raises(AttributeError, match="NoSuchThing"):
        fsm_agent.NoSuchThing  # type: ignore[attr-defined]  # noqa: B018


SDKS = ("openai", "anthropic", "google.genai", "mcp", "ray", "opentelemetry.sdk", "playwright.sync_api")
"""The provider SDKs and the browser driver, which a test imports only where it uses them (``support.sdk``); a bare
namespace parent (``opentelemetry``) may load, as ``skip_unless_installed`` looks a module up."""


@pytest.mark.subprocess
def test_loading_every_test_module_imports_no_provider_sdk() -> None:
    """Collecting the suite imports no provider SDK: each ``make test-quick`` worker collects the whole suite.

    Every test module and ``conftest.py`` is loaded as pytest's importlib mode loads it (by path, under a name of
    its own: ``tests/mcp`` must not shadow the ``mcp`` package), with the suite's ``pythonpath``.
    """
    tests = Path(__file__).resolve().parents[1]
    code = (
        "import importlib.util, pathlib, sys\n"
        f"tests = pathlib.Path({str(tests)!r})\n"
        "sys.path[:0] = [str(tests.parent), str(tests)]\n"
        "files = sorted(tests.rglob('conftest.py')) + sorted(tests.rglob('test_*.py'))\n"
        "for n, path in enumerate(files):\n"
        "    spec = importlib.util.spec_from_file_location(f'collected_{n}', path)\n"
        "    module = importlib.util.module_from_spec(spec)\n"
        "    sys.modules[spec.name] = module\n"
        "    spec.loader.exec_module(module)\n"
        "print(len(files))\n"
        "import json\n"
        "print(json.dumps(sorted(sys.modules)))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tests.parent)
    loaded_files, loaded = done.stdout.splitlines()
    assert int(loaded_files) > 300
    assert [m for m in json.loads(loaded) if m in SDKS or m.startswith(tuple(f"{sdk}." for sdk in SDKS))] == []
