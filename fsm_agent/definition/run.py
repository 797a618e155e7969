"""The one mutable object of a run: its position and the counters the guards read.

A plain class compared by identity, one per run, so nothing about a run lives
on the agent or the machine.  It knows no clock, thread or event loop, and
only the core changes it: the stepper and its helpers (``fsm_agent.core``).
A driver hands the stepper what it saw from outside (the ``elapsed`` seconds,
a cancel, a failed hook) as events (``core.outside``), never writing a field
itself; ``tests/core/test_one_writer.py`` holds the package to that.  What
users' stop conditions and models are handed to read is a view of it
(``definition.views``).
"""

from __future__ import annotations

from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from fsm_agent.definition.limits import Limits
from fsm_agent.definition.states import AwaitModel, State
from fsm_agent.records import ChildOutcome, Message, ModelResponse, Step, ToolCall, Transition, Usage
from fsm_agent.tools import ToolResult

if TYPE_CHECKING:
    from fsm_agent.definition.stops import Stop
    from fsm_agent.definition.table import Row, Table

Signature = tuple[str, str]
Counters = dict[str, list[int | float | None]]
Reader = tuple[str, Callable[[Any], int | float | None], Callable[[Limits], int | float | None]]
"""A meter as ``Run.counters`` reads it: its name, the reader of its count from a run, and its limit."""


def signature(call: ToolCall) -> Signature:
    """Identify a tool call by name and canonical arguments, so key order does not matter."""
    if call.raw_arguments is not None:
        return call.name, "raw:" + call.raw_arguments
    arguments = call.canonical_arguments
    # Arguments a model could not have sent as JSON still need a stable identity.
    return call.name, repr(call.arguments) if arguments is None else arguments


class Meter(NamedTuple):
    """One counter against its limit, as ``Step.counters``, the status line and the evidence show it.

    ``used`` names the attribute of ``Run`` holding the count, by dotted path (``"counts.turns"``);
    ``limit`` reads the ceiling from the run's ``Limits`` (``None``: no limit)
    and ``bound`` names the ``Limits`` field that sets it.  ``moved_on``: the
    ``(state, trigger)`` pairs whose outcome moves the count (``("*", "*")``:
    every edge), which ``Table.increments`` answers from.
    """

    name: str
    used: str
    limit: Callable[[Limits], int | float | None]
    bound: str | None = None
    moved_on: tuple[tuple[str, str], ...] = ()


class Place:
    """Where a run is: its state, the transitions that led there, and how and why it stopped."""

    __slots__ = (
        "earlier_limits",
        "evidence",
        "final",
        "finalize_evidence",
        "finalizing",
        "frozen",
        "held",
        "reason",
        "replied",
        "retry_model",
        "state",
        "trace",
        "unfinished",
    )

    def __init__(self) -> None:
        self.state: State = AwaitModel
        self.trace: list[Transition] = []
        self.frozen = False
        # The time and a cancel's why the driver told a frozen run: taken in when its batch's last outcome is replayed.
        self.held: tuple[float | None, str | None] = (None, None)
        # The stop that a finalize call is answering for, once one was taken, and that stop's evidence.
        self.finalizing: str | None = None
        self.finalize_evidence: dict[str, Any] = {}
        # The trigger a model outcome implies, from the stepper's accept_* until its step() fires it.  A reply
        # kept before its after_model hooks (``Journal.keep_reply``) is written with it, so it is never asked again.
        self.replied: str | None = None
        # Set by resume(retry=True): a model_error run may call the model again.
        self.retry_model = False
        # The limits the run ran under before each of its resume edges, by the edge's index in the trace (a
        # resume may lift them): what a fork needs to rebuild the run past the stop it was resumed from.
        self.earlier_limits: tuple[tuple[int, Limits], ...] = ()
        # The call that was still running when the deadline passed or the task was cancelled.
        self.unfinished: str | None = None
        self.final = ""
        self.reason: str | None = None
        self.evidence: dict[str, Any] = {}


class Counts:
    """What a run has used so far: turns, calls, failures, tokens, dollars, seconds, and the cycle guard's memory."""

    __slots__ = (
        "cache_read_tokens",
        "cache_write_tokens",
        "calls_by_tool",
        "cancel_why",
        "cancelled",
        "compacted_turn",
        "cost",
        "elapsed",
        "failures",
        "input_tokens",
        "last_signature",
        "output_retries",
        "output_tokens",
        "priced",
        "reasoning_tokens",
        "recent",
        "tool_calls",
        "turns",
        "unpriced",
    )

    def __init__(self, cycle_window: int) -> None:
        # Model calls made so far; the current turn's index is turns - 1.
        self.turns = 0
        self.failures = 0
        self.tool_calls = 0
        self.calls_by_tool: dict[str, int] = {}
        self.last_signature: Signature | None = None
        # (signature, result) of the latest executed calls, for the cycle guard; bounded by cycle_window, given by
        # position: deque(maxlen=) costs twice as much (a dict for the keyword), on every run.
        self.recent: deque[tuple[Signature, str]] = deque((), cycle_window)  # noqa: RUF037
        self.input_tokens = 0
        self.output_tokens = 0
        # The parts of those the replies reported: cached input (read, written) and reasoning output.
        self.cache_read_tokens = 0
        self.cache_write_tokens = 0
        self.reasoning_tokens = 0
        # US dollars of the calls priced (a sub-agent's calls each count here), and the calls whose price is unknown.
        self.cost = 0.0
        self.priced = 0
        self.unpriced = 0
        # Told by the driver before each transition or after each call; a replayed parallel batch keeps its plan's.
        self.elapsed = 0.0
        self.cancelled = False
        self.cancel_why = ""
        # Output retries taken so far against the agent's output_retries; the turn that overflowed (-1: none).
        self.output_retries = 0
        self.compacted_turn = -1

    @property
    def tokens(self) -> int:
        """Input plus output tokens reported so far."""
        return self.input_tokens + self.output_tokens

    def usage(self) -> Usage:
        """The run's usage so far: its tokens with their parts, and its cost (None if a call was unpriced)."""
        return Usage(
            self.input_tokens,
            self.output_tokens,
            self.cache_read_tokens,
            self.cache_write_tokens,
            self.reasoning_tokens,
            None if self.unpriced else self.cost,
        )

    @property
    def seconds(self) -> float:
        """``elapsed`` to the microsecond, as the counters show it (arithmetic: ``round`` is far slower)."""
        return int(self.elapsed * 1e6 + 0.5) / 1e6


class Talk:
    """The conversation: messages, steps, the latest reply, what the model was sent, and a typed answer's check."""

    __slots__ = (
        "compact_error",
        "compacting",
        "context_head",
        "context_start",
        "io",
        "last_error",
        "last_response",
        "messages",
        "output",
        "output_checked",
        "output_plain",
        "output_problem",
        "prior",
        "sent",
        "steps",
    )

    def __init__(self, messages: list[Message], prior: int) -> None:
        self.messages = messages
        # Leading messages that came before this run (the system prompt and a continued conversation's history):
        # the counters, the viewer and the telemetry read only the messages after them.
        self.prior = prior
        self.steps: list[Step] = []
        # What each model and tool call was sent and gave back (core.exchanges): a stored run's recording.
        self.io: list[Any] = []
        self.last_error: str | None = None
        self.last_response: ModelResponse | None = None
        # A compacted history: the model is sent context_head, then the messages from context_start on, while
        # messages keeps everything; compacting says the compaction is due, compact_error why it failed.  sent:
        # how many messages the model call of the current turn was sent, when compaction or history processors
        # changed them (0: the whole conversation).
        self.context_head: list[Message] | None = None
        self.context_start = 0
        self.compacting = False
        self.compact_error = ""
        self.sent = 0
        # A typed agent's check of the latest answer: done or not, its value, or why it is not accepted
        # (and whether asking again may help).
        self.output_checked = False
        self.output: Any = None
        self.output_problem: tuple[tuple[str, ...], bool] | None = None
        # The accepted value in JSON form, which a snapshot keeps (None: none, or none JSON can hold).
        self.output_plain: Any = None


class Calls:
    """The tool calls of the current turn: not run yet, run but not replayed, their approvals; a fork's carried ones."""

    __slots__ = (
        "approvals",
        "call_ids",
        "carried",
        "carried_down",
        "child_stop",
        "cut_children",
        "cut_counted",
        "cut_shares",
        "cuts_taken_back",
        "pending",
        "prepaid",
        "ran",
        "to_approve",
    )

    def __init__(self) -> None:
        # Tool calls of the current turn not executed yet; in ExecuteTool, pending[0] is the call about to run.
        self.pending: deque[ToolCall] = deque()
        # Outcomes of calls that ran (a parallel batch) but are not replayed through the machine yet, by call id.
        self.ran: dict[str, ToolResult] = {}
        # Decisions on calls that need approval, by call id: True runs it, False or a reason text rejects it.
        self.approvals: dict[str, bool | str] = {}
        # Pending calls that wait for a person's decision, fixed when the reply arrived: the run keeps them, so
        # whichever agent, driver or process resumes it, an undecided call never runs (an agent's approve= only adds).
        self.to_approve: set[str] = set()
        # Every tool call id the conversation holds, so a reply reusing one gets a fresh one (None: not gathered
        # yet; gathered from the messages at the first reply with calls, so a loaded or continued run needs none).
        self.call_ids: set[str] | None = None
        # A sub-agent's stop that its tool passes on (on_child_stop="raise"), until child_stopped takes it.
        self.child_stop: dict[str, Any] | None = None
        # What the run of each sub-agent call cut in flight (the deadline, a cancel) had spent, by call id: counted
        # at the cut, so the call made again adds only what its child's run spends beyond it (core.ledger).
        self.cut_children: dict[str, ChildOutcome] = {}
        # What every cut of each such call counted, added up, until an outcome answers the call: its exchange keeps
        # it then (core.exchanges), so an outcome a fork takes past its fork point brings it too (fork_spend).
        self.cut_counted: dict[str, ChildOutcome] = {}
        # Each cut's share, where it was counted: (transitions taken before it, call id, what it counted).  A replay
        # or a fork's rebuild, whose cuts read no child in flight, counts each again at the same point (fork_spend).
        self.cut_shares: list[tuple[int, str, ChildOutcome]] = []
        # Where the run, made a fork, took back what cuts counted of calls unanswered at its fork point (by the
        # transitions before it): a replay or a rebuild of the fork takes it back there too (ledger.uncount_cuts).
        self.cuts_taken_back: list[int] = []
        # On a fork: the outcomes of calls the source run completed after the fork point, as (tool name, arguments
        # as canonical JSON, result); a call of the fork asking the same takes one instead of being made again.
        self.carried: list[tuple[str, str, ToolResult]] = []
        # On a fork: for each sub-agent call the fork makes again (rerun), as (tool name, arguments), the carried
        # outcomes of the source's sub-agent run, handed to the new child run so its own calls are not made again.
        self.carried_down: list[tuple[str, str, list[tuple[str, str, ToolResult]]]] = []
        # Of the outcomes handed to this run (carried, taken, or carried down), those a cut counted already, named by
        # where each came from (reused_from; core.hand_down): what the run reports as spent leaves them out, taken
        # back from a store too (drivers.cut_spend), and its sub-agent runs are handed the marks with the outcomes.
        self.prepaid: set[str] = set()


class Faults:
    """What raised: a failed model call (model_error), a strict hook (hook_error), a user's check."""

    __slots__ = ("condition_error", "condition_name", "hook_error", "model_exception", "streamed")

    def __init__(self) -> None:
        self.model_exception: BaseException | None = None
        self.streamed = ""  # the text a streaming model had shown of a reply that never came whole
        self.hook_error: BaseException | None = None
        self.condition_error: BaseException | None = None
        self.condition_name = ""


RECORDS: Mapping[str, type] = {"at": Place, "counts": Counts, "talk": Talk, "calls": Calls, "faults": Faults}
"""The records a run is split into, by the attribute of ``Run`` that holds each."""


def has_path(path: str) -> bool:
    """``path`` names an attribute of a run: of ``Run`` or, dotted (``"counts.turns"``), of one of its records."""
    record, dot, name = path.partition(".")
    if not dot:
        return hasattr(Run, path)
    return record in RECORDS and "." not in name and hasattr(RECORDS[record], name)


class Run:
    """One run, split into records by what they hold; the guards are predicates over it.

    ``at`` (where it is), ``counts`` (what it used), ``talk`` (the
    conversation), ``calls`` (the current turn's tool calls) and ``faults``
    (what raised); the run's settings stay on it.  Read by dotted path
    (``run.counts.turns``): a forwarding property would cost four times a slot
    read, on every transition.
    """

    __slots__ = (
        "at",
        "calls",
        "counts",
        "faults",
        "limits",
        "meters",
        "output_retry_limit",
        "policies",
        "readers",
        "rows",
        "table_stops",
        "talk",
    )

    def __init__(
        self,
        limits: Limits,
        messages: list[Message],
        *,
        table: Table,
        policies: Mapping[str, str] | None = None,
        prior: int = 0,
        output_retries: int = 0,
    ) -> None:
        self.limits = limits
        self.at = Place()
        self.counts = Counts(limits.cycle_window or 1)
        self.talk = Talk(messages, prior)
        self.calls = Calls()
        self.faults = Faults()
        self.policies: Mapping[str, str] = policies or {}
        self.meters: tuple[Meter, ...] = table.meters
        self.readers: tuple[Reader, ...] = table.readers
        self.rows: Mapping[tuple[State, str], Sequence[Row]] = table.index
        self.table_stops: Mapping[str, Stop] = table.stop_for
        self.output_retry_limit = output_retries  # a typed answer's retries (the stepper sets its agent's)

    def counters(self) -> Counters:
        """Every counter against its limit, ``[used, limit]`` with ``None`` for no limit."""
        limits = self.limits
        return {name: [read(self), limit(limits)] for name, read, limit in self.readers}
