"""What observers see: one event per transition, call events around model and tool calls, and the hook registry.

Hooks and streams are observers: they receive frozen records and cannot
change the run.  A hook that raises is logged and the run goes on, unless the
agent was built with ``strict_hooks=True``; then the run stops at its next
transition out of a non-terminal state with reason ``hook_error``.  An
observer handed to a run (``observers=``, the file of ``log=``) fails the same way.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import json
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal, TextIO, get_args

import attrs

from fsm_agent.definition.states import STATES
from fsm_agent.jsontext import dumps
from fsm_agent.records import ModelResponse, RunResult, ToolCall, Transition, plain

if TYPE_CHECKING:
    import logging


def logger() -> logging.Logger:
    """The package's logger, ``logging.getLogger("fsm_agent")``: what a raising hook or a failed write is told to.

    Why a function: most runs log nothing, and ``logging`` (with the
    ``traceback``, ``string`` and ``textwrap`` it loads) was 3.7% of the
    instructions of ``import fsm_agent``.  It loads when something is first
    logged, or with ``transitions`` as the first agent is built.
    """
    import logging

    return logging.getLogger("fsm_agent")


HookName = Literal[
    "transition",
    "failed",
    "before_model",
    "after_model",
    "before_tool",
    "after_tool",
    "text",
    "unfinished",
    "paused",
    "enter:AwaitModel",
    "enter:CheckTruncation",
    "enter:Dispatch",
    "enter:ExecuteTool",
    "enter:Done",
    "enter:Failed",
    "leave:AwaitModel",
    "leave:CheckTruncation",
    "leave:Dispatch",
    "leave:ExecuteTool",
    "leave:Done",
    "leave:Failed",
]
"""Every hook name, for the type checker; ``HOOK_NAMES`` is the same list at run time."""
HOOK_NAMES: tuple[str, ...] = get_args(HookName)
_STATE_HOOKS = {f"{side}:{state}" for side in ("enter", "leave") for state in STATES}
if {name for name in HOOK_NAMES if ":" in name} != _STATE_HOOKS:
    msg = "HookName must name every state's enter and leave hooks, and no other state hook"
    raise AssertionError(msg)


@attrs.frozen
class TransitionEvent:
    """One transition of a run, with the counters after it and the payload that moved it.

    ``response`` is set on edges moved by a model reply, ``error`` when the
    model call failed, ``tool_call`` on edges out of ``Dispatch`` into
    ``ExecuteTool`` (the call about to run) and out of ``ExecuteTool`` (the call
    that ran, with ``tool_result`` and ``tool_error``).  ``evidence`` is set on
    the edge into ``Failed``; ``result`` on the edge into ``Done`` or ``Failed``; ``paused`` on the edge that
    leaves the run waiting for a person's decision (the paused result, with the snapshot to resume it from).
    """

    seq: int
    source: str
    trigger: str
    dest: str
    guard: str | None
    reason: str | None
    counters: dict[str, list[int | float | None]]
    response: ModelResponse | None = None
    error: str | None = None
    tool_call: ToolCall | None = None
    tool_result: str | None = None
    tool_error: str | None = None
    evidence: dict[str, Any] | None = None
    result: RunResult | None = None
    run_id: str = ""
    """The run the event belongs to (``AgentRun.run_id``): one agent's hooks see every run of it."""
    paused: RunResult | None = None
    """The paused result (reason ``"paused"``, with its snapshot) on the edge that leaves the run waiting for a
    decision: a reader of ``Agent.stream`` has no other way to it."""
    reused_from: str | None = None
    """On a fork, the edge out of ``ExecuteTool`` of a call not made but taken from the source's outcome: the
    source's call (``Step.reused_from``).  No ``before_tool`` or ``after_tool`` is heard for such a call."""

    @property
    def transition(self) -> Transition:
        """The edge alone, as it appears in ``RunResult.trace``."""
        return Transition(self.source, self.trigger, self.dest, self.guard, self.reason)

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict: the edge, counters and payload (the final result is left to ``RunResult.to_dict``)."""
        out: dict[str, Any] = {
            "seq": self.seq,
            "source": self.source,
            "trigger": self.trigger,
            "dest": self.dest,
            "guard": self.guard,
            "reason": self.reason,
            "counters": self.counters,
        }
        if self.response is not None:
            out["response"] = {
                "content": self.response.message.content,
                "tool_calls": [plain(c) for c in self.response.message.tool_calls],
                "stop_reason": self.response.stop_reason,
                "usage": None if self.response.usage is None else plain(self.response.usage),
            }
            if self.response.message.provider_data is not None:
                # The opaque content the provider needs back, so a log alone can rebuild the conversation.
                out["response"]["provider_data"] = plain(self.response.message.provider_data)
        if self.error is not None:
            out["error"] = self.error
        if self.tool_call is not None:
            out["tool_call"] = plain(self.tool_call)
        if self.tool_result is not None:
            out["tool_result"] = self.tool_result
            out["tool_error"] = self.tool_error
        if self.reused_from is not None:
            out["reused_from"] = self.reused_from
        if self.evidence is not None:
            out["evidence"] = self.evidence
        return out


@attrs.frozen
class CallEvent:
    """A model or tool call about to happen (``before_*``) or just finished (``after_*``).

    Also what ``unfinished`` (an exception left the run where it was, named by
    ``error``) and ``paused`` (the run waits for a person's decision on
    ``tool_call``) hooks receive.
    """

    kind: str
    turn: int
    counters: dict[str, list[int | float | None]]
    tool_call: ToolCall | None = None
    response: ModelResponse | None = None
    error: str | None = None
    tool_result: str | None = None
    tool_error: str | None = None
    run_id: str = ""
    """The run the call belongs to (``AgentRun.run_id``)."""
    resumed: bool = False
    """True for every call event of a run handle that goes on from a run begun before (``Agent.resume``, a fork):
    the run was under way, though its ``before_model`` of turn 1 (a run cut before its first transition) looks as a
    fresh run's does."""


@attrs.frozen
class TextDelta:
    """A piece of the model's reply text, as the provider streams it, before the reply is complete.

    Delivered to ``text`` hooks and yielded by ``stream``/``astream``
    between the transitions of the model call, when the model can stream
    (``complete_stream``/``acomplete_stream``).  The machine does not see
    them: the ``replied`` transition still fires once the whole reply is in,
    and only that reply counts (a cut or refused reply streams its text too).
    """

    text: str
    turn: int = 0
    run_id: str = ""

    def to_dict(self) -> dict[str, Any]:
        """A JSON-ready dict, shaped apart from a transition's by its ``text`` key."""
        return {"text": self.text, "turn": self.turn}


Hook = Callable[[Any], object]


class Hooks:
    """Callbacks by hook name; calling them never lets an observer's exception break the run."""

    def __init__(self) -> None:
        self._by_name: dict[str, list[Hook]] = {}
        # Whether any hook is registered: what bool(hooks) says, read by every run without calling __bool__.
        self.active = False

    def add(self, name: str, hook: Hook) -> None:
        """Register ``hook`` under ``name`` (one of ``HOOK_NAMES``); an ``async def`` hook is a ``TypeError``."""
        if name not in HOOK_NAMES:
            msg = f"unknown hook {name!r}; use one of: {', '.join(HOOK_NAMES)}"
            raise ValueError(msg)
        if not callable(hook):
            msg = f"hook for {name!r} must be callable, got {type(hook).__name__}"
            raise TypeError(msg)
        if inspect.iscoroutinefunction(hook):
            # Every driver calls hooks and none awaits them: its body would never run.
            msg = f"hook for {name!r} is an async def, which is called, not awaited: make it a plain def"
            raise TypeError(msg)
        self._by_name.setdefault(name, []).append(hook)
        self.active = True

    def __bool__(self) -> bool:
        return bool(self._by_name)

    def get(self, name: str) -> list[Hook]:
        """The hooks registered under ``name``, in registration order."""
        return self._by_name.get(name, [])

    def call(self, name: str, event: TransitionEvent | CallEvent | TextDelta) -> BaseException | None:
        """Call every hook of ``name``; return the first exception one raised (after logging it), else None."""
        first: BaseException | None = None
        for hook in self._by_name.get(name, ()):
            try:
                hook(event)
            except Exception as exc:  # noqa: BLE001 - logged: ruff knows a logger, not a call that returns one
                logger().exception("fsm_agent hook %r (%s) raised", name, getattr(hook, "__qualname__", hook))
                first = first or exc
        return first

    def announce(self, event: TransitionEvent, failed: bool) -> BaseException | None:
        """A transition's hooks, in order: leave, enter, transition, failed; the first exception one raised."""
        raised = self.call(f"leave:{event.source}", event)
        raised = self.call(f"enter:{event.dest}", event) or raised
        raised = self.call("transition", event) or raised
        return (self.call("failed", event) or raised) if failed else raised


def notify(observers: Iterable[Callable[[Any], object]], event: object) -> BaseException | None:
    """Hand ``event`` to every observer as ``Hooks.call`` hands it to hooks; the first exception one raised, else None.

    An observer (``observers=``, the file of ``log=``, a text observer) is
    a watcher like a hook: one that raises is logged and the others are
    still told, and the run goes on, unless the agent has ``strict_hooks``.
    """
    first: BaseException | None = None
    for observer in observers:
        try:
            observer(event)
        except Exception as exc:  # noqa: BLE001 - logged (as in Hooks.call)
            name = getattr(observer, "__qualname__", None) or type(observer).__qualname__
            logger().exception("fsm_agent observer (%s) raised", name)
            first = first or exc
    return first


class JsonlLog:
    """A ready-made ``transition`` hook writing one JSON object per line, readable by people and by the diagrams.

    Use ``agent.on("transition", JsonlLog(path))``, or ``agent.run(q, log=path)``
    which opens and closes one for that run.  Lines are flushed as they are
    written, so a crashed process leaves every transition it made.
    """

    def __init__(self, target: str | Path | TextIO) -> None:
        if isinstance(target, str | Path):
            self._file: TextIO = Path(target).open("a", encoding="utf-8")  # noqa: SIM115 - closed in close()
            self._owned = True
            return
        # Checked now, not at the first line: a run's log must not fail after its first call was made.
        binary = isinstance(target, io.IOBase) and not isinstance(target, io.TextIOBase)
        if binary or not callable(getattr(target, "write", None)):
            kind = f"a binary file ({type(target).__name__})" if binary else type(target).__name__
            msg = f"log must be a path or a text file open for writing, got {kind}"
            raise TypeError(msg)
        if getattr(target, "closed", False):
            msg = f"log must be a path or a text file open for writing, got a closed {type(target).__name__}"
            raise ValueError(msg)
        writable = getattr(target, "writable", None)
        if callable(writable) and not writable():
            msg = f"log must be a path or a text file open for writing, got a {type(target).__name__} open for reading"
            raise ValueError(msg)
        self._file, self._owned = target, False

    def __call__(self, event: TransitionEvent) -> None:
        # Lone surrogates (half an emoji from a provider) are escaped, so the line is valid UTF-8 and reads back exact.
        self._file.write(dumps(event.to_dict(), default=str) + "\n")
        self._file.flush()

    def close(self) -> None:
        """Close the file if this log opened it."""
        if self._owned:
            self._file.close()


def read_log(path: str | Path) -> tuple[Transition, ...]:
    """The transitions recorded in a JSON Lines log, in order (what the run-path diagram needs)."""
    entries = []
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                data = json.loads(line)
                entries.append(Transition(data["source"], data["trigger"], data["dest"], data["guard"], data["reason"]))
            except (ValueError, KeyError, TypeError) as exc:
                msg = f"{path}:{number}: not a transition line of an fsm_agent log ({exc})"
                raise ValueError(msg) from exc
    return tuple(entries)


@contextlib.contextmanager
def log_observers(path: str | Path | None) -> Iterator[list[Callable[[TransitionEvent], None]]]:
    """The observers of a run's ``log=`` argument: a ``JsonlLog`` on ``path``, closed after the run (none for None)."""
    if path is None:
        yield []
        return
    log = JsonlLog(path)
    try:
        yield [log]
    finally:
        try:
            log.close()
        except Exception:  # noqa: BLE001 - a line the disk refused, flushed again as the file closes: the result stands
            logger().exception("fsm_agent: the log %s could not be closed", path)
