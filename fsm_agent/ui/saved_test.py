"""A stored run saved as a test: its recording and a pytest file that replays it, in one zip.

The zip holds ``test_<name>.py`` and ``recordings/test_<name>.json`` (the
run's recording, ``store.export``), laid out as the ``fsm_recording``
fixture reads them: unpacked into a tests folder, ``pytest`` replays the
agent against the recording and fails where it departs.  The test imports
the agent from the viewer's ``--agent MODULE:FUNCTION``; without one it
holds a function marked ``FILL IN`` to return the agent.  The run's id and
outcome enter the file only as Python string literals (``repr``), so no
stored text can become code.
"""

from __future__ import annotations

import io
import re
import zipfile
from typing import Any

from fsm_agent.jsontext import dumps as json_text

_MODULE = re.compile(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*")
_NAME = re.compile(r"[A-Za-z_]\w*")


def slug(run_id: str) -> str:
    """A run id as part of a Python test name: lower-case letters, digits and underscores, at most 40 of them."""
    text = re.sub(r"[^a-z0-9]+", "_", run_id.lower()).strip("_")[:40].strip("_")
    return text or "run"


def agent_import(spec: str | None) -> tuple[str, str] | None:
    """``(module, function)`` of a ``MODULE:FUNCTION`` spec that can be written as an import; None if not."""
    module, _, function = (spec or "").partition(":")
    if _MODULE.fullmatch(module) and _NAME.fullmatch(function):
        return module, function
    return None


def replay_test_text(run_id: str, name: str, data: dict[str, Any], agent: str | None) -> str:
    """The pytest file replaying the recording ``recordings/<name>.json`` with the agent of ``agent``, if given."""
    found = agent_import(agent)
    if found is None:
        header = "from fsm_agent import Agent\n"
        maker = (
            "\n\ndef make_agent() -> Agent:\n"
            '    """The agent that made the run (its model is replaced by the recording)."""\n'
            "    # FILL IN: return the agent that made this run, with the same tools, prompt and limits.\n"
            '    raise NotImplementedError("fill in make_agent() with the agent that made run " + RUN_ID)\n'
        )
        call = "make_agent()"
    else:
        module, function = found
        header = f"from {module} import {function}  # the agent of --agent {module}:{function}\n"
        maker, call = "", f"{function}()"
    return (
        '"""A run saved from the fsm_agent run viewer, replayed: the agent must take the recorded path again."""\n\n'
        "import pytest\n\n"
        f"{header}\n"
        f"RUN_ID = {run_id!r}\n"
        f"{maker}\n\n"
        f"@pytest.mark.fsm_recording({name!r})\n"
        f"def {name}(fsm_recording) -> None:\n"
        '    """Replayed against its recording, the agent takes the stored run\'s path and ends as it did."""\n'
        f"    result = fsm_recording({call})\n"
        f"    assert result.reason == {'paused' if data.get('paused') else data.get('reason')!r}\n"
        f"    assert result.final == {data.get('final') or ''!r}\n"
    )


def zipped(run_id: str, data: dict[str, Any], recording: dict[str, Any], agent: str | None) -> tuple[str, bytes]:
    """The zip's file name and bytes: the test file and the recording beside it, under ``recordings/``."""
    name = f"test_{slug(run_id)}"
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_DEFLATED) as archive:
        archive.writestr(f"{name}.py", replay_test_text(run_id, name, data, agent))
        archive.writestr(f"recordings/{name}.json", json_text(recording, indent=1) + "\n")
    return f"{name}.zip", buffer.getvalue()
