"""The abstract system of one agent, explored whole: its configs, its moves, and the questions asked of them.

Breadth first from the initial config, so the path found to any config is a
shortest one (among those through no sub-agent's counted calls, when there
are such).  Termination is a question about loops: a loop of equal configs
is a run that can go on forever, unless every move of it makes a call of a
turn that holds "2 or more" calls (the turn's calls are finite, so such a
loop ends) and no move of it calls the model (a loop through a model call
would refill them).  With no loop left, the longest path is the bound, in
transitions and in model calls.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping

from fsm_agent.definition.guards import Guard
from fsm_agent.definition.states import TERMINAL, State
from fsm_agent.persist.every import wants
from fsm_agent.proof.model import INITIAL, Config, Explorer, Move

CALLING = frozenset({str(State.AwaitModel), str(State.ExecuteTool)})
"""The states whose outcome transitions a store with ``every="call"`` writes as they are taken."""


class Graph:
    """Every config reachable from the start, the moves out of each, and how each was first reached."""

    def __init__(self, explorer: Explorer) -> None:
        self.explorer = explorer
        self.moves: dict[Config, list[Move]] = {}
        self.parent: dict[Config, tuple[Config, Move] | None] = {INITIAL: None}
        queue = deque([INITIAL])
        # A move through a sub-agent's calls is taken only once nothing is left to reach without one, so a path
        # found is one a script of the run's own replies can make whenever there is such a path.
        detours: deque[tuple[Config, Move]] = deque()
        while queue or detours:
            if not queue:
                before, move = detours.popleft()
                if move.after not in self.parent:
                    self.parent[move.after] = (before, move)
                    queue.append(move.after)
                continue
            config = queue.popleft()
            out = self.moves[config] = list(explorer.moves(config))
            for move in out:
                if move.after in self.parent:
                    continue
                if move.via_child:
                    detours.append((config, move))
                else:
                    self.parent[move.after] = (config, move)
                    queue.append(move.after)

    def path_to(self, config: Config) -> list[Move]:
        """The moves of a shortest run from the start to ``config`` (one through no sub-agent's calls if any is)."""
        moves: list[Move] = []
        step = self.parent[config]
        while step is not None:
            before, move = step
            moves.append(move)
            step = self.parent[before]
        return moves[::-1]

    def endings(self) -> dict[str, Config]:
        """Each reachable ending (``done`` or a stop reason) and its terminal config, first reached first."""
        out: dict[str, Config] = {}
        for config in self.parent:  # insertion order is breadth first
            if config.state in TERMINAL and config.reason is not None:
                out.setdefault(config.reason, config)
        return out

    # --- loops ------------------------------------------------------------------------------------------------

    def components(self) -> list[list[Config]]:
        """The strongly connected components (Tarjan's algorithm, without recursion), in reverse topological order."""
        index: dict[Config, int] = {}
        low: dict[Config, int] = {}
        on_stack: set[Config] = set()
        stack: list[Config] = []
        found: list[list[Config]] = []
        for root in self.moves:
            if root in index:
                continue
            work = [(root, 0)]
            while work:
                node, i = work.pop()
                if i == 0:
                    index[node] = low[node] = len(index)
                    stack.append(node)
                    on_stack.add(node)
                out = self.moves[node]
                if i < len(out):
                    work.append((node, i + 1))
                    nxt = out[i].after
                    if nxt not in index:
                        work.append((nxt, 0))
                    elif nxt in on_stack:
                        low[node] = min(low[node], index[nxt])
                    continue
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    found.append(component)
                if work:
                    parent = work[-1][0]
                    low[parent] = min(low[parent], low[node])
        return found

    def endless_loop(self) -> list[Move] | None:
        """A shortest run into a loop it can take forever (the loop last), or None: every run stops.

        A loop is finite only if it makes a call of a turn that holds "2 or
        more" calls and calls no model (which would refill the turn): so a loop
        through a model call, or one with no such call, is endless.
        """
        depth = {config: n for n, config in enumerate(self.parent)}  # breadth first: an order by distance
        best: list[Move] | None = None
        for component in self.components():
            members = set(component)
            for config in sorted(component, key=depth.__getitem__):
                for move in self.moves[config]:
                    if move.after not in members or (move.shrinks and not move.model_call):
                        continue
                    loop = self._loop_through(config, move, members, refills=move.model_call)
                    if loop is None:
                        continue
                    lasso = [*self.path_to(config), *loop]
                    if best is None or len(lasso) < len(best):
                        best, self.loop_start = lasso, len(lasso) - len(loop)
        return best

    loop_start = 0
    """Where the loop of the last ``endless_loop`` answer begins."""

    def _loop_through(self, start: Config, first: Move, members: set[Config], *, refills: bool) -> list[Move] | None:
        """A shortest loop from ``start`` through ``first`` back to ``start`` inside one component.

        Unless the loop calls the model (``refills``), it may not make a call
        of a "2 or more" turn, since such a call is a step down a finite turn.
        """
        if first.after == start:
            return [first]
        back: dict[Config, tuple[Config, Move] | None] = {first.after: None}
        queue = deque([first.after])
        while queue:
            config = queue.popleft()
            for move in self.moves[config]:
                if move.after not in members or move.after in back or (move.shrinks and not refills):
                    continue
                back[move.after] = (config, move)
                if move.after == start:
                    loop = [move]
                    step = back[config]
                    while step is not None:
                        loop.append(step[1])
                        step = back[step[0]]
                    return [first, *loop[::-1]]
                queue.append(move.after)
        return None

    # --- crashes ----------------------------------------------------------------------------------------------

    def crash_window(self, every: str) -> list[Move] | None:
        """The shortest run to a call that begins while an earlier call's outcome is not yet written, or None.

        The writes are the store's own rule (``persist.every.wants``, and with
        ``every="call"`` each transition that records a call's outcome), so a
        crash in such a window would run a completed call again.  A model
        call is a call too: its reply, unwritten when the turn's first tool
        call begins (``every="turn"``), is asked for again on resume.
        """
        start = (INITIAL, False)
        back: dict[tuple[Config, bool], tuple[tuple[Config, bool], Move] | None] = {start: None}
        queue = deque([start])
        while queue:
            here = queue.popleft()
            config, unwritten = here
            for move in self.moves[config]:
                if unwritten and (move.tool_call or move.model_call):
                    path = [move]
                    step = back[here]
                    while step is not None:
                        path.append(step[1])
                        step = back[step[0]]
                    return path[::-1]
                written = wants(every, move.after.state, False) or (every == "call" and move.entry.source in CALLING)
                after = (move.after, (unwritten or move.tool_call or move.model_call) and not written)
                if after not in back:
                    back[after] = (here, move)
                    queue.append(after)
        return None

    # --- approvals --------------------------------------------------------------------------------------------

    def approval_gap(self, holds: Mapping[State, Guard]) -> list[Move] | None:
        """The shortest run to a tool call made while it waits for a person's decision, or None.

        After a reply, and after each call, the turn's next call may be one
        the approval rule holds back.  A run whose next call is held waits in
        a state where ``holds`` (``definition.guards.HOLDS``, which the
        stepper reads to pause) declares a fact that is true then; a decision
        lets it go on.  A tool call made from a state without such a hold,
        or whose hold may be false while the call is undecided, is the gap.
        """
        explorer = self.explorer
        start = (INITIAL, False)
        back: dict[tuple[Config, bool], tuple[tuple[Config, bool], Move | None] | None] = {start: None}
        queue = deque([start])
        while queue:
            here = queue.popleft()
            config, undecided = here
            successors: list[tuple[tuple[Config, bool], Move | None]] = []
            if undecided:
                hold = holds.get(config.state)
                truth = explorer.truth(hold, config, {"undecided": True}) if hold is not None else frozenset({False})
                if True in truth:
                    successors.append(((config, False), None))  # it waits; a decision lets it go on
            for move in self.moves[config]:
                if move.tool_call and undecided and (not successors or False in truth):
                    path = [move]
                    step = back[here]
                    while step is not None:
                        if step[1] is not None:
                            path.append(step[1])
                        step = back[step[0]]
                    return path[::-1]
                if undecided and move.tool_call:
                    continue  # made only once decided
                waiting = move.after.pending > 0 and not move.after.finalizing
                if waiting and (move.model_call or move.tool_call):  # a new next call: held back or not
                    successors.extend(((move.after, held), move) for held in (False, True))
                else:
                    successors.append(((move.after, undecided and waiting), move))
            for after, by in successors:
                if after not in back:
                    back[after] = (here, by)
                    queue.append(after)
        return None

    # --- bounds -----------------------------------------------------------------------------------------------

    def longest(self) -> tuple[int | None, int]:
        """The most transitions (None if a finite loop of a turn's calls leaves it open) and model calls of any run."""
        components = self.components()  # reverse topological: successors come first
        where = {config: n for n, component in enumerate(components) for config in component}
        transitions: dict[int, int | None] = {}
        calls: dict[int, int] = {}
        for n, component in enumerate(components):
            looped = len(component) > 1 or any(m.after == component[0] for m in self.moves[component[0]])
            most: int | None = 0
            most_calls = 0
            for config in component:
                for move in self.moves[config]:
                    target = where[move.after]
                    if target == n:
                        continue
                    tail = transitions[target]
                    most = None if most is None or tail is None else max(most, tail + 1)
                    most_calls = max(most_calls, calls[target] + move.model_call)
            transitions[n] = None if looped else most
            calls[n] = most_calls
        start = where[INITIAL]
        return transitions[start], calls[start]
