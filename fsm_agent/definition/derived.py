"""The guards of the edges the table derives from the catalogue: resuming a stopped run, asking for a typed
answer again, compacting the history.

Each is a named fact declared with what it reads, like the guards of
``definition.guards``; they live here because they also ask the catalogue
(``blocking_stop``: does any stop forbid the next model call?), which the
catalogue's own guards cannot.  ``build_table`` puts them on the resume,
output-retry and compaction rows.
"""

from __future__ import annotations

from collections.abc import Iterable

from fsm_agent.definition.guards import Declared, context_overflowed, fact
from fsm_agent.definition.run import Run
from fsm_agent.definition.stops import CATALOGUE, Stop, blocking_stop

LIFTABLE = tuple(
    sorted(
        {
            name
            for stop in CATALOGUE
            if stop.resume == "lift" and isinstance(stop.still_holds, Declared)
            for name in stop.still_holds.reads
        }
    )
)
"""What the stops a new limit can lift are asked on a resume: ``_lifts`` and ``blocking_stop`` read them."""


def _lifts(run: Run, reason: str | None) -> bool:
    """Whether the stop ``reason`` is one new limits lift, and the run's limits (and token) now lift it."""
    stop = run.table_stops.get(reason or "")
    if stop is None or stop.resume != "lift" or stop.still_holds is None:
        return False
    return not stop.still_holds(run)


def _lifted(run: Run) -> bool:
    return _lifts(run, run.at.reason)


@fact("pending", "reason", "evidence", *LIFTABLE)
def resumes_before_tool(run: Run) -> bool:
    """The run stopped before a tool call that is still pending, and the resumed run's limits lift that stop."""
    return bool(run.calls.pending) and _lifted(run)


@fact("last_response", "output_checked", "pending", "trace", "reason", "evidence", *LIFTABLE)
def resumes_before_answer(run: Run) -> bool:
    """The run stopped in ``Dispatch`` with its answer not yet taken (its check cut at the deadline): take it now.

    Why not ``resumes_before_model``: the answer came and was paid for; a
    resume with more time checks it again, as the stop's evidence says, and
    asks the model only if the check sends it back.
    """
    answer = run.talk.last_response
    return (
        answer is not None
        and not answer.message.tool_calls
        and not run.calls.pending
        and not run.talk.output_checked
        and bool(run.at.trace)
        and run.at.trace[-1].source == "Dispatch"
        and _lifted(run)
    )


@fact("pending", "reason", "evidence", *LIFTABLE)
def resumes_before_model(run: Run) -> bool:
    """The run stopped before a model call, and the resumed run's limits lift that stop and every other one."""
    return not run.calls.pending and _lifted(run) and blocking_stop(run) is None


@fact("output_problem", "finalizing", "output_retries", "output_retry_limit", *LIFTABLE)
def output_invalid(run: Run) -> bool:
    """A typed agent's final answer was not accepted, a retry is left and no limit forbids the call: ask again.

    The errors go to the model as the next message.  A broken validator, a
    finalize answer (the run has to stop) or a stop that holds before the
    model call (``max_steps``, ``token_budget``, ``cost_budget``, ``timeout``, ``cancelled``)
    leave the next row, ``Failed[output_invalid]``, to take the answer.
    """
    problem = run.talk.output_problem
    return (
        problem is not None
        and problem[1]
        and run.at.finalizing is None
        and run.counts.output_retries < run.output_retry_limit
        and blocking_stop(run) is None
    )


@fact("reason", "output_problem", "finalizing", "output_retries", "output_retry_limit", *LIFTABLE)
def resumes_output_retry(run: Run) -> bool:
    """The run stopped on a typed answer it owed a retry that a stop forbade (``blocked_by``), now lifted: ask again.

    Why: the answer was sent back with a retry left, and what kept the retry
    from being made came from outside the answer (a cancel, the deadline, a
    limit).  With a fresh token, more time or a higher limit the run makes
    it, as a run stopped before any other model call would: a sub-agent cut
    by its parent's cancel, or a batch's run by its Ctrl-C, goes on when
    they are resumed instead of ending for good.
    """
    return run.at.reason == "output_invalid" and output_invalid(run)


@fact("policies", "model_exception", "compacted_turn", "steps", *LIFTABLE)
def compacts_history(run: Run) -> bool:
    """The context window overflowed and the agent compacts then: shorten the history and make the call again.

    Once per overflow: when the call made right after a compaction overflows
    too, or a limit forbids another call, the next row stops the run with
    ``context_overflow``.
    """
    return (
        run.policies.get("context_overflow") == "compact"
        and context_overflowed(run)
        and run.counts.turns != run.counts.compacted_turn + 1
        and blocking_stop(run) is None
    )


@fact("reason", "retry_model", *LIFTABLE)
def retries_model_call(run: Run) -> bool:
    """The run stopped on a model error, was resumed with ``retry=True``, and no limit forbids another call."""
    stop = run.table_stops.get(run.at.reason or "")
    return stop is not None and stop.resume == "retry" and run.at.retry_model and blocking_stop(run) is None


@fact("finalizing", "trace", "retry_model", *LIFTABLE)
def resumes_finalize(run: Run) -> bool:
    """The run's finalize call was cut (a cancel, the deadline, a model error) and that cut is lifted: make it again.

    Why: the stop that asked for the finalize still stands (else
    ``resumes_before_model`` took the run on with tools), and the one last
    call it allows was never answered.  The cut is the reason on the edge
    that ended the run, not the run's reason, which stays the stop that
    asked for the finalize.  A model error is lifted by ``retry=True``.
    """
    if run.at.finalizing is None or not run.at.trace:
        return False
    cut = run.at.trace[-1].reason
    stop = run.table_stops.get(cut or "")
    if stop is not None and stop.resume == "retry":
        return run.at.retry_model
    return _lifts(run, cut)


def describe_resumable(stops: Iterable[Stop]) -> str:
    """The resume rules in words, for the error a resume that lifts nothing raises (the rows above say them)."""
    lifted = [stop.reason for stop in stops if stop.resume == "lift"]
    retried = [stop.reason for stop in stops if stop.resume == "retry"]
    return (
        f"resumable stops: {', '.join(lifted)}"
        + "".join(f", and {reason} with retry=True" for reason in retried)
        + ", each only while no other limit forbids the next call; and a finalize call cut by one of these,"
        + " made again once the cut is lifted"
    )
