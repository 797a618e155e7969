"""Joining Ray, and what its cluster offers a batch: CPUs to size the pool by, machines a SQLite file reaches.

The executor (``on_ray``) places runs on the pool; this module is what a
batch asks of Ray before and after: start a local instance or join a
cluster, say which in words, refuse a store the workers cannot reach, and
stop the instance it started.  ``ray`` is imported only when a batch asks.
"""

from __future__ import annotations

import logging
from typing import Any

from fsm_agent.batch.ray_pool import ray_module
from fsm_agent.batch.worker import is_sqlite

RUNS_PER_CPU = 4
"""Runs per CPU when ``max_in_flight`` is not given: a run mostly waits on its model."""


def connect(address: str | None) -> bool:
    """Join Ray at ``address`` (``None``: start a local instance with this machine's cores); True if we started it.

    ``None`` always starts an instance of its own: ``ray.init()`` without an
    address would join whatever cluster the machine runs (``RAY_ADDRESS``,
    the last ``ray start``), which nobody asked for.  Joining one is asked
    for by name: ``"auto"`` (that same search, an error if it finds none) or
    ``HOST:PORT``, ``ray://HOST:PORT``.  A process already connected to Ray
    (``ray.init`` called by the user, or by a test session) is used as it
    is and left running.
    """
    ray = ray_module()
    if ray.is_initialized():
        return False
    options: dict[str, Any] = {"include_dashboard": False, "logging_level": logging.WARNING}
    if address is None or address == "local":
        # Workers' own output would scroll the progress bar away; their logs stay in Ray's session directory.
        options["log_to_driver"] = False
    ray.init(address="local" if address is None else address, **options)
    return True


def connected() -> bool:
    """Whether this process is connected to Ray already (``ray.init`` called by the user, a test session, the CLI)."""
    return bool(ray_module().is_initialized())


def connecting(address: str | None) -> str:
    """What ``connect(address)`` is about to do, in words, for the line shown before it (it takes seconds)."""
    if address is None or address == "local":
        return "ray: starting a local Ray instance ..."
    if address == "auto":
        return "ray: joining the running Ray cluster (RAY_ADDRESS, else the last `ray start`) ..."
    return f"ray: joining the Ray cluster at {address} ..."


def describe(address: str | None, started: bool) -> str:
    """Which Ray the batch runs on, in words: the instance started for it or the cluster joined, and its CPUs."""
    ray = ray_module()
    try:
        where = ray.get_runtime_context().gcs_address
    except Exception:  # noqa: BLE001 - a client connection (ray://) may not know it: the address given says where
        where = address or "an unknown address"
    cpus = f"{int(ray.cluster_resources().get('CPU', 0))} CPUs"
    if started and address in (None, "local"):
        return f"started a local Ray instance at {where} ({cpus}); it stops when the batch ends"
    nodes = sum(1 for node in ray.nodes() if node.get("Alive"))
    joined = "joined the Ray cluster" if started else "using the Ray cluster this process is connected to"
    return f"{joined} at {where} ({nodes} node{'' if nodes == 1 else 's'}, {cpus})"


def disconnect() -> None:
    """Stop the Ray instance ``connect`` started."""
    ray_module().shutdown()


def check_store_reach(spec: str, address: str | None) -> None:
    """Refuse a SQLite store on a cluster of several machines: the other machines cannot reach the file."""
    if not is_sqlite(spec):
        return
    ray = ray_module()
    if address is not None and address.startswith("ray://"):
        msg = (
            f"store {spec!r} is a SQLite file, which workers on a Ray cluster reached through {address} cannot "
            "open; use a PostgreSQL store (postgresql://...) or executor='local'"
        )
        raise ValueError(msg)
    here = ray.util.get_node_ip_address()
    hosts = sorted({node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")})
    if any(host != here for host in hosts):
        msg = (
            f"store {spec!r} is a SQLite file on this machine, but the Ray cluster spans {', '.join(hosts)}; "
            "use a PostgreSQL store (postgresql://...) that every node can reach"
        )
        raise ValueError(msg)


def default_in_flight() -> int:
    """The cluster's CPUs times ``RUNS_PER_CPU``: as many runs as the cluster will place at once."""
    cpus = ray_module().cluster_resources().get("CPU", 1)
    return max(int(cpus * RUNS_PER_CPU), 1)


def pool_size(max_in_flight: int, runs: int) -> int:
    """Actors in a batch's pool: one per CPU of the cluster, no more than runs to share out."""
    cpus = int(ray_module().cluster_resources().get("CPU", 1))
    return max(min(cpus, max_in_flight, runs), 1)
