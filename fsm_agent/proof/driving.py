"""Drive a stop path through the real engine: whole, cut after any transition and resumed, or with every call gated.

``drive`` runs the path once.  ``drive_cut`` runs it to transition ``cut``,
takes the snapshot a store would hold then (through JSON text), and resumes
it with a fresh agent, as a crashed process and a new one would; the calls
each tool call made are counted across both, so a test sees that no call
that completed runs again and none is lost.  ``drive_gated`` holds every
tool call for a person's decision and approves each once the run pauses for
it, counting any call made before its decision.  The world of the path comes
from ``proof.scripted``.
"""

from __future__ import annotations

import json
from collections import Counter
from typing import Any

import attrs

from fsm_agent.core.cancellation import CancelToken
from fsm_agent.core.pricing import Price
from fsm_agent.drivers.agent import Agent
from fsm_agent.errors import AgentLoopError
from fsm_agent.proof.check import edge_text
from fsm_agent.proof.scripted import QUESTION, Plan, Script, Unscriptable, answer_check, forced
from fsm_agent.records import RunResult
from fsm_agent.tools import ToolRegistry


@attrs.frozen
class Driven:
    """How a driven path ended, and how many times each of its tool calls ran (by call id)."""

    result: RunResult
    runs: Counter[str]
    before_decision: tuple[str, ...] = ()
    """Calls that ran before a person decided on them (``drive_gated``): none, if the gate holds."""


class Scripted:
    """Agents set up as ``agent`` is, sharing one script, one clock and one count of tool calls."""

    def __init__(self, agent: Agent, plan: Plan) -> None:
        self.agent = agent
        self.plan = plan
        self.script = Script(agent, plan)
        self.runs: Counter[str] = Counter()
        self.decided: set[str] = set()
        self.gated = False
        self.before_decision: list[str] = []
        self._reads = 0

    def act(self, what: str, call_id: str) -> str:
        """The scripted tool: counts the call by its id, then succeeds or fails as the path says."""
        self.runs[call_id] += 1
        if self.gated and call_id not in self.decided:
            self.before_decision.append(call_id)
        number = next((n for n, arg in self.script.args.items() if arg == what and n in self.script.outcomes), None)
        if number is not None and self.script.outcomes[number]:
            msg = f"the scripted call {what!r} failed"
            raise RuntimeError(msg)
        return f"done: {what}"

    def clock(self) -> float:
        """Zero, or past the deadline from the read the path says on."""
        self._reads += 1
        late = self.script.late_after_reads
        return (self.agent.settings.limits.timeout or 0.0) if late is not None and self._reads > late else 0.0

    def build(self, made: int = 0) -> Agent:
        """A fresh scripted agent whose model goes on from reply ``made``."""
        registry = ToolRegistry()
        for name in (self.script.tool, *self.script.capped):  # every tool a per-tool cap names, as the agent has
            registry.register(self.act, name=name)
        settings = self.agent.settings
        kwargs: dict[str, Any] = {}
        if settings.output is not None:
            kwargs = {
                "output_type": str,
                "output_validators": [answer_check],
                "output_retries": settings.output.retries,
            }
        built = Agent(
            self.script.model(made),
            registry,
            limits=settings.limits,
            on_stop=dict(settings.on_stop),  # type: ignore[arg-type]  # the agent's own, already checked
            strict_hooks=settings.strict_hooks,
            clock=self.clock,
            stop_conditions=[forced(stop, self.script) for stop in settings.stop_conditions],
            compact=(lambda messages: messages[-1:]) if settings.compact else None,
            approve=(lambda call: True) if self.gated else None,
            prices=Price(input_per_mtok=0, output_per_mtok=0),  # the script's replies say what they cost
            **kwargs,
        )
        target = self.script.hook_on_reply
        if target is not None:

            def hook(event: Any) -> None:
                if event.turn == target:
                    msg = "the scripted hook raised"
                    raise RuntimeError(msg)

            built.on("after_model", hook)
        return built

    def token(self) -> CancelToken:
        """The run's cancel token: cancelled before it starts if the path says so."""
        token = CancelToken()
        if self.script.cancelled:
            token.cancel("the scripted cancel")
        return token

    def made_by(self, cut: int) -> int:
        """How many model calls the first ``cut`` transitions of the path made."""
        return sum(any(word.startswith(("reply:", "model:")) for word in choice) for _, choice in self.plan[:cut])


def _outcome(finish: Any) -> RunResult:
    try:
        result: RunResult = finish()
    except AgentLoopError as exc:
        return exc.result
    return result


def drive(agent: Agent, plan: Plan) -> RunResult:
    """Run ``plan`` through an agent set up as ``agent`` is, with the script's model, tools and world."""
    scripted = Scripted(agent, plan)
    return _outcome(lambda: scripted.build().run(QUESTION, cancel=scripted.token()))


def drive_cut(agent: Agent, plan: Plan, cut: int) -> Driven:
    """Run ``plan`` to transition ``cut``, then resume its snapshot (as JSON text) with a fresh agent to the end."""
    scripted = Scripted(agent, plan)
    run = scripted.build().start(QUESTION, cancel=scripted.token(), run_id="cut")
    for _ in range(cut):
        run.advance()
    text = json.dumps(run.snapshot())
    resumed = scripted.build(scripted.made_by(cut)).resume(text)
    return Driven(_outcome(resumed.finish), scripted.runs)


def drive_gated(agent: Agent, plan: Plan) -> Driven:
    """Run ``plan`` with every tool call held for a decision, approving each call once the run pauses for it."""
    scripted = Scripted(agent, plan)
    scripted.gated = True
    run = scripted.build().start(QUESTION, cancel=scripted.token(), run_id="gated")
    while run.state not in ("Done", "Failed"):
        if run.paused:
            waiting = {call.id: call for call in run.pending}
            scripted.decided.update(waiting)
            run.decide(dict.fromkeys(waiting, True))
        else:
            run.advance()
    return Driven(_outcome(run.finish), scripted.runs, tuple(scripted.before_decision))


@attrs.frozen
class Exercised:
    """The stop paths driven through the engine: those it took as the checker said, and the rest with why.

    ``cuts``: runs cut after a transition and resumed; ``crash_faults`` and
    ``gate_faults``: the paths where a tool call ran twice or not at all
    across a cut, or ran before its decision (none, if the ledger and the
    gate hold).
    """

    taken: tuple[str, ...]
    left_out: dict[str, str]
    cuts: int
    crash_faults: dict[str, str]
    gate_faults: dict[str, str]

    @property
    def ok(self) -> bool:
        """No call ran twice, none was lost, none ran before its decision."""
        return not self.crash_faults and not self.gate_faults


def exercise(agent: Agent, paths: dict[str, Plan]) -> Exercised:
    """Drive each path whole, cut after every transition and resumed, and with every call gated."""
    taken: list[str] = []
    left_out: dict[str, str] = {}
    crash: dict[str, str] = {}
    gate: dict[str, str] = {}
    cuts = 0
    for reason, plan in paths.items():
        expected = [edge for edge, _ in plan]
        try:
            whole = drive(agent, plan)
        except Unscriptable as exc:
            left_out[reason] = f"needs {exc}"
            continue
        if list(whole.trace) != expected:
            left_out[reason] = "the engine took another path: " + ", ".join(map(edge_text, whole.trace))
            continue
        taken.append(reason)
        for cut in range(1, len(plan)):
            cuts += 1
            driven = drive_cut(agent, plan, cut)
            twice = sorted(call for call, n in driven.runs.items() if n != 1)
            if list(driven.result.trace) != expected or twice:
                crash[reason] = f"cut after transition {cut}: " + (f"ran again: {twice}" if twice else "another path")
                break
        gated = drive_gated(agent, plan)
        if gated.before_decision or list(gated.result.trace) != expected:
            early = list(gated.before_decision)
            gate[reason] = f"ran before a decision: {early}" if early else "another path"
    return Exercised(tuple(taken), left_out, cuts, crash, gate)
