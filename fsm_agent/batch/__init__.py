"""Many runs of one agent: ``run_batch`` on a Ray cluster or in this process, resumable, each run a result.

    results = run_batch(make_agent, questions, store="runs.db")                     # a local Ray instance
    results = run_batch(make_agent, questions, store="postgresql://...", ray_address="auto")  # a cluster
    results = run_batch(make_agent, questions, store="runs.db", executor="local")   # no Ray

Importing this package does not import Ray; only a batch with
``executor="ray"`` does.
"""

from fsm_agent.batch.items import BatchItem, batch_items, derive_run_id
from fsm_agent.batch.progress import Counts, Tally
from fsm_agent.batch.runner import Executor, iter_batch, run_batch
from fsm_agent.batch.worker import ERROR, LEASED, AgentFactory, StoreSpec

__all__ = [
    "ERROR",
    "LEASED",
    "AgentFactory",
    "BatchItem",
    "Counts",
    "Executor",
    "StoreSpec",
    "Tally",
    "batch_items",
    "derive_run_id",
    "iter_batch",
    "run_batch",
]
