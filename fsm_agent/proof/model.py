"""The table as a finite system: abstract runs over bounded counters, every guard read from its declaration.

A concrete run holds messages, replies and clocks; the checker keeps only
what the table's guards can tell apart: the state, the model turns taken,
the tool calls made, the failures in a row, the calls left in the turn, and
a few flags (the last reply asked for tools, the run is finalizing, output
retries used, the next call follows a compaction).  Counters stop at their
limit, since a guard only asks ``meter >= limit``; the state space is then
finite, so a run that could go on forever shows as a loop of equal configs.

Each guard is read from its declaration (``definition.guards``): a limit's
guard compares its meter with the limit where the checker counts that meter
(turns, tool calls, failures) and may be either where it does not (tokens,
dollars, seconds); a named fact is true, false or either according to the config and
the outcome chosen; a guard that declares nothing (a user's stop condition
or a plain function in a row) may be true or false at every check.  That is
an over-approximation: every concrete run is one of the abstract runs, so a
property proven here holds for every run; a counterexample may need facts
the concrete run cannot produce, and its generated test says so by failing.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import NamedTuple

import attrs

from fsm_agent.definition.guards import AtLimit, Declared, Fact, Guard, Lookahead
from fsm_agent.definition.limits import Limits
from fsm_agent.definition.states import TERMINAL, State
from fsm_agent.definition.table import Row, Table
from fsm_agent.definition.triggers import (
    CHECK,
    DISPATCH,
    EXPIRED,
    FINALIZE,
    INTERRUPTED,
    MODEL_FAILED,
    REPLIED,
    START,
    TOOL_DONE,
)
from fsm_agent.records import Transition

MAYBE = frozenset({True, False})
YES = frozenset({True})
NO = frozenset({False})


@attrs.frozen
class Setup:
    """What the checker knows of an agent: its table, limits and the parts that make some facts possible."""

    table: Table
    limits: Limits
    policies: Mapping[str, str] = attrs.field(factory=dict)
    """``on_stop`` by reason: ``finalize`` and ``compact`` change the edges a stop takes."""
    typed: bool = False
    """An ``output_type`` is set: a final answer is checked and may be sent back."""
    output_retries: int = 0
    cancellable: bool = True
    """A run may be given a ``CancelToken`` (a caller can always pass one)."""
    strict_hooks: bool = False
    child_raises: bool = False
    """A sub-agent tool passes its stop on (``on_child_stop="raise"``)."""
    gated: bool = False
    """An ``approve=`` rule may hold a tool call for a person's decision."""
    calls_per_reply: int | None = None
    """At most this many tool calls in one reply; None: any number (the bound in transitions is then open)."""
    every: str = "call"
    """When the run's store writes (``persist.every.EVERY``): what crash safety is judged under."""
    children: bool = False
    """The agent has sub-agent tools: one tool call also counts the calls its sub-agent made (``ledger``)."""
    any_policy: bool = False
    """A bare table: each stop may be met under any policy the table gives it an edge for (a ``finalize`` call,
    ``compact``, or the end of the run), as one agent on the table or another sets ``on_stop``."""

    def may(self, reason: str, policy: str) -> bool:
        """A run may meet the stop ``reason`` under ``policy``."""
        return self.any_policy or self.policies.get(reason) == policy

    @property
    def replies(self) -> tuple[int, ...]:
        """The numbers of tool calls a reply is taken to ask for; with no cap, 2 stands for 2 or more."""
        cap = self.calls_per_reply
        return tuple(range(3 if cap is None else cap + 1))

    @property
    def calls_counted(self) -> int:
        """Tool calls are counted up to this many: the run's cap, the least per-tool cap, 4 for the cycle window."""
        least = least_tool_cap(self.limits) or 0
        return max(self.limits.total_tool_calls or 0, least, 4 if self.limits.cycle_window >= 4 else 1)


def least_tool_cap(limits: Limits) -> int | None:
    """The smallest cap on one tool's calls: no tool's cap is reached before the run made that many of its own calls.

    (A sub-agent's calls count towards the run's total only, never towards a tool's own count.)
    """
    caps = limits.max_tool_calls
    return min((cap for name, cap in caps.items() if name != "*"), default=None) if isinstance(caps, dict) else None


class Config(NamedTuple):
    """One abstract run: the state and the counters and flags the guards can tell apart."""

    state: State
    turns: int = 0
    calls: int = 0
    fails: int = 0
    pending: int = 0
    asked: bool = False
    finalizing: bool = False
    retries: int = 0
    compacted: bool = False
    shared: bool = False
    """A sub-agent's calls may be in the run's count (``ledger``): it may be anywhere from ``calls`` up."""
    reason: str | None = None
    """On a terminal config: the stop reason (``done`` for Done)."""


class Move(NamedTuple):
    """One edge of the abstract system: the row taken, the config it leads to, and what it spent."""

    entry: Transition
    row: Row
    after: Config
    model_call: bool = False
    tool_call: bool = False
    shrinks: bool = False
    """A call of a turn with "2 or more" calls left was made and 2 or more are left: finite, though equal."""
    choice: tuple[str, ...] = ()
    """What the model, the tools and the world did for this edge, as ``kind:what`` words the test writer reads:
    ``reply:2`` (a reply asking for 2 calls), ``stop:is_truncated``, ``model:error``, ``tool:fails``,
    ``answer:retryable``, ``held:steps_exhausted`` (the guard of the row taken), ``fallback``."""
    via_child: bool = False
    """The call was a sub-agent's, whose own calls the run counted: the graph takes such moves last."""


INITIAL = Config(State.AwaitModel)


class Explorer:
    """The successors of each abstract config of one agent's table."""

    def __init__(self, setup: Setup) -> None:
        self.setup = setup
        self.table = setup.table
        self.index = setup.table.index
        limits = setup.limits
        self.cycle_on = limits.cycle_window >= 4
        self.blockers = bool(
            limits.timeout is not None
            or limits.token_budget is not None
            or limits.cost_budget is not None
            or setup.cancellable
        )
        """Stops other than ``max_steps`` that may forbid a model call (``blocking_stop``): unknown here."""

    # --- guards -----------------------------------------------------------------------------------------------

    def truth(self, guard: Guard | None, c: Config, world: Mapping[str, object]) -> frozenset[bool]:
        """Whether ``guard`` holds for config ``c`` and the outcome ``world``: yes, no, or either."""
        if guard is None:
            return YES
        if isinstance(guard, AtLimit):
            return self._at_limit(guard, c)
        if isinstance(guard, Fact) and not isinstance(guard, Lookahead):
            return self._fact(guard, c, world)
        return MAYBE  # opaque: a user's stop condition or a plain function, asked and never read

    def _at_limit(self, guard: AtLimit, c: Config) -> frozenset[bool]:
        limit = guard.limit(self.setup.limits)
        if limit is None:
            return NO
        counted = {"steps": c.turns, "failures": c.fails, "tool_calls": c.calls}.get(guard.meter.name)
        if counted is None:  # tokens, dollars and seconds: not counted here, either may hold
            return MAYBE
        return YES if counted >= limit else NO

    def _steps_left(self) -> frozenset[bool]:
        """``blocking_stop`` is None: no stop forbids the next call, as far as the checker can tell."""
        return MAYBE if self.blockers else YES

    def _fact(self, guard: Declared, c: Config, world: Mapping[str, object]) -> frozenset[bool]:
        s, limits = self.setup, self.setup.limits
        name = guard.__name__
        if name in ("is_truncated", "is_refusal"):
            return YES if world.get("stop") == name else NO
        if name == "has_no_tool_calls":
            return NO if c.asked else YES
        if name == "has_pending_calls":
            return YES if c.pending else NO
        if name == "context_overflowed":
            return YES if world.get("overflow") else NO
        if name == "output_rejected":
            return YES if world.get("problem") else NO
        if name == "output_invalid":
            if world.get("problem") != "retryable" or c.finalizing or c.retries >= s.output_retries:
                return NO
            return NO if c.turns >= limits.max_steps else self._steps_left()
        if name == "compacts_history":
            if not s.may("context_overflow", "compact") or not world.get("overflow") or c.compacted:
                return NO
            holds = NO if c.turns >= limits.max_steps else self._steps_left()
            return holds | NO if s.any_policy else holds  # under another policy the overflow ends the run
        if name == "awaits_decision":
            return YES if world.get("undecided") else NO
        if name == "asks_tools_while_finalizing":
            return YES if c.finalizing else NO
        if name == "is_cancelled":
            return MAYBE if s.cancellable else NO
        if name == "hook_raised":
            return MAYBE if s.strict_hooks else NO
        if name == "repeats_last_call":
            return MAYBE if c.pending and c.calls else NO
        if name == "tool_calls_exhausted":
            return self._caps(c)
        if name == "passes_child_stop":
            return MAYBE if s.child_raises else NO
        if name == "is_cycling":
            return MAYBE if self.cycle_on and c.calls >= 4 else NO
        return MAYBE  # a fact this checker has no reading of (a user's): either

    def _caps(self, c: Config) -> frozenset[bool]:
        caps = self.setup.limits.max_tool_calls
        if caps is None or not c.pending:
            return NO
        total = self.setup.limits.total_tool_calls
        if total is not None and c.calls >= total:
            return YES
        if total is not None and c.shared:
            return MAYBE  # a sub-agent's calls may have brought the count to the cap
        least = least_tool_cap(self.setup.limits)
        return MAYBE if least is not None and c.calls >= least else NO  # the calls made may be of the capped tool

    # --- moves ------------------------------------------------------------------------------------------------

    def moves(self, c: Config) -> Iterator[Move]:
        """Every edge an abstract run in ``c`` can take next (none from a terminal config)."""
        if c.state in TERMINAL:
            return
        if c.state is State.AwaitModel:
            yield from self._await_model(c)
        elif c.state is State.CheckTruncation:
            for stop in ("end_turn", "is_truncated", "is_refusal"):
                yield from self._walk(c, c, CHECK, {"stop": stop}, (f"stop:{stop}",))
        elif c.state is State.Dispatch:
            yield from self._dispatch(c)
        elif c.state is State.ExecuteTool:
            yield from self._execute(c)
        else:  # a state a user's rows added: every trigger of its rows may come
            for state, trigger in self.index:
                if state is c.state:
                    yield from self._walk(c, c, trigger, {}, ())

    def _await_model(self, c: Config) -> Iterator[Move]:
        s = self.setup
        if c.turns == 0 and not c.compacted and not c.retries and not c.finalizing:
            rows = self.index.get((State.AwaitModel, START), ())
            holds = [self.truth(row.guard, c, {}) for row in rows]
            yield from self._walk(c, c, START, {}, ("at:start",), only_taken=True)
            if any(t == YES for t in holds):
                return  # a start row always holds: no model call is made
        turns = min(c.turns + 1, s.limits.max_steps)
        called = c._replace(turns=turns)
        for k in s.replies:
            after = called._replace(pending=k, asked=k > 0)
            yield from self._walk(c, after, REPLIED, {}, (f"reply:{k}",), model_call=True)
        for overflow in (False, True):
            yield from self._walk(
                c,
                called,
                MODEL_FAILED,
                {"overflow": overflow},
                ("model:" + ("overflow" if overflow else "error"),),
                model_call=True,
            )
        if s.cancellable:
            yield from self._walk(c, called, INTERRUPTED, {}, ("model:cancelled",), model_call=True)
        if s.limits.timeout is not None:
            yield from self._walk(c, called, EXPIRED, {}, ("model:late",), model_call=True)

    def _dispatch(self, c: Config) -> Iterator[Move]:
        s = self.setup
        answer = not c.asked
        if answer and s.typed:
            if s.limits.timeout is not None:
                yield from self._walk(c, c, EXPIRED, {}, ("answer:late",))
            for problem in (None, "final", "retryable"):
                yield from self._walk(c, c, DISPATCH, {"problem": problem}, (f"answer:{problem or 'ok'}",))
        else:
            yield from self._walk(c, c, DISPATCH, {}, ())

    def _execute(self, c: Config) -> Iterator[Move]:
        s = self.setup
        calls = min(c.calls + 1, s.calls_counted)
        # Never below none left: a user's row may come back here with no call pending.
        lefts = [max(c.pending - 1, 0)] if s.calls_per_reply is not None or c.pending < 2 else [2, 1]
        # A sub-agent's calls count as the run's (``ledger``): after one, the cap may be reached at any check.
        shares = (False, True) if s.children and s.limits.total_tool_calls is not None and not c.shared else (False,)
        for shared in shares:
            via = ("tool:sub-agent",) if shared else ()
            for left in lefts:
                shrinks = left == c.pending
                made = c._replace(calls=calls, pending=left, shared=c.shared or shared)
                for failed in (False, True):
                    fails = min(c.fails + 1, s.limits.max_consecutive_failures) if failed else 0
                    choice = ("tool:" + ("fails" if failed else "ok"), *via)
                    after = made._replace(fails=fails)
                    yield from self._walk(
                        c, after, TOOL_DONE, {}, choice, tool_call=True, shrinks=shrinks, via_child=shared
                    )
                if shared:
                    continue  # a call cut while in flight stops the run: whose calls were counted is moot
                if s.cancellable:
                    yield from self._walk(
                        c, made, INTERRUPTED, {}, ("tool:cancelled",), tool_call=True, shrinks=shrinks
                    )
                if s.limits.timeout is not None:
                    yield from self._walk(c, made, EXPIRED, {}, ("tool:late",), tool_call=True, shrinks=shrinks)

    def _walk(
        self,
        before: Config,
        c: Config,
        trigger: str,
        world: Mapping[str, object],
        choice: tuple[str, ...],
        *,
        model_call: bool = False,
        tool_call: bool = False,
        shrinks: bool = False,
        only_taken: bool = False,
        via_child: bool = False,
    ) -> Iterator[Move]:
        """The rows of ``trigger`` in order: each one that may hold is taken, unless one before surely held."""
        rows = self.index.get((c.state, trigger), ())
        for row in rows:
            truth = self.truth(row.guard, c, world)
            if True in truth:
                said = (*choice, _said(row))
                for taken, after in self._takes(c, row, trigger):
                    yield Move(taken.entry, taken, after, model_call, tool_call, shrinks, said, via_child)
            if False not in truth:
                return
        if not rows and not only_taken:
            return  # a trigger with no rows here: the run never fires it in this state

    def _takes(self, c: Config, row: Row, trigger: str) -> Iterator[tuple[Row, Config]]:
        """Move along ``row``, or the finalize edge its stop's policy asks for (as ``firing.take`` does).

        Both, for a bare table (``Setup.any_policy``): one agent on it finalizes that stop, another ends on it.
        """
        reason = row.reason
        if reason is not None and not c.finalizing and self.setup.may(reason, "finalize"):
            for finalize in self.index.get((c.state, FINALIZE), ()):
                guard = finalize.guard
                if isinstance(guard, Lookahead) and guard.trigger == trigger and guard.__name__.endswith(reason):
                    yield finalize, c._replace(state=State.AwaitModel, finalizing=True, pending=0, asked=False)
                    if not self.setup.any_policy:
                        return
                    break
        yield self._along(c, row)

    def _along(self, c: Config, row: Row) -> tuple[Row, Config]:
        """Move along ``row`` itself."""
        reason = row.reason
        dest = row.dest
        if dest in TERMINAL:
            return row, Config(dest, reason=reason or "done")
        after = c._replace(state=dest, compacted=False)
        name = row.guard_name
        if name == "output_invalid":
            after = after._replace(retries=c.retries + 1, asked=False, pending=0)
        elif name == "compacts_history":
            after = after._replace(compacted=True)
        elif dest is State.AwaitModel:
            after = after._replace(pending=0)
        return row, after


def _said(row: Row) -> str:
    """How a move's choice names the guard that let it through."""
    return f"held:{row.guard_name}" if row.guard is not None else "fallback"
