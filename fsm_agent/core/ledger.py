"""The bookkeeping of a run: what a model reply and a tool outcome add to the messages, steps and counters.

Every change a call's outcome makes to a run happens here, once.  Batch
planning calls ``count_call`` on a copy of the run to learn what the next
``Dispatch`` will see, instead of simulating it by hand.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING

import attrs

from fsm_agent.core.hand_down import take_carried_down
from fsm_agent.core.reply_checks import usage_problem
from fsm_agent.definition.run import Run, signature
from fsm_agent.records import STOP_REASONS, ChildOutcome, Message, ModelResponse, Step, ToolCall, Usage
from fsm_agent.tools import ToolResult

if TYPE_CHECKING:
    from fsm_agent.core.output import OutputSpec

# One encoder, built once: json.dumps with options builds a new one per call, which costs more than the encoding.
_arguments_text = json.JSONEncoder(ensure_ascii=False, default=repr).encode

Pricer = Callable[[Usage], float | None]
"""An agent's pricing of a call's usage (``core.pricing``): US dollars, or None where the price is unknown."""
NO_USAGE = Usage()


def count_unmetered(run: Run, price: Pricer | None) -> None:
    """Count a call that reported no usage (it raised, or its reply had none): zero tokens at the agent's price.

    As ``token_budget`` counts it as zero tokens, it costs nothing where the
    price is known; where it is not, it is one more unpriced call.
    """
    count_cost(run, None if price is None else price(NO_USAGE))


def count_cost(run: Run, cost: float | None) -> None:
    """Add one call's US dollars to the run's (``None``: its price is unknown, so it is counted as unpriced)."""
    if cost is None:
        run.counts.unpriced += 1
    else:
        # Rounded to a millionth of a cent, so sums of binary fractions read as the amounts they are.
        run.counts.cost = round(run.counts.cost + cost, 12)
        run.counts.priced += 1


def unique_calls(run: Run, response: ModelResponse) -> ModelResponse:
    """The reply with each tool call id the conversation already holds (or the reply repeats) made unique.

    Outcomes, decisions and sub-agent runs are kept by call id, so a
    provider that numbers its calls from ``call_0`` in every reply (some
    OpenAI-compatible servers do) would otherwise have one call take
    another's outcome.  A repeated id gets the first free ``<id>-<n>``
    (``n`` from 2), in the message the model is sent back too, so each tool
    message still answers its own call.  Only the ``ToolCall`` changes: a
    reply's ``provider_data`` is the provider's layout, which the core does
    not read, so the adapter that sends it back verbatim writes the calls'
    ids into it (``fsm_agent.models.replies.renamed_calls``).
    """
    taken = run.calls.call_ids
    if taken is None:
        taken = run.calls.call_ids = {c.id for m in run.talk.messages if m.role == "assistant" for c in m.tool_calls}
    calls = response.message.tool_calls
    renamed, clashed = [], False
    for call in calls:
        fresh, n = call.id, 1
        while fresh in taken:
            n += 1
            fresh = f"{call.id}-{n}"
        taken.add(fresh)
        if n > 1:
            clashed, call = True, attrs.evolve(call, id=fresh)
        renamed.append(call)
    if not clashed:
        return response
    return attrs.evolve(response, message=attrs.evolve(response.message, tool_calls=tuple(renamed)))


def record_reply(run: Run, response: ModelResponse, price: Pricer | None = None) -> str | None:
    """Keep a reply (message, its calls, its tokens, its cost); return why it is unusable, if it is.

    The cost is the model's own ``usage.cost`` if it gave one, else ``price``'s
    figure for the usage (the agent's pricing), kept on the reply's usage.
    """
    if response.message.tool_calls:
        response = unique_calls(run, response)
    message = response.message
    run.talk.messages.append(message)
    if message.tool_calls:
        run.calls.pending.extend(message.tool_calls)
    usage = response.usage
    if usage is None:
        count_unmetered(run, price)
    else:
        problem = usage_problem(usage)
        if problem is not None:
            count_cost(run, None)
            return problem
        count_tokens(run, usage)
        cost = usage.cost
        if cost is None and price is not None:
            cost = price(usage)
            if cost is not None:
                response = attrs.evolve(response, usage=attrs.evolve(usage, cost=cost))
        count_cost(run, cost)
    if response.stop_reason not in STOP_REASONS:
        # The reply, its calls (pending) and its tokens are kept, but an unknown signal is not guessed at.
        return f"model returned unknown stop_reason {response.stop_reason!r}; expected one of {STOP_REASONS}"
    run.talk.last_response = response
    return None


def send_back(run: Run, output: OutputSpec | None) -> None:
    """Send a typed answer back: record the failed check as a step, count the retry, tell the model the errors."""
    assert run.talk.output_problem is not None  # the row's guard held: an answer was not accepted
    assert output is not None
    errors = run.talk.output_problem[0]
    run.counts.output_retries += 1
    run.talk.steps.append(Step(run.counts.turns - 1, "output_invalid", "; ".join(errors), run.counters()))
    run.talk.messages.append(Message("user", output.retry_text(errors)))
    run.talk.output_checked, run.talk.output_problem, run.talk.output = False, None, None
    run.talk.output_plain = None


def count_tokens(run: Run, spent: Usage | ChildOutcome) -> None:
    """Add a reply's (or a sub-agent run's) tokens to the run's, their cached and reasoning parts too."""
    counts = run.counts
    counts.input_tokens += spent.input_tokens
    counts.output_tokens += spent.output_tokens
    counts.cache_read_tokens += spent.cache_read_tokens
    counts.cache_write_tokens += spent.cache_write_tokens
    counts.reasoning_tokens += spent.reasoning_tokens


def count_call(run: Run, call: ToolCall) -> None:
    """What executing ``call`` changes that the next ``Dispatch`` reads: the call counts and the last signature."""
    run.counts.tool_calls += 1
    run.counts.calls_by_tool[call.name] = run.counts.calls_by_tool.get(call.name, 0) + 1
    run.counts.last_signature = signature(call)


def record_tool(run: Run, call: ToolCall, outcome: ToolResult) -> None:
    """Append a call's tool message and step and update every counter the guards read."""
    run.talk.messages.append(Message("tool", outcome.content, tool_call_id=call.id))
    count_call(run, call)
    if outcome.error is None:
        run.counts.failures = 0
    else:
        run.counts.failures += 1
        run.talk.last_error = outcome.error
    if run.limits.cycle_window:
        run.counts.recent.append((run.counts.last_signature, outcome.content))  # type: ignore[arg-type]  # count_call set it
    arguments = _arguments_text(call.arguments)
    detail = f"{call.name}({arguments}) -> {outcome.content}"
    child = outcome.child
    if child is not None:
        # A sub-agent's tokens are the parent's too: its budget sees them from the next check on; and its tool
        # calls are the parent's (its max_tool_calls total: see drivers/child_runs).
        count_child(run, child)
        if run.calls.cut_children:
            run.calls.cut_children.pop(call.id, None)  # the call is answered: its cut, if any, is settled
        run.calls.child_stop = None if child.stop is None else {"child_run_id": child.run_id, **child.stop}
    run.talk.steps.append(
        Step(
            run.counts.turns - 1,
            "tool_call",
            detail,
            run.counters(),
            outcome.truncated,
            run.talk.sent,
            None if child is None else child.run_id,
            outcome.reused_from,
        )
    )


def count_child(run: Run, child: ChildOutcome) -> None:
    """Add what a sub-agent's run brought its parent: its tokens, its cost and model calls, and its tool calls.

    Each model call of the child's run (its own sub-agents' included) is a
    priced or unpriced call of the parent's, as if the parent had made it:
    the ``cost_budget`` evidence counts them one by one.  An unknown cost
    adds no dollars; its unpriced calls make the parent's cost unknown.
    """
    count_tokens(run, child)
    counts = run.counts
    if child.cost is not None:
        counts.cost = round(counts.cost + child.cost, 12)
    counts.priced += child.priced_calls
    counts.unpriced += child.unpriced_calls
    counts.tool_calls += child.tool_calls


def count_cut_child(run: Run, call_id: str, spent: ChildOutcome, uncounted: ChildOutcome) -> None:
    """A sub-agent call was given up in flight: keep what its run had ``spent``, and count the ``uncounted`` part.

    Why: the child's model calls were made and billed whether or not the
    parent waits for its answer, so a stopped parent's usage must hold them.
    ``spent`` is kept by call id (``Calls.cut_children``, part of the
    snapshot): if the call is made again and its child's stored run taken
    back, that run's outcome brings only what it spent beyond what was
    counted here (``drivers.cut_spend``), so nothing is counted twice.
    ``uncounted`` is ``spent`` less what an earlier cut of the same call
    counted already: a cut child that made no model call adds none.  Its
    tool calls count here too, whatever the call's outcome will be (a budget
    may refuse it, a person reject it): the loaded snapshot's check reads
    them from ``cut_children`` (``core.consistency``).  What every cut of
    the call counted is added up (``Calls.cut_counted``) until an outcome
    answers it, whose exchange keeps the total: a fork's outcome taken past
    its fork point brings it (and a replay's or a rebuild's, of a recording
    that kept no ``cut_shares``).
    """
    run.calls.cut_children[call_id] = spent
    count_cut_share(run, call_id, uncounted)


def count_cut_share(run: Run, call_id: str, share: ChildOutcome) -> None:
    """Count what a cut of sub-agent call ``call_id`` counted (``share``), and keep it with where it was counted.

    Why kept by position (``Calls.cut_shares``): a replay or a fork's
    rebuild reads no child in flight at its cuts, so it counts each share
    again before the same transition, and its guards see what the recorded
    run's saw (a ``max_tool_calls`` stop the share brought on, say).
    """
    calls = run.calls
    counted = calls.cut_counted.get(call_id)
    calls.cut_counted[call_id] = share if counted is None else plus(counted, share)
    calls.cut_shares.append((len(run.at.trace), call_id, share))
    count_child(run, share)


def uncount_cuts(run: Run) -> None:
    """Take back what cuts counted of calls no outcome has answered yet: each will count it with its outcome.

    Why: a fork's rebuild counts each of its source's cut shares where the
    source did, so its guards see what the source's saw; past the fork point
    a call still unanswered there brings all its sub-agent spent with the
    outcome the fork takes (``drivers.fork_spend``), cuts included.  The
    shares stay in ``Calls.cut_shares`` and the point is kept
    (``Calls.cuts_taken_back``), so a replay or a rebuild of the fork
    counts and takes back each where the fork did.
    """
    calls, counts = run.calls, run.counts
    if not calls.cut_counted:
        return
    for counted in calls.cut_counted.values():
        counts.input_tokens -= counted.input_tokens
        counts.output_tokens -= counted.output_tokens
        counts.cache_read_tokens -= counted.cache_read_tokens
        counts.cache_write_tokens -= counted.cache_write_tokens
        counts.reasoning_tokens -= counted.reasoning_tokens
        if counted.cost is not None:
            counts.cost = round(counts.cost - counted.cost, 12)
        counts.priced -= counted.priced_calls
        counts.unpriced -= counted.unpriced_calls
        counts.tool_calls -= counted.tool_calls
    calls.cut_counted.clear()
    calls.cuts_taken_back.append(len(run.at.trace))


def plus(one: ChildOutcome, other: ChildOutcome) -> ChildOutcome:
    """Two spends added up, under ``one``'s run id (a cost unknown in either is unknown)."""
    cost = None if one.cost is None or other.cost is None else round(one.cost + other.cost, 12)
    return ChildOutcome(
        one.run_id,
        one.input_tokens + other.input_tokens,
        one.output_tokens + other.output_tokens,
        None,
        one.tool_calls + other.tool_calls,
        cost,
        one.cache_read_tokens + other.cache_read_tokens,
        one.cache_write_tokens + other.cache_write_tokens,
        one.reasoning_tokens + other.reasoning_tokens,
        one.priced_calls + other.priced_calls,
        one.unpriced_calls + other.unpriced_calls,
    )


def answer_unexecuted(run: Run, why: str) -> list[str]:
    """Answer every pending call, in the order asked: providers reject unanswered calls.

    A call of a parallel batch that came back is answered with its outcome
    (its ids are returned); any other gets a tool message saying it did not run.
    """
    run.calls.to_approve.clear()  # a call answered now waits for nobody
    kept = []
    while run.calls.pending:
        call = run.calls.pending.popleft()
        outcome = run.calls.ran.pop(call.id, None)
        if outcome is not None:
            record_tool(run, call, outcome)
            kept.append(call.id)
        else:
            if run.calls.carried_down:  # never run: what a cut child of it completed, no child of it takes
                take_carried_down(run, call)
            if run.calls.cut_counted:  # what its cuts counted stays counted: no outcome of it will bring it
                run.calls.cut_counted.pop(call.id, None)
            run.talk.messages.append(Message("tool", error_text(f"not executed: {why}"), tool_call_id=call.id))
    return kept


def record_leftovers(run: Run) -> list[str]:
    """Calls of a parallel batch that ran although the run stopped before their turn: kept, in the order asked.

    Only the leading ones: after a call the stop cut in flight, or never
    started, the outcomes of later calls that came back stay in ``Calls.ran``
    (named by ``held_back``), so a resume takes them in after it, in order.
    """
    ids = []
    while run.calls.pending and run.calls.pending[0].id in run.calls.ran:
        call = run.calls.pending.popleft()
        run.calls.to_approve.discard(call.id)
        record_tool(run, call, run.calls.ran.pop(call.id))
        ids.append(call.id)
    return ids


def held_back(run: Run) -> list[str]:
    """Pending calls that came back after a call still pending before them: kept in ``Calls.ran`` for the resume."""
    ran = run.calls.ran
    return [call.id for call in run.calls.pending if call.id in ran] if ran else []


def error_text(message: str) -> str:
    """A failed call's tool message: ``{"error": message}``, the shape tools report failures in."""
    return json.dumps({"error": message}, ensure_ascii=False)
