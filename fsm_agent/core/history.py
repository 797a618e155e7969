"""A run that continues a conversation: the messages it starts from, built and checked once, before anything runs.

The earlier conversation is an earlier ``RunResult`` or a sequence of
``Message`` records.  Its system messages are dropped, since the agent's own
system prompt leads the new run once, and the rest is kept as it is, provider
data included, so each adapter sends thinking blocks, reasoning items and
signatures back the way its provider requires.  Every provider refuses a tool
call without its answer and an answer without its call, so a history that
holds one is refused here, naming it, before anything is written or called.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from typing import Any

from fsm_agent.records import Message, RunResult
from fsm_agent.tools.calling import awaited_within, in_daemon_worker, settle, within_deadline

History = RunResult | Sequence[Message]
"""What ``history=`` accepts: an earlier result (its ``messages``) or the messages themselves."""

ROLES = frozenset({"system", "user", "assistant", "tool"})


def opening(system: str, user_input: str, history: History | None) -> tuple[list[Message], int]:
    """The messages a run starts with, and how many of them came before it (the system prompt and the history).

    The count lets the snapshot check, the viewer and the telemetry tell
    this run's own messages from the conversation it continues.
    """
    messages = [Message("system", system)] if system else []
    if history is not None:
        messages.extend(earlier(history))
    prior = len(messages)
    messages.append(Message("user", user_input))
    return messages, prior


def earlier(history: History) -> list[Message]:
    """The history's messages without its system messages; a wrong item or an unpaired tool call is refused."""
    items = history.messages if isinstance(history, RunResult) else history
    if isinstance(items, str | bytes) or not isinstance(items, Sequence):
        msg = f"history must be a RunResult or a sequence of Message, got {type(history).__name__}"
        raise TypeError(msg)
    kept: list[tuple[int, Message]] = []
    for index, item in enumerate(items):
        if not isinstance(item, Message):
            msg = f"history[{index}] must be a Message, got {type(item).__name__}"
            raise TypeError(msg)
        if item.role not in ROLES:
            msg = f"history[{index}] has role {item.role!r}; a message is one of {', '.join(sorted(ROLES))}"
            raise ValueError(msg)
        if item.role != "system":
            kept.append((index, item))
    check_paired(kept)
    return [message for _, message in kept]


def check_paired(
    messages: list[tuple[int, Message]], *, where: str = "history", still_open: Collection[str] = ()
) -> None:
    """Each tool call is answered by a tool message before the next user or assistant message, and only once.

    That is where every provider wants the answers (OpenAI right after the
    call, Anthropic in the very next user turn), and where the engine itself
    puts them, a stopped run's calls included once it answers them.  The
    calls ``still_open`` names (those a run is still to make) are asked by the
    last messages and not answered yet: each must be.  A ``ValueError`` naming
    the messages at fault as ``where[index]``.
    """
    asked: dict[str, str] = {}  # open call id -> how the error names it
    unanswered: list[str] = []
    strays: list[str] = []
    for index, message in messages:
        if message.role == "tool":
            if asked.pop(message.tool_call_id or "", None) is None:
                strays.append(f"{where}[{index}] (answers {message.tool_call_id!r})")
            continue
        if message.role in ("user", "assistant"):
            unanswered.extend(asked.values())
            asked.clear()
        for call in message.tool_calls:
            asked[call.id] = f"{call.id!r} ({call.name}, asked in {where}[{index}])"
    unanswered.extend(named for call_id, named in asked.items() if call_id not in still_open)
    problems = []
    if unanswered:
        calls = ", ".join(unanswered)
        problems.append(f"{where} has tool calls no tool message answers: {calls}; answer them or leave them out")
    if strays:
        problems.append(f"{where} has tool messages answering no open call: {', '.join(strays)}; leave them out")
    lost = sorted(call_id for call_id in still_open if call_id not in asked)
    if lost:
        problems.append(f"{where} no longer asks the calls still to be made: {', '.join(map(repr, lost))}")
    if problems:
        msg = "; ".join(problems)
        raise ValueError(msg)


def compaction_problem(result: object, what: str = "compact") -> str | None:
    """Why a history made by ``compact`` or a history processor cannot be sent to the model (None: it can).

    It must be a non-empty list of ``Message`` whose tool calls are paired,
    as every provider requires; ``what`` names the function in the message.
    """
    if isinstance(result, Exception):
        return f"{what} raised {type(result).__name__}: {result}"
    if not isinstance(result, list) or not result:
        return f"{what} must return a non-empty list of Message, got {type(result).__name__} {str(result)[:80]!r}"
    strays = [f"[{i}] {type(item).__name__}" for i, item in enumerate(result) if not isinstance(item, Message)]
    if strays:
        return f"{what} must return a list of Message; not messages: {', '.join(strays[:5])}"
    try:
        check_paired(list(enumerate(result)))
    except ValueError as exc:
        return f"{what} returned a history providers refuse: {exc}"
    return None


def sendable(result: object, what: str) -> list[Message]:
    """``result`` if it is a history the model can be sent, else a ``ValueError`` saying why.

    What ``compaction_problem`` asks, and one user message at least: a
    processor that drops them all would send the model a conversation with
    no question in it (only a system prompt, or the model's own turns),
    which some providers refuse and the others answer with a guess.
    ``compact`` is not held to it: its history is followed by the run's
    later messages, and the question may be among them.
    """
    problem = compaction_problem(result, what)
    if problem is not None:
        raise ValueError(problem)
    assert isinstance(result, list)  # compaction_problem checked it
    if not any(message.role == "user" for message in result):
        roles = ", ".join(message.role for message in result[:10]) + (", ..." if len(result) > 10 else "")
        msg = f"{what} returned a history without a user message (roles: {roles}); keep one at least"
        raise ValueError(msg)
    return result


def processor_name(processor: object) -> str:
    """How an error names a history processor."""
    return f"history processor {getattr(processor, '__name__', type(processor).__name__)}"


def processed(
    messages: list[Message], processors: Sequence[Callable[..., Any]], timeout: float | None
) -> list[Message]:
    """What the history processors make of ``messages``, one after another; ``DeadlineError`` once ``timeout`` passes.

    Within the run's time left, on a daemon worker given up when it passes,
    as a typed answer's check and ``compact`` are: a processor may be a
    model's call of its own (a summary), which can hang as any call can.
    What a processor raises, or a history it makes that cannot be sent, is
    raised here: the call is not made (a ``model_error``).
    """
    if timeout is None:
        return _processed(messages, processors)
    return within_deadline(lambda: _processed(messages, processors), timeout, "history processors")


async def aprocessed(
    messages: list[Message], processors: Sequence[Callable[..., Any]], timeout: float | None
) -> list[Message]:
    """``processed`` on the event loop: an async processor awaited on it, a sync one on a thread.

    On a thread, so the loop is never held up: neither the other runs on it
    nor this run's heartbeat.  With a ``timeout`` the thread is a daemon
    worker, so one given up at the deadline never holds up the loop's exit.
    """
    import asyncio  # here, not at the top: import fsm_agent loads no asyncio

    work = _aprocessed(messages, processors, in_daemon_worker if timeout is not None else asyncio.to_thread)
    return await (work if timeout is None else awaited_within(work, timeout, "history processors"))


def _processed(messages: list[Message], processors: Sequence[Callable[..., Any]]) -> list[Message]:
    for processor in processors:
        messages = sendable(settle(processor(messages)), processor_name(processor))
    return messages


async def _aprocessed(
    messages: list[Message], processors: Sequence[Callable[..., Any]], on_thread: Callable[..., Any]
) -> list[Message]:
    for processor in processors:
        if inspect.iscoroutinefunction(processor):
            made = await processor(messages)
        else:
            made = await on_thread(processor, messages)
            if inspect.isawaitable(made):  # a sync function that returned a coroutine
                made = await made
        messages = sendable(made, processor_name(processor))
    return messages


def history_settings(
    processors: Iterable[Any], compact: Any, policies: Mapping[str, str]
) -> tuple[tuple[Callable[[list[Message]], Any], ...], Callable[[list[Message]], Any] | None]:
    """Check an agent's ``history_processors`` and ``compact``: callables, and compact exactly when its policy asks."""
    if (
        type(processors) is tuple
        and not processors
        and compact is None
        and policies.get("context_overflow") != "compact"
    ):
        return (), None  # most agents: nothing below to check
    processors = tuple(processors)
    for processor in processors:
        if not callable(processor):
            msg = f"history_processors must hold callables fn(messages) -> messages, got {type(processor).__name__}"
            raise TypeError(msg)
    if compact is not None and not callable(compact):
        msg = f"compact must be a callable fn(messages) -> messages, got {type(compact).__name__}"
        raise TypeError(msg)
    wanted = policies.get("context_overflow") == "compact"
    if wanted and compact is None:
        msg = "on_stop={'context_overflow': 'compact'} needs compact=fn, the function that shortens the history"
        raise ValueError(msg)
    if compact is not None and not wanted:
        msg = "compact= is called only with on_stop={'context_overflow': 'compact'}; give that policy too"
        raise ValueError(msg)
    return processors, compact
