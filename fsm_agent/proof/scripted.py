"""Drive one path the checker found through the real engine: a scripted model, scripted tools, a scripted world.

A path is the checker's list of moves, each with what the model, the tools
and the world did (``Move.choice``).  ``drive`` turns that into a script: the
model's replies (a reply's calls, its stop reason, an error or an overflow),
each tool call's outcome, the clock's jump, a pre-cancelled token, a strict
hook that raises, and copies of the agent's stop conditions that answer yes
exactly where the path says.  Then it runs an agent with the same table,
limits, policies and output retries, and returns the result, so a test can
compare the edges taken with the path.  A path that needs a world the script
cannot make (a cancel or a deadline in the middle of a call, a sub-agent's
stop) raises ``Unscriptable`` naming it; the test writer leaves such paths out
and says which.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from fsm_agent.definition.states import State
from fsm_agent.definition.stops import GUARDRAILS, At, StopCondition
from fsm_agent.drivers.agent import Agent
from fsm_agent.errors import ContextOverflowError, Retry
from fsm_agent.records import Message, ModelResponse, ToolCall, Transition, Usage

QUESTION = "Scripted question."

Plan = Sequence[tuple[Transition, tuple[str, ...]]]
"""The path: each transition with its ``Move.choice``, in order."""


class Unscriptable(ValueError):
    """A path needs a world the script cannot make."""


class Script:
    """The model's replies, the tools' outcomes and the world's events that make a run take one path."""

    def __init__(self, agent: Agent, plan: Plan) -> None:
        self.agent = agent
        self.replies: list[_Pending | BaseException] = []
        self.outcomes: dict[int, bool] = {}  # call number -> it fails
        self.args: dict[int, str] = {}  # call number -> its argument
        self.cancelled = False
        self.late_after_reads: int | None = None
        self.hook_on_reply: int | None = None
        self.says_yes: dict[str, int] = {}  # stop condition reason -> the call of its check that answers yes
        self.raises: set[str] = set()  # stop conditions whose check raises on that call instead
        self.answers: list[str] = []
        self.asked: dict[str, int] = {}  # stop condition reason -> its checks asked so far, across agents
        caps = agent.settings.limits.max_tool_calls
        self.capped = sorted(name for name in caps if name != "*") if isinstance(caps, dict) else []
        self.tool = "act"  # the scripted tool; named after no capped tool, so no per-tool cap counts its calls
        while self.tool in self.capped:
            self.tool += "_"
        self.names: dict[int, str] = {}  # call number -> the capped tool it is made as (else ``tool``)
        self._read(plan)

    def _read(self, plan: Plan) -> None:
        asked: dict[str, int] = {}
        queued: list[int] = []  # call numbers of the turn not yet made
        made = 0
        turn_calls: list[int] = []
        sizes = _turn_sizes(plan)
        for n, (edge, choice) in enumerate(plan):
            self._count_checks(edge, asked, answering=not turn_calls)
            words = dict(word.split(":", 1) for word in choice if ":" in word)
            held = words.get("held")
            kind = words.get("reply")
            if kind is not None:
                count = max(int(kind), sizes[len(self.replies)])
                turn_calls = list(range(made, made + count))
                made += count
                queued = list(turn_calls)
                for number in turn_calls:
                    self.args.setdefault(number, f"call {number}")
                self.replies.append(_Pending(turn_calls))
            if "model" in words:
                what = words["model"]
                if what == "error":
                    self.replies.append(RuntimeError("the scripted model call failed"))
                elif what == "overflow":
                    self.replies.append(ContextOverflowError("the scripted conversation is too long"))
                else:
                    raise Unscriptable(f"a model call {_said(what)} (transition {n})")
            if words.get("stop") in ("is_truncated", "is_refusal"):
                last = self.replies[-1]
                assert isinstance(last, _Pending)
                last.stop = "max_tokens" if words["stop"] == "is_truncated" else "refusal"
            if "answer" in words:
                if words["answer"] == "late":
                    raise Unscriptable(f"an answer check past the deadline (transition {n})")
                self.answers.append(words["answer"])
            if "tool" in words:
                if words["tool"] in ("cancelled", "late"):
                    raise Unscriptable(f"a tool call {_said(words['tool'])} (transition {n})")
                number = queued.pop(0)
                self.outcomes[number] = words["tool"] == "fails"
            self._world(n, held, words, queued)

    def _count_checks(self, edge: Transition, asked: dict[str, int], *, answering: bool) -> None:
        """Count the stop conditions' checks the walk to ``edge`` asks; the one on ``edge`` answers yes.

        An ``at="answer"`` guardrail's check is asked only of a reply without tool calls (``answering``).
        """
        stops = self.agent.settings.stop_conditions
        users = {stop.reason for stop in stops if answering or At.ANSWER not in stop.at}
        raising = False  # the walk took stop_condition_error: the next stop condition's check raised
        for row in self.agent.settings.table.index.get((State(edge.source), edge.trigger), ()):
            taken = row.entry == edge
            if taken and row.reason == "stop_condition_error":
                raising = True
                continue
            if row.reason in users:
                asked[row.reason] = asked.get(row.reason, 0) + 1
                if taken or raising:
                    self.says_yes[row.reason] = asked[row.reason]
                    if raising:
                        self.raises.add(row.reason)
                    return
            if taken or row.guard is None:
                return

    def _world(self, n: int, held: str | None, words: dict[str, str], queued: list[int]) -> None:
        """What the world does for the guard ``held`` at transition ``n``."""
        if held is None:
            return
        if held == "is_cancelled" and words.get("at") == "start":
            self.cancelled = True
        elif held == "deadline_passed" and words.get("at") == "start":
            self.late_after_reads = 1
        elif held == "hook_raised" and "reply" in words:
            self.hook_on_reply = len(self.replies)
        elif held == "repeats_last_call":
            number, before = queued[0], max(self.outcomes)  # the call made last
            self.args[number] = self.args[before]
            if before in self.names:
                self.names[number] = self.names[before]
        elif held == "tool_calls_exhausted":
            self._cap_reached(n, queued[0])
        elif held == "is_cycling":
            made = sorted(self.outcomes)[-4:]
            for number, arg in zip(made, ("a", "b", "a", "b"), strict=True):
                self.args[number] = f"cycle {arg}"
        elif held == "budget_spent":
            last = next(item for item in reversed(self.replies) if isinstance(item, _Pending))
            last.tokens = self.agent.settings.limits.token_budget or 0
        elif held == "cost_spent":
            last = next(item for item in reversed(self.replies) if isinstance(item, _Pending))
            last.cost = self.agent.settings.limits.cost_budget or 0.0
        elif held not in _AUTOMATIC and held not in self._user_guards():
            raise Unscriptable(f"the guard {held} holding (transition {n})")

    def _cap_reached(self, n: int, number: int) -> None:
        """Call ``number`` would exceed a cap: the run's, by the count alone; else the least per-tool cap's.

        For the least cap, the calls made last (as many as it allows) and call ``number`` are made as that tool.
        """
        made = sorted(self.outcomes)
        total = self.agent.settings.limits.total_tool_calls
        if total is not None and len(made) >= total:
            return
        caps = self.agent.settings.limits.max_tool_calls
        if not isinstance(caps, dict) or not self.capped:  # the total, not reached by the run's own calls
            raise Unscriptable(f"a tool-call cap reached by a sub-agent's calls (transition {n})")
        cap, name = min((caps[name], name) for name in self.capped)
        if cap > len(made):
            raise Unscriptable(f"a per-tool cap reached before its calls were made (transition {n})")
        for call in (*made[len(made) - cap :], number):
            self.names[call] = name

    def _user_guards(self) -> set[str]:
        """The guards of the agent's stop conditions (and of their checks raising): ``_count_checks`` scripts them."""
        names = {stop.guard.__name__ for stop in self.agent.settings.stop_conditions if stop.guard is not None}
        return names | {"condition_raised"}

    def model(self, made: int = 0) -> ScriptedModel:
        """The model that gives the script's replies, from reply ``made`` on (a resumed run's calls go on)."""
        return ScriptedModel(self, made)

    def reply(self, pending: _Pending) -> ModelResponse:
        """A scripted reply: text, or the turn's calls with their scripted arguments."""
        usage = Usage(pending.tokens, 0, cost=pending.cost) if pending.tokens or pending.cost else None
        if not pending.calls:
            text = self.answers.pop(0) if self.answers else "the scripted answer"
            return ModelResponse(Message("assistant", _ANSWER_TEXT.get(text, text)), pending.stop, usage)
        calls = tuple(
            ToolCall(f"call_{n}", self.names.get(n, self.tool), {"what": self.args[n]}) for n in pending.calls
        )
        return ModelResponse(
            Message("assistant", "", calls), pending.stop if pending.stop != "end_turn" else "tool_use", usage
        )


class _Pending:
    """A reply of the script, its stop reason, tokens and cost settled once the rest of the path is read."""

    def __init__(self, calls: list[int]) -> None:
        self.calls = calls
        self.stop = "end_turn"
        self.tokens = 0
        self.cost = 0.0


class ScriptedModel:
    """Gives the script's replies in order, raising its errors."""

    def __init__(self, script: Script, made: int) -> None:
        self.script = script
        self.calls = made

    def complete(self, messages: Sequence[Message], tools: list[Any]) -> ModelResponse:
        """The next scripted reply."""
        item = self.script.replies[self.calls]
        self.calls += 1
        if isinstance(item, BaseException):
            raise item
        assert isinstance(item, _Pending)
        return self.script.reply(item)


_ANSWER_TEXT = {"ok": "the scripted answer", "retryable": "send me back", "final": "break the check"}
_AUTOMATIC = frozenset({
    "has_no_tool_calls", "has_pending_calls", "is_truncated", "is_refusal", "context_overflowed",
    "output_invalid", "output_rejected", "compacts_history", "asks_tools_while_finalizing",
    "steps_exhausted", "failures_exhausted", "tool_calls_exhausted",
})  # fmt: skip
"""Guards that hold by the script's replies and outcomes alone."""


def _turn_sizes(plan: Plan) -> list[int]:
    """The tool calls each model call's turn asks for on the path: "2 or more" calls are as many as it reads.

    Those made, and the one a stop on the next call (a repeat, a cap) reads, which the turn asks for but never makes.
    """
    sizes: list[int] = []
    for _, choice in plan:
        if any(word.startswith(("reply:", "model:")) for word in choice):
            sizes.append(0)
        if sizes and any(word.startswith("tool:") or word in _NEXT_CALL for word in choice):
            sizes[-1] += 1
    return sizes


_NEXT_CALL = frozenset({"held:repeats_last_call", "held:tool_calls_exhausted"})
"""Stops that read the turn's next call (``queued[0]``)."""


def _said(what: str) -> str:
    return {"cancelled": "cancelled while it ran", "late": "past the deadline while it ran"}.get(what, what)


def answer_check(value: str) -> str:
    """The scripted answers' validator: one is sent back, one breaks the check, the rest pass."""
    if value == _ANSWER_TEXT["retryable"]:
        raise Retry("the scripted check sends this answer back")
    if value == _ANSWER_TEXT["final"]:
        msg = "the scripted check broke"
        raise RuntimeError(msg)
    return value


def forced(stop: StopCondition, script: Script) -> StopCondition:
    """A copy of ``stop`` whose check answers yes (or raises) exactly on the call of it the path says.

    The count is the script's, so an agent that resumes the run goes on counting where the cut one stopped.
    """
    yes = script.says_yes.get(stop.reason)
    raises = stop.reason in script.raises

    def check(view: Any) -> bool:
        script.asked[stop.reason] = asked = script.asked.get(stop.reason, 0) + 1
        if yes is not None and asked == yes and raises:
            msg = "the scripted check raised"
            raise RuntimeError(msg)
        return yes is not None and asked == yes

    check.__name__ = stop.guard.__name__ if stop.guard is not None else stop.reason
    # A guardrail ("input", "answer") is checked at its own checkpoint, not where a stop at its state would be.
    at: State | str = next((name for name, (place, _) in GUARDRAILS.items() if place in stop.at), stop.state)
    return StopCondition(stop.reason, at, check, stop.description, policy="raise")
