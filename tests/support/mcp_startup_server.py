"""MCP servers that go wrong while starting: ``python mcp_startup_server.py MODE STATE_DIR``.

Each writes its pid to ``STATE_DIR/pid`` first (so a test can check the
process is gone) and counts what it was asked in ``STATE_DIR/asked.json``.
``silent`` reads stdin and never answers (it ends only when stdin closes);
``deaf`` never reads stdin and sleeps until it is signalled; ``unlisted``
answers ``initialize`` but never ``tools/list``; ``dies`` reads the
``initialize`` request and exits with code 5 and a line on stderr; ``slow``
is a whole server with one tool, ``wait``, which answers after the seconds
it is given, counting each call by its id; ``http`` listens on a loopback
port (written to ``STATE_DIR/port``) and never answers a request.  No SDK:
each starts in a few tens of milliseconds.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path
from typing import Any

WAIT_TOOL = {
    "name": "wait",
    "description": "Answer after the seconds given.",
    "inputSchema": {"type": "object", "properties": {"seconds": {"type": "number"}}, "required": ["seconds"]},
}


def _count(state: Path, key: str) -> None:
    path = state / "asked.json"
    asked = json.loads(path.read_text()) if path.exists() else {}
    asked[key] = asked.get(key, 0) + 1
    path.write_text(json.dumps(asked))


def _answer(request: dict[str, Any], result: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps({"jsonrpc": "2.0", "id": request["id"], "result": result}) + "\n")
    sys.stdout.flush()


def _initialized(request: dict[str, Any]) -> dict[str, Any]:
    return {
        "protocolVersion": request["params"]["protocolVersion"],
        "capabilities": {"tools": {}},
        "serverInfo": {"name": "startup", "version": "0"},
    }


def _serve(mode: str, state: Path) -> None:
    for line in sys.stdin:
        request = json.loads(line)
        method = request.get("method", "")
        _count(state, method)
        if "id" not in request or mode == "silent":
            continue
        if mode == "dies":
            print("fatal: cannot open the database /nonexistent/db", file=sys.stderr, flush=True)
            sys.exit(5)
        if method == "initialize":
            _answer(request, _initialized(request))
        elif method == "tools/list" and mode == "slow":
            _answer(request, {"tools": [WAIT_TOOL]})
        elif method == "tools/call" and mode == "slow":
            _count(state, f"call {request['id']}")
            time.sleep(float(request["params"]["arguments"]["seconds"]))
            _answer(request, {"content": [{"type": "text", "text": "waited"}]})


def _http(state: Path) -> None:
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        held = []
        (state / "port.tmp").write_text(str(listener.getsockname()[1]))
        (state / "port.tmp").rename(state / "port")
        while True:  # accept every connection and hold it open, unanswered
            connection, _ = listener.accept()
            _count(state, "connection")
            held.append(connection)


def main() -> None:
    mode, state = sys.argv[1], Path(sys.argv[2])
    (state / "pid").write_text(str(os.getpid()))
    print(f"{mode} server: waiting for a licence key", file=sys.stderr, flush=True)
    if mode == "deaf":
        while True:
            time.sleep(60)
    elif mode == "http":
        _http(state)
    else:
        _serve(mode, state)


if __name__ == "__main__":
    main()
