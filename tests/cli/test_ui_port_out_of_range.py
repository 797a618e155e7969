"""``ui --port`` outside 0-65535 is a usage error (exit 1) naming the value, before anything is served.

Before, ``int`` let 99999 through and the resolver wrapped it modulo 65536:
the viewer was served on a port nobody asked for.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from fsm_agent import SqliteStore
from fsm_agent.cli.main import main


@pytest.mark.parametrize("port", ["99999", "65536", "-1", "http"])
def test_ui_refuses_a_port_outside_the_tcp_range(
    port: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A port no socket can have: one line naming it, exit 1, and nothing served."""
    uvicorn = pytest.importorskip("uvicorn")
    SqliteStore(str(tmp_path / "runs.db")).close()
    served: list[object] = []
    monkeypatch.setattr(uvicorn.Server, "run", lambda self, sockets=None: served.append(sockets))
    code = main(["ui", "--store", str(tmp_path / "runs.db"), f"--port={port}"])
    assert (code, served) == (1, [])
    err = capsys.readouterr().err
    assert "argument --port: wants a port number, 0 to 65535, got" in err
    assert port in err
    assert err.count("\n") == 1
