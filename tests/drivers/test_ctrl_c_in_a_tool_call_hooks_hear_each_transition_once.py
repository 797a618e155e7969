"""A Ctrl-C inside a tool call, with a store writing ``every="call"``: the hooks of both owners hear each edge once.

An older note said the transitions around such a cut were announced twice
(the next owner resumed from the store's last write, before the cut call's
turn, and announced them again).  The Ctrl-C now writes what the run took
since that write (``test_ctrl_c_inside_a_call_writes_the_run`` holds the
observers and the log to it); this holds the agents' hooks to it: the
``transition`` hooks of the cut owner and of the new one read back to the
trace, each ``seq`` once, and each call's ``before_tool``/``after_tool`` is
heard once per execution, only the cut call made (and begun) twice.  The cut
call is the first, middle or last of its turn; both drivers.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import pytest
from support.counted_calls import finish

from fsm_agent import Agent, CallEvent, SqliteStore, ToolRegistry, TransitionEvent
from fsm_agent.testing import FakeModel, reply, tool_call, tool_turn

DRIVERS = ["sync", "async"]


class Heard:
    """What the hooks of every agent built here heard: each transition, and each tool call's start and end."""

    def __init__(self) -> None:
        self.edges: list[tuple[int, str, str, str]] = []
        self.calls: Counter[tuple[str, str]] = Counter()

    def listen(self, agent: Agent) -> Agent:
        agent.on("transition", self._edge)
        agent.on("before_tool", self._call)
        agent.on("after_tool", self._call)
        return agent

    def _edge(self, event: TransitionEvent) -> None:
        self.edges.append((event.seq, event.source, event.trigger, event.dest))

    def _call(self, event: CallEvent) -> None:
        assert event.tool_call is not None
        self.calls[event.kind, event.tool_call.id] += 1


@pytest.mark.parametrize("cut", ["s1", "s2", "s3"])
@pytest.mark.parametrize("driver", DRIVERS)
def test_a_ctrl_c_in_a_tool_call_with_every_call_announces_each_transition_once(
    tmp_path: Path, driver: str, cut: str
) -> None:
    ran: Counter[str] = Counter()
    armed = [cut]
    tools = ToolRegistry()

    @tools.register
    def send(to: str, call_id: str) -> str:
        """Send a note; the call ``cut`` is a Ctrl-C the first time."""
        ran[call_id] += 1
        if call_id == armed[0]:
            armed[0] = ""
            raise KeyboardInterrupt
        return f"sent to {to}"

    calls = [tool_call("send", id=f"s{n}", to=f"desk {n}") for n in (1, 2, 3)]
    heard = Heard()
    with SqliteStore(tmp_path / "runs.db", every="call", lease=0.5) as store:
        first = heard.listen(Agent(FakeModel(tool_turn(*calls)), tools, max_concurrency=1))
        run = first.start("q", store=store, run_id="r")
        with pytest.raises(KeyboardInterrupt):
            finish(run, driver)
        stored = store.load("r")
        # the cut owner's lease is given up, as it lapses once that process is gone
        store.renew("r", owner=run._journal.owner, seq=stored["stored_seq"], release=True)  # type: ignore[union-attr]
        second = heard.listen(Agent(FakeModel(reply("all sent")), tools, max_concurrency=1))
        result = finish(second.resume(store.load("r"), store=store), driver)
    assert result.final == "all sent"
    assert [seq for seq, *_ in heard.edges] == list(range(len(result.trace)))
    assert [tuple(edge) for _, *edge in heard.edges] == [(t.source, t.trigger, t.dest) for t in result.trace]
    assert ran == Counter({"s1": 1, "s2": 1, "s3": 1, cut: 2})
    assert heard.calls == Counter(
        {**{("before_tool", c): n for c, n in ran.items()}, **{("after_tool", c): 1 for c in ran}}
    )
