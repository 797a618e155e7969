"""Guards: small named predicates over a run; their names are the edge labels of the machine.

Guards of limits that are not set return at once, so an unused stop costs
one attribute check.  Which stop a guard belongs to, and what its evidence
says, is declared once in ``definition.stops``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from fsm_agent.definition.run import Run, Signature, signature
from fsm_agent.errors import ContextOverflowError

Guard = Callable[[Run], bool]


def is_truncated(run: Run) -> bool:
    """The model's output hit its length limit (``stop_reason == "max_tokens"``), so the reply is incomplete."""
    return run.last_response is not None and run.last_response.stop_reason == "max_tokens"


def is_refusal(run: Run) -> bool:
    """The provider refused or filtered the reply (``stop_reason == "refusal"``), so it is not an answer."""
    return run.last_response is not None and run.last_response.stop_reason == "refusal"


def has_no_tool_calls(run: Run) -> bool:
    """The assistant message asks for no tool: its text is the final answer."""
    return run.last_response is not None and not run.last_response.message.tool_calls


def context_overflowed(run: Run) -> bool:
    """The model call failed because its input does not fit the model's context window (``ContextOverflowError``)."""
    return isinstance(run.model_exception, ContextOverflowError)


def output_rejected(run: Run) -> bool:
    """A typed agent's final answer failed its output type or a validator, and the model is not asked again."""
    return run.output_problem is not None


def asks_tools_while_finalizing(run: Run) -> bool:
    """The last call was meant to answer without tools and asked for tools anyway."""
    return run.finalizing is not None


def is_cancelled(run: Run) -> bool:
    """Another thread called ``cancel()`` on the run's ``CancelToken``."""
    return run.cancelled


def hook_raised(run: Run) -> bool:
    """A hook of a ``strict_hooks`` agent raised since the last transition."""
    return run.hook_error is not None


def deadline_passed(run: Run) -> bool:
    """The run has used up its ``timeout`` seconds."""
    return run.limits.timeout is not None and run.elapsed >= run.limits.timeout


def condition_raised(run: Run) -> bool:
    """A ``StopCondition``'s check raised instead of answering, so the run cannot tell whether to stop."""
    return run.condition_error is not None


def repeats_last_call(run: Run) -> bool:
    """The next tool call has the same name and arguments as the call executed just before it."""
    return run.last_signature is not None and signature(run.pending[0]) == run.last_signature


def cap_reached(run: Run, name: str) -> tuple[str, int, int] | None:
    """``(scope, used, cap)`` of the first cap that one more call of ``name`` would exceed."""
    caps = run.limits.max_tool_calls
    if caps is None:
        return None
    if isinstance(caps, int):
        return ("*", run.tool_calls, caps) if run.tool_calls >= caps else None
    used = run.calls_by_tool.get(name, 0)
    if name in caps and used >= caps[name]:
        return name, used, caps[name]
    if "*" in caps and run.tool_calls >= caps["*"]:
        return "*", run.tool_calls, caps["*"]
    return None


def tool_calls_exhausted(run: Run) -> bool:
    """Making the next tool call would exceed ``max_tool_calls`` (for the run or for that tool)."""
    caps = run.limits.max_tool_calls
    if caps is None or not run.pending:
        return False
    if type(caps) is not dict:
        return cap_reached(run, run.pending[0].name) is not None
    # cap_reached for a dict of caps, inlined (it is checked before every call): the tool's own cap, then "*".
    name = run.pending[0].name
    cap = caps.get(name)
    if cap is not None and run.calls_by_tool.get(name, 0) >= cap:
        return True
    cap = caps.get("*")
    return cap is not None and run.tool_calls >= cap


def passes_child_stop(run: Run) -> bool:
    """The sub-agent this tool call ran stopped, and its tool passes the stop on (``on_child_stop="raise"``)."""
    return run.child_stop is not None


def failures_exhausted(run: Run) -> bool:
    """``max_consecutive_failures`` tool calls in a row failed."""
    return run.failures >= run.limits.max_consecutive_failures


def find_cycle(recent: Sequence[tuple[Signature, str]]) -> int:
    """The shortest period p >= 2 whose last p calls repeat the p before them, results included; 0 if none.

    Comparing results as well as calls is what "no progress" means here: a
    loop whose calls return the same results twice in a row learned nothing
    new, while calls whose results change (polling a job) are progress.
    """
    n = len(recent)
    last = recent[-1] if n else None
    # Every cycle has the latest call twice in the window (``period`` calls back is the same call): most windows
    # have it once, and counting it is one pass in C, where the loop below is a Python step per period.
    if recent.count(last) < 2:
        return 0
    for period in range(2, n // 2 + 1):
        if recent[n - 1 - period] != last:  # the cheap necessary condition, true of almost every non-cycle
            continue
        block = [recent[n - period + i] for i in range(period)]
        if any(recent[n - 2 * period + i] != block[i] for i in range(period)):
            continue
        if any(item != block[0] for item in block):  # period 1 (A, A) is repeated_action's business
            return period
    return 0


def is_cycling(run: Run) -> bool:
    """The latest tool calls repeat a sequence of period 2 or more with identical results (see ``find_cycle``)."""
    return run.limits.cycle_window >= 4 and len(run.recent) >= 4 and find_cycle(run.recent) > 0


def has_pending_calls(run: Run) -> bool:
    """More tool calls of the current model turn wait to be dispatched."""
    return bool(run.pending)


def budget_spent(run: Run) -> bool:
    """The tokens reported so far have reached ``token_budget``, so no further model call is made."""
    # run.tokens, spelled out: this is asked before every model call, and written in line (core.inlining).
    return run.limits.token_budget is not None and run.input_tokens + run.output_tokens >= run.limits.token_budget


def steps_exhausted(run: Run) -> bool:
    """``max_steps`` model turns were taken, so the next model call must not be made."""
    return run.turns >= run.limits.max_steps


def dormant_guards(
    run: Run, *, strict_hooks: bool, cancellable: bool, also: tuple[Guard, ...] = ()
) -> frozenset[Guard]:
    """The guards that can never hold for ``run``, given how it was set up: its rows leave them out.

    Each of these reads a fact that only one part of a run's set-up can
    produce (a limit, a cancel token, strict hooks, a finalize policy).  A
    run without that part would ask the same question on every transition
    and always be told no.  Anything in doubt (a fact restored from a
    snapshot) keeps the guard.
    """
    limits = run.limits
    dormant: list[Guard] = []
    if not strict_hooks and run.hook_error is None:
        dormant.append(hook_raised)
    if not cancellable and not run.cancelled:
        dormant.append(is_cancelled)
    if limits.timeout is None:
        dormant.append(deadline_passed)
    if limits.max_tool_calls is None:
        dormant.append(tool_calls_exhausted)
    if limits.cycle_window < 4:
        dormant.append(is_cycling)
    if limits.token_budget is None:
        dormant.append(budget_spent)
    if run.finalizing is None and "finalize" not in run.policies.values():
        dormant.append(asks_tools_while_finalizing)
    dormant.extend(also)  # guards of parts this module does not know of (the output check, in the table)
    return frozenset(dormant)
