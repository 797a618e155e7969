"""The run viewer: a local web app that lists the runs of a store and replays any of them over the machine.

``python -m fsm_agent ui --store runs.db`` serves it (``pip install
'fsm-agent[ui]'`` for Starlette and uvicorn); :func:`create_app` builds the
ASGI app over any store with ``load``, ``decide`` and ``list_runs`` (paged by
cursor, ``order`` and ``after``, as ``FullStore`` declares it).  No
front-end build step and nothing from a CDN: the page is the static files in
``static/``, shipped in the package.  Never imported on the run path.
"""

from fsm_agent.ui.app import LOOPBACK, create_app
from fsm_agent.ui.replay import digest, moments

__all__ = ["LOOPBACK", "create_app", "digest", "moments"]
