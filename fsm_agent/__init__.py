"""fsm_agent: an LLM tool-calling agent loop as an explicit, drawable state machine.

Every way a run ends is a named, guarded transition into ``Done`` or
``Failed``; a stop reaches the caller as ``AgentLoopError(reason, result)``.
"""

import typing

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.pricing import Price, UnpricedModelError
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.states import STATES, Policy, Reason, State
from fsm_agent.definition.stops import Stop, StopCondition
from fsm_agent.definition.table import TABLE, Row, Table
from fsm_agent.definition.views import RunView
from fsm_agent.drivers.agent import Agent
from fsm_agent.drivers.agent_run import AgentRun
from fsm_agent.drivers.fork_edit import ForkEdit
from fsm_agent.drivers.model import Model
from fsm_agent.drivers.oneshot import arun, run
from fsm_agent.drivers.session import Session
from fsm_agent.errors import (
    AgentLoopError,
    ContextOverflowError,
    DecisionError,
    DefinitionError,
    ForkError,
    FsmAgentError,
    Retry,
    RunExistsError,
    RunLeasedError,
    RunNotFoundError,
    RunStateError,
    SnapshotError,
    StaleRunError,
    TurnLeasedError,
    TurnTakenError,
)
from fsm_agent.observe.events import CallEvent, JsonlLog, TextDelta, TransitionEvent
from fsm_agent.records import (
    ChildOutcome,
    Message,
    ModelResponse,
    OutputSchema,
    ProviderData,
    RunResult,
    Step,
    ToolCall,
    Transition,
    Usage,
)
from fsm_agent.tools import NoDepsError, RunContext, Tool, ToolRegistry, ToolResult, run_context

if typing.TYPE_CHECKING:
    from fsm_agent.persist import PostgresStore, SqliteStore, Store, StoredRun
    from fsm_agent.proof import Proof, check

_STORES = frozenset({"PostgresStore", "SqliteStore", "Store", "StoredRun"})
"""Public names imported from ``fsm_agent.persist`` on first use (``__getattr__``)."""
_PROOFS = frozenset({"Proof", "check"})
"""Public names imported from ``fsm_agent.proof`` on first use: the checker reads agents, runs never need it."""


def __getattr__(name: str) -> typing.Any:
    """The stores' names, the checker's and ``__version__``, imported or looked up on first use.

    ``import fsm_agent`` loads neither the stores' modules (``sqlite3``, the
    SQL plans) nor ``importlib.metadata``: most programs run agents without
    a store, and ``make bench`` holds the import to a few times a bare
    interpreter's start.  ``from fsm_agent import SqliteStore`` works as
    before.  The version is read from the package's metadata, so it is the
    version pip installed and cannot drift from ``pyproject.toml`` (see ``_version``).
    """
    if name in _STORES:
        from fsm_agent import persist

        found: typing.Any = getattr(persist, name)
    elif name in _PROOFS:
        from fsm_agent import proof

        found = getattr(proof, name)
    elif name == "__version__":
        found = _version()
    else:
        msg = f"module 'fsm_agent' has no attribute {name!r}"
        raise AttributeError(msg)
    globals()[name] = found
    return found


def _version() -> str:
    """The installed distribution's version; for a source tree never installed, its ``pyproject.toml``'s."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("fsm-agent")
    except PackageNotFoundError:
        import tomllib
        from pathlib import Path

        pyproject = Path(__file__).resolve().parent.parent / "pyproject.toml"
        try:
            return str(tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]["version"])
        except (OSError, KeyError, tomllib.TOMLDecodeError):
            return "0+unknown"  # neither installed nor beside its pyproject.toml: a copy of the package alone


def __dir__() -> list[str]:
    """The module's names, the stores' among them before their first use (``dir(fsm_agent)``, completion)."""
    return sorted({*globals(), *_STORES, *_PROOFS})


__all__ = [
    "STATES",
    "TABLE",
    "Agent",
    "AgentLoopError",
    "AgentRun",
    "CallEvent",
    "CancelToken",
    "ChildOutcome",
    "ContextOverflowError",
    "DecisionError",
    "DefinitionError",
    "ForkEdit",
    "ForkError",
    "FsmAgentError",
    "JsonlLog",
    "Limits",
    "Message",
    "Model",
    "ModelResponse",
    "NoDepsError",
    "OutputSchema",
    "Policy",
    "PostgresStore",
    "Price",
    "Proof",
    "ProviderData",
    "Reason",
    "Retry",
    "Row",
    "RunContext",
    "RunExistsError",
    "RunLeasedError",
    "RunNotFoundError",
    "RunResult",
    "RunStateError",
    "RunView",
    "Session",
    "SnapshotError",
    "SqliteStore",
    "StaleRunError",
    "State",
    "Step",
    "Stop",
    "StopCondition",
    "Store",
    "StoredRun",
    "Table",
    "TextDelta",
    "Tool",
    "ToolCall",
    "ToolRegistry",
    "ToolResult",
    "Transition",
    "TransitionEvent",
    "TurnLeasedError",
    "TurnTakenError",
    "UnpricedModelError",
    "Usage",
    "arun",
    "check",
    "run",
    "run_context",
]
