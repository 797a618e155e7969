"""The ``ui`` command: serve the run viewer over a store, on this machine only unless told otherwise.

``python -m fsm_agent ui --store runs.db`` (or ``--store postgresql://...``)
serves the viewer on ``127.0.0.1``; only ``--host`` given explicitly binds it
anywhere else, and then only with the names it answers to given as
``--allowed-host``: a request naming any other host is refused, so a web page
cannot reach the viewer through DNS rebinding.  It is read-only unless
started with ``--allow-decisions``, which lets a person approve or reject
the calls of a paused run; with ``--agent MODULE:FUNCTION`` a person can
re-run a run from any of its transitions (a fork, with that agent).  A
store that cannot be opened, a missing store file, a missing ``ui`` extra,
an ``--agent`` that cannot be built, or ``--host`` without
``--allowed-host`` is one line and exit 1.
"""

from __future__ import annotations

import argparse
import ipaddress
import socket
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from fsm_agent.cli import EXIT_DONE, EXIT_SETUP, SetupError

DEFAULT_HOST = "127.0.0.1"
DEFAULT_PORT = 8765
WILDCARDS = ("0.0.0.0", "::", "")
"""Bind addresses that mean every interface: no name of the viewer's own, so only the ``--allowed-host`` names."""


def add_command(commands: Any) -> None:
    """Register ``python -m fsm_agent ui``."""
    parser: argparse.ArgumentParser = commands.add_parser(
        "ui",
        help="serve the run viewer: the runs of a store, each replayed over the machine, in a browser",
        description="Serve the run viewer for the runs of a store on http://127.0.0.1:8765/ (read-only by default); "
        "on another address only to the host names given with --allowed-host.",
    )
    parser.add_argument("--store", required=True, metavar="FILE|URL", help="a SQLite file or a postgresql:// URL")
    parser.add_argument(
        "--host",
        default=None,
        help=f"address to bind (default {DEFAULT_HOST}); anything but loopback serves every run to the network "
        "and needs --allowed-host",
    )
    parser.add_argument(
        "--allowed-host",
        dest="allowed_hosts",
        action="append",
        default=[],
        metavar="NAME",
        help="a host name (or address) the viewer answers to, besides loopback and --host; repeatable; "
        "required with a --host that is not loopback",
    )
    parser.add_argument(
        "--port", type=port_number, default=DEFAULT_PORT, help="port (default %(default)s; 0 picks a free one)"
    )
    parser.add_argument(
        "--allow-decisions",
        action="store_true",
        help="let the page approve or reject the pending calls of paused runs (default: read-only)",
    )
    parser.add_argument(
        "--agent",
        metavar="MODULE:FUNCTION",
        help="your agent (a function with no arguments returning an Agent): lets the page re-run a run from any "
        "of its transitions with it, and a run saved as a test import it",
    )
    parser.add_argument(
        "--table",
        default="fsm_agent:TABLE",
        help="module:attribute of the Table (or Agent) the runs are drawn over (default: %(default)s)",
    )
    parser.set_defaults(handler=main)


def port_number(text: str) -> int:
    """``--port`` as a TCP port, 0 to 65535; a usage error naming the value otherwise.

    Why: ``int`` alone lets 99999 through, and the resolver wraps it modulo
    65536: the viewer would be served on a port nobody asked for.
    """
    try:
        port = int(text)
    except ValueError:
        msg = f"wants a port number, 0 to 65535, got {text!r}"
        raise argparse.ArgumentTypeError(msg) from None
    if not 0 <= port <= 65535:
        msg = f"wants a port number, 0 to 65535, got {text}"
        raise argparse.ArgumentTypeError(msg)
    return port


def is_loopback(host: str) -> bool:
    """Whether ``host`` names this machine only (``localhost``, ``127.x.x.x``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def answered_hosts(host: str, allowed: Sequence[str] = ()) -> list[str]:
    """The ``Host`` names the viewer answers to: loopback names, the bound host (not a wildcard), ``allowed``.

    Never "any": with the ``Host`` check off, a DNS-rebound page would be
    the viewer's own origin and pass the check decisions rely on.
    """
    from fsm_agent.ui.app import LOOPBACK

    bound = [] if host in WILDCARDS else [host]
    return [*LOOPBACK, *(_name(name) for name in [*bound, *allowed])]


def _name(text: str) -> str:
    """A host name as a ``Host`` header carries it: lower case, an IPv6 address without its brackets."""
    text = text.strip().lower()
    return text[1:-1] if text.startswith("[") and text.endswith("]") else text


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


def url_of(server: socket.socket, name: str | None = None) -> str:
    """The address a browser opens for a listening socket: at ``name``, else at the address it is bound to."""
    host, port = server.getsockname()[:2]
    host = name or host
    shown = f"[{host}]" if ":" in host else host
    return f"http://{shown}:{port}/"


def _open(target: str) -> Any:
    from fsm_agent.cli.run import open_store
    from fsm_agent.persist import is_url

    if not is_url(target) and "://" not in target and not Path(target).is_file():
        # Opening a missing file would create an empty store and show nothing, which looks like lost runs.
        msg = f"--store {target}: no such file"
        raise SetupError(msg)
    return open_store(target)


def _hosts(host: str, allowed: list[str]) -> list[str]:
    """The names the viewer answers to; ``SetupError`` for an address beyond loopback with none named."""
    if not is_loopback(host) and not allowed:
        # Every interface has no name of its own: without names the viewer would have to answer any Host.
        msg = (
            f"--host {host or repr(host)} is not loopback: name the host names the viewer answers to "
            "with --allowed-host NAME (once per name)"
        )
        raise SetupError(msg)
    if not all(_name(name) for name in allowed):
        msg = "--allowed-host wants a host name, got an empty one"
        raise SetupError(msg)
    return answered_hosts(host, allowed)


def _table(spec: str) -> Any:
    from fsm_agent.cli.diagram import load_table

    try:
        return load_table(spec)
    except (ValueError, TypeError, ImportError, AttributeError) as exc:
        msg = f"--table: {exc}"
        raise SetupError(msg) from None


def _agent(spec: str) -> Any:
    """The agent ``--agent MODULE:FUNCTION`` builds; ``SetupError`` in one line if it cannot be had."""
    from fsm_agent.cli.batch import built, imported

    return built(imported(spec))


def _stopping_server(base: type[Any], stopping: threading.Event) -> type[Any]:
    """uvicorn's ``Server`` that sets ``stopping`` as its shutdown begins, so the runs followed live end first.

    A page open on a paused run keeps its event stream open: without this,
    the graceful shutdown's second ran out and cut it, printing a traceback.
    """

    class Stopping(base):  # type: ignore[misc]
        async def shutdown(self, sockets: Any = None) -> None:
            stopping.set()
            await super().shutdown(sockets)

    return Stopping


def main(args: argparse.Namespace) -> int:
    """Serve the viewer until Ctrl-C; exit 0, or 1 for a set-up error."""
    try:
        import uvicorn

        from fsm_agent.ui.app import LOOPBACK, create_app, viewer_mode
    except ImportError as exc:
        hint = "install the package's ui extra (in a clone: pip install '.[ui]')"
        print(f"error: ui: the run viewer needs {exc.name}: {hint}", file=sys.stderr)
        return EXIT_SETUP
    host: str = DEFAULT_HOST if args.host is None else args.host
    try:
        hosts = _hosts(host, args.allowed_hosts)
        table = _table(args.table)
        agent = None if args.agent is None else _agent(args.agent)
        store = _open(args.store)
    except SetupError as exc:
        print(f"error: ui: {exc}", file=sys.stderr)
        return EXIT_SETUP
    try:
        server = bind(host, args.port)
    except SetupError as exc:
        store.close()
        print(f"error: ui: {exc}", file=sys.stderr)
        return EXIT_SETUP
    stopping = threading.Event()
    app = create_app(
        store,
        stopping=stopping,
        table=table,
        allow_decisions=args.allow_decisions,
        hosts=hosts,
        store_name=args.store if not args.store.startswith("postgres") else "PostgreSQL",
        agent=agent,
        agent_spec=args.agent,
    )
    mode = viewer_mode(args.allow_decisions, agent is not None)
    if not is_loopback(host):
        names = ", ".join(hosts[len(LOOPBACK) :])
        warning = f"warning: ui: serving on {host} as {names}: anyone who can reach it sees every run ({mode})"
        print(warning, file=sys.stderr)
    # On every interface the bound address is no name a browser may use: show the first one named instead.
    shown = url_of(server, _name(args.allowed_hosts[0]) if host in WILDCARDS else None)
    print(f"fsm_agent ui: {shown} ({mode}); Ctrl-C stops", flush=True)
    config = uvicorn.Config(app, log_level="warning", timeout_graceful_shutdown=1, lifespan="off")
    try:
        _stopping_server(uvicorn.Server, stopping)(config).run(sockets=[server])
    finally:
        server.close()
        store.close()
    return EXIT_DONE
