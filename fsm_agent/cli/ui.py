"""The ``ui`` command: serve the run viewer over a store, on this machine only unless told otherwise.

``python -m fsm_agent ui --store runs.db`` (or ``--store postgresql://...``)
serves the viewer on ``127.0.0.1``; only ``--host`` given explicitly binds it
anywhere else, and a request naming any other host is refused (so a web page
cannot reach the viewer through DNS rebinding).  It is read-only unless
started with ``--allow-decisions``, which lets a person approve or reject
the calls of a paused run.  A store that cannot be opened, a missing store
file, or a missing ``ui`` extra is one line and exit 1.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
from pathlib import Path
from typing import Any

from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, SetupError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
WILDCARDS = ("0.0.0.0", "::", "")
"""Bind addresses that mean every interface: then any ``Host`` is answered, since the viewer cannot know its names."""


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent ui``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "ui",
        help="serve the run viewer: the runs of a store, each replayed over the machine, in a browser",
        description="Serve the run viewer for the runs of a store on http://127.0.0.1:8765/ (read-only by default).",
    )
    parser.add_argument("--store", required=True, metavar="FILE|URL", help="a SQLite file or a postgresql:// URL")
    parser.add_argument(
        "--host",
        default=None,
        help=f"address to bind (default {DEFAULT_HOST}); anything but loopback serves every run to the network",
    )
    parser.add_argument("--port", type=int, default=DEFAULT_PORT, help="port (default %(default)s; 0 picks a free one)")
    parser.add_argument(
        "--allow-decisions",
        action="store_true",
        help="let the page approve or reject the pending calls of paused runs (default: read-only)",
    )
    parser.add_argument(
        "--table",
        default="fsm_agent:TABLE",
        help="module:attribute of the Table (or Agent) the runs are drawn over (default: %(default)s)",
    )
    parser.set_defaults(handler=main)


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.x.x.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def answered_hosts(host: str) -> list[str] | None:
    """The ``Host`` names the viewer answers to: loopback names plus the bound host; None (any) for a wildcard."""
    from fsm_agent.ui.app import LOOPBACK

    if host in WILDCARDS:
        return None
    return [*LOOPBACK, host]


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port``; ``SetupError`` naming the address if it cannot be had."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)[0]
        server = socket.socket(family, kind, proto)
    except OSError as exc:
        msg = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        raise SetupError(msg) from None
    try:
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind(address)
        server.listen(128)
    except OSError as exc:
        server.close()
        msg = f"cannot listen on {host}:{port}: {exc.strerror or exc}"
        raise SetupError(msg) from None
    return server


def url_of(server: socket.socket) -> str:
    """The address a browser opens for a listening socket."""
    host, port = server.getsockname()[:2]
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _open(target: str) -> Any:
    from fsm_agent.persist import StoreError, is_url, open_store

    if not is_url(target) and not Path(target).is_file():
        # Opening a missing file would create an empty store and show nothing, which looks like lost runs.
        msg = f"--store {target}: no such file"
        raise SetupError(msg)
    try:
        return open_store(target)
    except StoreError as exc:
        raise SetupError(f"--store: {exc}") from None


def main(args: argparse.Namespace) -> int:
    """Serve the viewer until Ctrl-C; exit 0, or 1 for a set-up error."""
    try:
        import uvicorn

        from fsm_agent.ui.app import create_app
    except ImportError as exc:
        print(f"error: ui: the run viewer needs {exc.name}: pip install 'fsm-agent[ui]'", file=sys.stderr)
        return EXIT_SETUP
    from fsm_agent.cli.diagram import load_table

    host: str = DEFAULT_HOST if args.host is None else args.host
    try:
        table = load_table(args.table)
        store = _open(args.store)
    except SetupError as exc:
        print(f"error: ui: {exc}", file=sys.stderr)
        return EXIT_SETUP
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        print(f"error: ui: --table: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        server = bind(host, args.port)
    except SetupError as exc:
        store.close()
        print(f"error: ui: {exc}", file=sys.stderr)
        return EXIT_SETUP
    app = create_app(
        store,
        table=table,
        allow_decisions=args.allow_decisions,
        hosts=answered_hosts(host),
        store_name=args.store if not args.store.startswith("postgres") else "PostgreSQL",
    )
    mode = "decisions allowed" if args.allow_decisions else "read-only"
    if not is_loopback(host):
        print(f"warning: ui: serving on {host}: anyone who can reach it sees every run ({mode})", file=sys.stderr)
    print(f"fsm_agent ui: {url_of(server)} ({mode}); Ctrl-C stops", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
    try:
        uvicorn.Server(config).run(sockets=[server])
    finally:
        server.close()
        store.close()
    return EXIT_DONE
