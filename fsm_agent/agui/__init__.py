"""An agent behind the AG-UI protocol: ``app(agent_factory)`` is an ASGI app any AG-UI client can run turns on.

``pip install 'fsm-agent[agui]'`` for ``ag-ui-protocol``, Starlette and
uvicorn.  ``POST /`` takes AG-UI's ``RunAgentInput`` and answers with
server-sent events: the run's states as steps, its text as it streams, its
tool calls and their results, sub-agents, the counters as state, and one
terminal event saying how the turn ended (``docs/how-to/ag-ui.md`` has the
whole mapping).  AG-UI threads are ``fsm_agent.Session``s in a store.  Never
imported by ``import fsm_agent``.
"""

try:
    import ag_ui.core  # noqa: F401 - the extra's first import, so its absence says which extra to install
    import starlette  # noqa: F401
except ImportError as exc:  # pragma: no cover - exercised only without the extra
    msg = "fsm_agent.agui needs ag-ui-protocol and Starlette: pip install 'fsm-agent[agui]'"
    raise ImportError(msg) from exc

from fsm_agent.agui.server import AgentFactory, AgUiApp, DepsFactory, app

__all__ = ["AgUiApp", "AgentFactory", "DepsFactory", "app"]
