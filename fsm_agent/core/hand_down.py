"""What a cut call's run completed, carried to the call made again: its entries, their key, how a call takes one.

A fork carries its source's outcomes to the calls it makes again
(``Calls.carried``), and a sub-agent call cut in flight hands what its
child's run completed down to the new run of the call made again
(``Calls.carried_down``), a level further down for each sub-agent below it.
The entries' text is written and read back in several places (the stepper,
the driver's events, the snapshot's checks, a fork); it is encoded and
decoded here only, so each of them reads it as the others wrote it.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from typing import TypeVar

import attrs

from fsm_agent.definition.run import Run
from fsm_agent.records import ToolCall
from fsm_agent.tools import ToolResult

R = TypeVar("R")
Carried = tuple[str, str, ToolResult]
"""A completed tool call's outcome kept for another run: (tool name, arguments as canonical JSON, result).

One a sub-agent of that run's sub-agent completed (a level further down)
has as arguments the JSON array text ``[arguments of the sub-agent call,
tool name, arguments]`` (``below``): arguments are always a JSON object,
so no call of the run itself ever matches it.
"""


@attrs.frozen
class HandDown:
    """What a cut sub-agent call's run hands down (``entries``), and which of them the cut counted (``counted``).

    Why per entry: a cut counts what its child's run did (ran, or took), and
    hands those down beside what the run was handed and never took, which
    counts where it is taken (a fork's) unless an earlier cut counted it.
    ``counted`` names the entries by where they came from (``reused_from``),
    which every handed outcome names, each a different call's.
    """

    entries: tuple[Carried, ...] = ()
    counted: frozenset[str] = frozenset()


def origins(entries: Iterable[Carried]) -> set[str]:
    """Where each of ``entries`` came from (``reused_from``): the names ``Calls.prepaid`` keeps of them."""
    return {result.reused_from for _, _, result in entries if result.reused_from is not None}


def canonical_arguments(arguments: object) -> str:
    """A call's arguments as canonical JSON text (sorted keys, no spaces): equal arguments, equal texts."""
    return json.dumps(arguments, ensure_ascii=False, sort_keys=True, separators=(",", ":"), default=repr)


def take_carried(run: Run, call: ToolCall) -> ToolResult | None:
    """The first of a fork's carried outcomes (``Calls.carried``) for ``call``'s tool and arguments, taken, or None."""
    entries, arguments = run.calls.carried, canonical_arguments(call.arguments)
    for i, (name, kept, held) in enumerate(entries):
        if name == call.name and kept == arguments:
            del entries[i]
            return held
    return None


def take_carried_down(run: Run, call: ToolCall) -> HandDown | None:
    """What was handed down for sub-agent call ``call`` (``Calls.carried_down``), taken, with its marks; or None.

    The entry made for ``call`` itself first (its id, ``down_key``), so two
    like calls cut in one reply each get their own child's outcomes; else the
    first of its tool and arguments made for no other pending call (a fork's,
    made again under new ids, or one kept before entries named their call).
    Which of them a cut counted (``Calls.prepaid``) goes with them, and leaves
    ``run``'s marks: taken, or dropped, they are no longer ``run``'s.
    """
    entries, arguments = run.calls.carried_down, canonical_arguments(call.arguments)
    alike = {i: down_parts(kept) for i, (name, kept, _) in enumerate(entries) if name == call.name}
    made_for = {i: for_id for i, (for_id, kept) in alike.items() if kept == arguments}
    pending = {waiting.id for waiting in run.calls.pending}
    own = next((i for i, for_id in made_for.items() if for_id == call.id), None)
    if own is None:
        own = next((i for i, for_id in made_for.items() if for_id not in pending), None)
    if own is None:
        return None
    taken = entries.pop(own)[2]
    counted = origins(taken) & run.calls.prepaid
    run.calls.prepaid -= counted
    return HandDown(tuple(taken), frozenset(counted))


def holds_down(run: Run, call: ToolCall) -> bool:
    """Whether ``run`` holds an entry handed down for ``call``'s tool and arguments, made for any call or none."""
    key = (call.name, canonical_arguments(call.arguments))
    return any((name, down_parts(arguments)[1]) == key for name, arguments, _ in run.calls.carried_down)


def down_key(call: ToolCall) -> str:
    """The arguments text an entry handed down for sub-agent call ``call`` is kept under: ``[call id, arguments]``.

    Why the id: a resume from the same snapshot keeps the call ids, so each
    call takes what its own cut child completed (``take_carried_down``); the
    arguments (canonical JSON) match a call made again under another id.
    """
    return json.dumps([call.id, canonical_arguments(call.arguments)], ensure_ascii=False, separators=(",", ":"))


def down_parts(text: str) -> tuple[str | None, str]:
    """A handed-down entry's call id (None where it names none: a fork's, or an older snapshot's) and arguments."""
    if text.startswith("["):
        made_for, arguments = json.loads(text)
        return str(made_for), str(arguments)
    return None, text


def down_problem(text: str) -> str | None:
    """Why a handed-down entry's arguments text is neither canonical arguments nor ``[call id, arguments]``; or None."""
    if not text.startswith("["):
        return None
    try:
        parts = json.loads(text)
    except ValueError:
        parts = None
    if isinstance(parts, list) and len(parts) == 2 and all(isinstance(part, str) for part in parts):
        return None
    return f"{text!r:.80} is not [call id, arguments]"


def below(run: Run) -> list[Carried]:
    """What ``run`` carries down for its own sub-agent calls, as outcomes its parent keeps one level further down.

    Why: the parent hands them to the new run of its call made again, which
    hands them on to the new run of its sub-agent call (``split_down``), so
    what a grandchild completed runs no more than what a child completed.
    """
    return [
        entry
        for name, arguments, outcomes in run.calls.carried_down
        for entry in one_down(name, down_parts(arguments)[1], outcomes)  # the calls made again there get new ids
    ]


def one_down(name: str, arguments: str, outcomes: Iterable[tuple[str, str, R]]) -> list[tuple[str, str, R]]:
    """The ``outcomes`` of the run of sub-agent call ``name`` (canonical ``arguments``), one level further down.

    Why one encoder: ``below`` (a cut run's, as results) and a fork's
    (``drivers.fork``, as the recording's results) write the same text,
    which ``split_down`` reads back at the next level.
    """
    return [
        (name, json.dumps([arguments, tool, kept], ensure_ascii=False, separators=(",", ":")), result)
        for tool, kept, result in outcomes
    ]


def below_problem(arguments: str) -> str | None:
    """Why a handed outcome's arguments text, one a level down (``below``), is not as ``below`` writes it; or None."""
    while arguments.startswith("["):
        try:
            path = json.loads(arguments)
        except ValueError:
            path = None
        if not (isinstance(path, list) and len(path) == 3 and all(isinstance(part, str) for part in path)):
            return f"{arguments!r:.80} is not [arguments of the sub-agent call, tool name, arguments]"
        if (problem := down_problem(path[0])) is not None:
            return problem
        arguments = path[2]
    return None


def split_down(outcomes: Iterable[Carried]) -> tuple[list[Carried], list[tuple[str, str, list[Carried]]]]:
    """A new sub-agent run's handed outcomes: its own calls', and its sub-agent calls' carried down (``below``)."""
    own: list[Carried] = []
    down: dict[tuple[str, str], list[Carried]] = {}
    for name, arguments, result in outcomes:
        if arguments.startswith("["):
            call_arguments, tool, kept = json.loads(arguments)
            down.setdefault((name, call_arguments), []).append((tool, kept, result))
        else:
            own.append((name, arguments, result))
    return own, [(name, arguments, kept) for (name, arguments), kept in down.items()]
