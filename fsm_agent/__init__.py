"""fsm_agent: an LLM tool-calling agent loop as an explicit, drawable state machine.

Every way a run ends is a named, guarded transition into ``Done`` or
``Failed``; a stop reaches the caller as ``AgentLoopError(reason, result)``.
"""

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.snapshot import SnapshotError
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.run import RunView
from fsm_agent.definition.states import STATES, Policy, Reason, State
from fsm_agent.definition.stops import Stop, StopCondition
from fsm_agent.definition.table import TABLE, Row, Table
from fsm_agent.drivers.agent import Agent, AgentRun
from fsm_agent.drivers.model import Model
from fsm_agent.drivers.oneshot import arun, run
from fsm_agent.drivers.session import Session
from fsm_agent.errors import (
    AgentLoopError,
    ContextOverflowError,
    DecisionError,
    DefinitionError,
    FsmAgentError,
    Retry,
    RunExistsError,
    RunLeasedError,
    RunStateError,
    StaleRunError,
)
from fsm_agent.observe.events import CallEvent, JsonlLog, TextDelta, TransitionEvent
from fsm_agent.persist import PostgresStore, SqliteStore, Store, StoredRun
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
from fsm_agent.tools import Tool, ToolRegistry, ToolResult


def __getattr__(name: str) -> str:
    """``__version__``: the installed distribution's version, looked up on first use.

    Read from the package's metadata, so it is the version pip installed and
    cannot drift from ``pyproject.toml``; looked up lazily, so ``import
    fsm_agent`` does not load ``importlib.metadata``.
    """
    if name == "__version__":
        from importlib.metadata import version

        found = globals()["__version__"] = version("fsm-agent")
        return found
    msg = f"module 'fsm_agent' has no attribute {name!r}"
    raise AttributeError(msg)


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
    "FsmAgentError",
    "JsonlLog",
    "Limits",
    "Message",
    "Model",
    "ModelResponse",
    "OutputSchema",
    "Policy",
    "PostgresStore",
    "ProviderData",
    "Reason",
    "Retry",
    "Row",
    "RunExistsError",
    "RunLeasedError",
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
    "Usage",
    "arun",
    "run",
]
