"""fsm_agent: an LLM tool-calling agent loop as an explicit, drawable state machine.

Every way a run ends is a named, guarded transition into ``Done`` or
``Failed``; a stop reaches the caller as ``AgentLoopError(reason, result)``.
"""

from fsm_agent.cancellation import CancelToken
from fsm_agent.engine import Agent, AgentRun, Model, arun, run
from fsm_agent.errors import AgentLoopError, DefinitionError, FsmAgentError, RunStateError
from fsm_agent.events import CallEvent, JsonlLog, TransitionEvent
from fsm_agent.limits import Limits
from fsm_agent.records import Message, ModelResponse, RunResult, Step, ToolCall, Transition, Usage
from fsm_agent.run import RunView
from fsm_agent.snapshot import SnapshotError
from fsm_agent.states import STATES, State
from fsm_agent.stops import StopCondition
from fsm_agent.store import SqliteStore, Store, StoredRun
from fsm_agent.table import TABLE, Row, Table
from fsm_agent.tools import Tool, ToolRegistry, ToolResult

__all__ = [
    "STATES",
    "TABLE",
    "Agent",
    "AgentLoopError",
    "AgentRun",
    "CallEvent",
    "CancelToken",
    "DefinitionError",
    "FsmAgentError",
    "JsonlLog",
    "Limits",
    "Message",
    "Model",
    "ModelResponse",
    "Row",
    "RunResult",
    "RunStateError",
    "RunView",
    "SnapshotError",
    "SqliteStore",
    "State",
    "Step",
    "StopCondition",
    "Store",
    "StoredRun",
    "Table",
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
