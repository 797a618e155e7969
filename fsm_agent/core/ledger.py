"""The bookkeeping of a run: what a model reply and a tool outcome add to the messages, steps and counters.

Every change a call's outcome makes to a run happens here, once.  Batch
planning calls ``count_call`` on a copy of the run to learn what the next
``Dispatch`` will see, instead of simulating it by hand.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import attrs

from fsm_agent.definition.run import Run, signature
from fsm_agent.records import STOP_REASONS, ChildOutcome, Message, ModelResponse, Step, ToolCall, Usage, not_json
from fsm_agent.tools import ToolResult

# One encoder, built once: json.dumps with options builds a new one per call, which costs more than the encoding.
_arguments_text = json.JSONEncoder(ensure_ascii=False, default=repr).encode

MAX_NESTING = 100
"""How deep a tool call's arguments may nest (objects and arrays); deeper is an unusable reply.

Real tool arguments nest a few levels.  Hundreds of levels are valid JSON
but past what the snapshot, the journal and the providers' encoders can walk
(Python's recursion limit), so they are refused once, when the reply
arrives, instead of failing wherever the run is written next.
"""
_CONTAINERS = (dict, list, tuple)
MAX_TOKENS = 2**53 - 1
"""The largest token count a reply may report: larger ones are a broken count (and past what JSON keeps exactly)."""


def malformed(response: object) -> str | None:
    """Why a model's return value is not a usable ``ModelResponse``, or None; checked before anything is recorded."""
    if type(response) is ModelResponse:  # every reply is checked: the usual one is cleared on exact types first
        message = response.message
        if (
            type(message) is Message
            and message.role == "assistant"
            and type(message.content) is str
            and type(message.tool_calls) is tuple
        ):
            for call in message.tool_calls:
                if type(call) is not ToolCall or type(call.id) is not str or type(call.name) is not str:
                    break
                if _nested(call.arguments) and nests_deeper(call.arguments, MAX_NESTING):
                    return _too_deep(call)
                if (unusable := _not_json_arguments(call)) is not None:
                    return unusable
            else:
                return None
    if not isinstance(response, ModelResponse):
        return f"model returned {type(response).__name__}, expected ModelResponse"
    message = response.message
    if not isinstance(message, Message):
        return f"ModelResponse.message is a {type(message).__name__}, expected Message"
    if message.role != "assistant":  # kept, the next turn would send it to the provider as someone else's words
        return f"Message.role is {message.role!r}, expected 'assistant': a reply is the model's own message"
    if not isinstance(message.content, str):
        return f"Message.content is a {type(message.content).__name__}, expected str"
    if not isinstance(message.tool_calls, tuple):
        return f"Message.tool_calls is a {type(message.tool_calls).__name__}, expected a tuple of ToolCall"
    for call in message.tool_calls:
        if not isinstance(call, ToolCall):
            return f"a tool call is a {type(call).__name__}, expected ToolCall"
        if not isinstance(call.id, str) or not isinstance(call.name, str):
            return f"a tool call's id and name must be str, got id {call.id!r} and name {call.name!r}"
        if nests_deeper(call.arguments, MAX_NESTING):
            return _too_deep(call)
        if (unusable := _not_json_arguments(call)) is not None:
            return unusable
    return None


def nests_deeper(value: object, limit: int) -> bool:
    """Whether ``value``'s dicts, lists and tuples nest more than ``limit`` levels; walked without recursion."""
    if not isinstance(value, _CONTAINERS):
        return False
    level: list[object] = [value]
    for _ in range(limit):
        level = [
            item
            for container in level
            for item in (container.values() if isinstance(container, dict) else container)  # type: ignore[attr-defined]
            if isinstance(item, _CONTAINERS)
        ]
        if not level:
            return False
    return True


def _nested(arguments: object) -> bool:
    """Whether arguments hold any object or array at all: flat ones, the usual kind, need no walk (``make bench``)."""
    if type(arguments) is not dict:
        return True
    for item in arguments.values():  # noqa: SIM110 - a loop that returns early is faster than any() here
        if isinstance(item, _CONTAINERS):
            return True
    return False


def _too_deep(call: ToolCall) -> str:
    return (
        f"tool call {call.name!r} ({call.id}) has arguments nested more than {MAX_NESTING} levels deep; "
        "the reply is not kept"
    )


def _not_json_arguments(call: ToolCall) -> str | None:
    """Why a call's arguments cannot be kept: they hold what JSON cannot encode (bytes, a set, an object); or None.

    Checked after their nesting is bounded.  Such a reply could not be
    written to a snapshot, a store or ``RunResult.to_json``, so it is refused
    as it arrives (``model_error``, naming the part at fault) rather than
    failing at the next write or losing that part.  Arguments that are no
    dict are the adapter's mistake, not the model's: the built-in adapters
    keep a model's text that is no JSON object in ``raw_arguments`` (which the
    registry refuses as a result the model reads), so a str here is text
    nobody decoded, and telling the model would only make it ask again.
    """
    raw = call.raw_arguments
    if raw is not None and not isinstance(raw, str):
        problem: str | None = f"raw_arguments is of type {type(raw).__name__}, not str"
    else:
        problem = not_json(call.arguments, "arguments")
    if problem is None:
        if isinstance(call.arguments, dict):
            return None
        return (
            f"tool call {call.name!r} ({call.id}) has ToolCall.arguments of type {type(call.arguments).__name__}, "
            "expected the decoded dict: the adapter puts text it could not parse as a JSON object in raw_arguments"
        )
    return f"tool call {call.name!r} ({call.id}) has arguments that are not JSON: {problem}; the reply is not kept"


def usage_problem(usage: object) -> str | None:
    """Why a reply's ``usage`` cannot be counted (a malformed count would switch ``token_budget`` off), or None."""
    if usage is None:
        return None
    if not isinstance(usage, Usage):
        return f"ModelResponse.usage is a {type(usage).__name__}, expected Usage or None"
    for name in ("input_tokens", "output_tokens", "cache_read_tokens", "cache_write_tokens", "reasoning_tokens"):
        value = getattr(usage, name)
        ok = isinstance(value, int) and not isinstance(value, bool) and 0 <= value <= MAX_TOKENS
        if not ok:
            shown = "NaN" if isinstance(value, float) and math.isnan(value) else repr(value)
            return f"ModelResponse.usage.{name} must be a whole number from 0 to 2**53 - 1, got {shown}"
    cost = usage.cost
    if cost is not None and (isinstance(cost, bool) or not isinstance(cost, int | float) or not 0 <= cost < math.inf):
        return f"ModelResponse.usage.cost must be None or a finite number of US dollars >= 0, got {cost!r}"
    return None


def as_kept(response: ModelResponse) -> ModelResponse:
    """An unusable reply as the run's exchange log keeps it: an uncountable usage or non-text stop reason as its repr.

    Why: every reply must fit in a snapshot (stores write JSON, and PostgreSQL refuses NaN), or a run stopped by
    such a reply could not be checkpointed, resumed or forked.  The text is as unusable to ``record_reply`` as
    the original was, so a replay or a fork meets the same ``model_error``, and a person still reads what came.
    """
    usage, stop = response.usage, response.stop_reason
    kept_usage: Any = usage if usage_problem(usage) is None else repr(usage)
    return attrs.evolve(response, usage=kept_usage, stop_reason=stop if isinstance(stop, str) else repr(stop))


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


def take_carried(run: Run, call: ToolCall) -> ToolResult | None:
    """The first of a fork's carried outcomes (``Calls.carried``) for ``call``'s tool and arguments, taken, or None."""
    entries, arguments = run.calls.carried, canonical_arguments(call.arguments)
    for i, (name, kept, held) in enumerate(entries):
        if name == call.name and kept == arguments:
            del entries[i]
            return held
    return None


def take_carried_down(run: Run, call: ToolCall) -> list[tuple[str, str, ToolResult]] | None:
    """What was handed down for sub-agent call ``call`` (``Calls.carried_down``), taken; or None.

    The entry made for ``call`` itself first (its id, ``down_key``), so two
    like calls cut in one reply each get their own child's outcomes; else the
    first of its tool and arguments made for no other pending call (a fork's,
    made again under new ids, or one kept before entries named their call).
    """
    entries, arguments = run.calls.carried_down, canonical_arguments(call.arguments)
    alike = {i: down_parts(kept) for i, (name, kept, _) in enumerate(entries) if name == call.name}
    made_for = {i: for_id for i, (for_id, kept) in alike.items() if kept == arguments}
    pending = {waiting.id for waiting in run.calls.pending}
    own = next((i for i, for_id in made_for.items() if for_id == call.id), None)
    if own is None:
        own = next((i for i, for_id in made_for.items() if for_id not in pending), None)
    return None if own is None else entries.pop(own)[2]


def down_parts(text: str) -> tuple[str | None, str]:
    """A handed-down entry's call id (None where it names none: a fork's, or an older snapshot's) and arguments."""
    if text.startswith("["):
        made_for, arguments = json.loads(text)
        return str(made_for), str(arguments)
    return None, text


def canonical_arguments(arguments: object) -> str:
    """A call's arguments as canonical JSON text (sorted keys, no spaces): equal arguments, equal texts."""
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=repr)


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
