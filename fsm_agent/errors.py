"""Exceptions, split by who is at fault.

    FsmAgentError
    ├── DefinitionError (also ValueError)   the transition table is malformed
    ├── RunStateError (also RuntimeError)   a run object was driven wrongly
    └── AgentLoopError (also RuntimeError)  a run stopped; carries reason + result

A programmer's mistake (bad table, bad limits, advancing a finished run) is an
exception about the code; a run that stops is data about the run, handed over
as ``AgentLoopError`` with everything the run produced so far.  Invalid limits
raise a plain ``ValueError`` at construction, as Python users expect.
"""

from __future__ import annotations

from typing import Any

from fsm_agent.records import RunResult


class FsmAgentError(Exception):
    """Base class of every exception this package raises on purpose."""


class DefinitionError(FsmAgentError, ValueError):
    """The transition table breaks a rule; the message names the offending states."""


class RunStateError(FsmAgentError, RuntimeError):
    """A run object was used in a state that does not allow it (e.g. advancing a finished run)."""


class AgentLoopError(FsmAgentError, RuntimeError):
    """A run stopped before a natural finish.

    ``reason`` is the machine-readable stop reason (``str(exc) == reason``),
    ``result`` the partial :class:`RunResult` (messages, steps and trace so
    far) and ``evidence`` a JSON-serialisable dict that explains the stop.
    """

    def __init__(self, reason: str, result: RunResult, evidence: dict[str, Any] | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.result = result
        self.evidence: dict[str, Any] = dict(result.evidence if evidence is None else evidence)
