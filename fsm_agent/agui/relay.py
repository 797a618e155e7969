"""A turn's run as AG-UI events, as it goes: a step per state, text as it streams, tool calls, sub-agents, counters.

The relay watches the request's agent through its hooks (``transition``,
``text``, ``before_tool``, ``after_tool``), and each sub-agent's agent the same way, so a
sub-agent run's steps and text reach the client attributed to it
(``subagentRunId``, the child's run id ``<parent run id>/<call id>``) between
its ``SUBAGENT_STARTED`` and ``SUBAGENT_FINISHED``/``SUBAGENT_ERROR``.  Hooks
cannot be taken off an agent again, so the agent must be built for the
request (as ``agent_factory`` does): one already watched by a relay is refused.

Per transition of a run: what the state it leaves produced (the reply's text,
unless it streamed, and the tool calls it asks for; a tool's result), then
``STEP_FINISHED`` of that state, a ``STATE_SNAPSHOT`` of the counters (the
request's own run only: the protocol's state is the run's, not a sub-agent's),
and ``STEP_STARTED`` of the next state.

A tool's result is sent when its ``after_tool`` event is heard, which comes
before the transition recording the call, or alone for the calls a cut or a
stop keeps beside the call it records (evidence ``also_ran``); the
transition that records a call already sent sends it no more.  A transition
whose call's end was heard by an earlier owner of the run (a resume) sends it.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

import attrs
from ag_ui.core import (
    BaseEvent,
    StateSnapshotEvent,
    StepFinishedEvent,
    StepStartedEvent,
    SubagentErrorEvent,
    SubagentFinishedEvent,
    SubagentStartedEvent,
    TextMessageContentEvent,
    TextMessageEndEvent,
    TextMessageStartEvent,
    ToolCallArgsEvent,
    ToolCallEndEvent,
    ToolCallResultEvent,
    ToolCallStartEvent,
)

from fsm_agent import Agent, CallEvent, TextDelta, ToolCall, TransitionEvent

TERMINAL = ("Done", "Failed")


@attrs.define
class Track:
    """Where one run (the request's, or a sub-agent's) stands in the stream: its open step and text message."""

    owner: str | None
    """The sub-agent run the events are attributed to; None for the request's own run."""
    prefix: str
    """What its message ids start with."""
    step: str | None = None
    text: str | None = None
    """The id of the text message streaming now, if one is."""
    replies: int = 0
    streamed: bool = False
    """Whether the reply in the making streamed its text (then its transition does not send it again)."""
    children: dict[str, ToolCall] = attrs.field(factory=dict)
    """The sub-agent calls of this run under way, by their child run's id."""
    sent: set[str] = attrs.field(factory=set)
    """Ids of the calls whose result went out from ``after_tool``, not yet recorded by a transition."""

    def reply_id(self) -> str:
        """The id of the message the model's current reply becomes."""
        return f"{self.prefix}:reply-{self.replies + 1}"


class Watch:
    """One watched agent's hooks, handing its events to the relay with the track of the run they belong to."""

    def __init__(self, relay: Relay, agent: Agent, own: bool) -> None:
        self.relay = relay
        self.own = own
        self.children = agent.children()
        self.descriptions = {name: tool.description for name in self.children if (tool := agent.registry.get(name))}

    def track(self, run_id: str) -> Track | None:
        """The track of run ``run_id``: the request's own, or a sub-agent's this request started (else None)."""
        return self.relay.own if self.own else self.relay.child(run_id)

    def transition(self, event: TransitionEvent) -> None:
        """The ``transition`` hook."""
        track = self.track(event.run_id)
        if track is not None:
            self.relay.transition(track, event, own=self.own)

    def text(self, delta: TextDelta) -> None:
        """The ``text`` hook: a piece of a streaming reply."""
        track = self.track(delta.run_id)
        if track is not None:
            self.relay.text(track, delta.text)

    def before_tool(self, event: CallEvent) -> None:
        """The ``before_tool`` hook: a sub-agent's call starts its run (``SUBAGENT_STARTED``)."""
        track, call = self.track(event.run_id), event.tool_call
        if track is not None and call is not None and call.name in self.children:
            self.relay.child_started(track, call, f"{event.run_id}/{call.id}", self.descriptions.get(call.name))

    def after_tool(self, event: CallEvent) -> None:
        """The ``after_tool`` hook: a call's outcome (``TOOL_CALL_RESULT``; a sub-agent's call ends it first)."""
        track, call = self.track(event.run_id), event.tool_call
        if track is not None and call is not None and event.tool_result is not None:
            self.relay.tool_ended(track, call, event.tool_result, event.tool_error)


class Relay:
    """Turns the events of one request's run, and of its sub-agents' runs, into AG-UI events handed to ``push``."""

    def __init__(self, run_id: str, push: Callable[[BaseEvent], None]) -> None:
        self.push = push
        self.own = Track(None, run_id)
        self.children: dict[str, Track] = {}

    def watch(self, agent: Agent) -> None:
        """Hook into ``agent`` and every sub-agent's agent below it; a ``ValueError`` if a relay watches one already."""
        agents, stack = [agent], [agent]
        while stack:
            for child in stack.pop().children().values():
                if not any(child.agent is known for known in agents):
                    agents.append(child.agent)
                    stack.append(child.agent)
        for watched in agents:
            if any(isinstance(getattr(hook, "__self__", None), Watch) for hook in watched.hooks.get("transition")):
                msg = (
                    "agent_factory returned an agent that served an earlier request: build a fresh Agent, "
                    "and fresh sub-agents, for each request (the adapter watches them through hooks)"
                )
                raise ValueError(msg)
        for watched in agents:
            hooks = Watch(self, watched, own=watched is agent)
            watched.on("transition", hooks.transition)
            watched.on("text", hooks.text)
            watched.on("before_tool", hooks.before_tool)
            watched.on("after_tool", hooks.after_tool)

    def child(self, run_id: str) -> Track | None:
        """The track of a sub-agent run this request started (its id renamed with ``@digest`` included)."""
        return self.children.get(run_id) or self.children.get(run_id.split("@", 1)[0])

    # --- what runs say -----------------------------------------------------------------------------------------

    def text(self, track: Track, piece: str) -> None:
        """A piece of the current reply's text: the message opens on the first (in ``AwaitModel``: the call is)."""
        self._enter(track, "AwaitModel")
        if track.text is None:
            track.text = track.reply_id()
            track.streamed = True
            self.push(TextMessageStartEvent(message_id=track.text, role="assistant", subagent_run_id=track.owner))
        self.push(TextMessageContentEvent(message_id=track.text, delta=piece, subagent_run_id=track.owner))

    def transition(self, track: Track, event: TransitionEvent, *, own: bool) -> None:
        """One transition: what the state left produced, its step finished, the counters, the next step started."""
        self._enter(track, event.source)
        self._end_text(track)
        if event.response is not None:
            self._reply(track, event.response.message.content, event.response.message.tool_calls)
        elif event.error is not None and event.source == "AwaitModel":
            track.replies += 1  # a failed call: its message id is spent, nothing was said
            track.streamed = False
        call = event.tool_call
        if event.source == "ExecuteTool" and call is not None and event.tool_result is not None:
            if call.id in track.sent:
                track.sent.discard(call.id)  # its result went out when its end was heard (tool_ended)
            else:
                self._tool_done(track, call, event.tool_result, event.tool_error)
        self.push(StepFinishedEvent(step_name=event.source, subagent_run_id=track.owner))
        track.step = None
        if own:
            snapshot = {"run_id": event.run_id, "state": event.dest, "counters": event.counters}
            self.push(StateSnapshotEvent(snapshot=snapshot))
        self._enter(track, event.dest)
        if event.dest in TERMINAL:
            self.push(StepFinishedEvent(step_name=event.dest, subagent_run_id=track.owner))
            track.step = None

    def child_started(self, parent: Track, call: ToolCall, run_id: str, description: str | None) -> None:
        """A sub-agent's run begins, for ``call`` of the run ``parent`` tracks (in ``ExecuteTool``: the call is)."""
        self._enter(parent, "ExecuteTool")
        self.children[run_id] = Track(run_id, run_id)
        parent.children[run_id] = call
        started = SubagentStartedEvent(
            subagent_run_id=run_id,
            name=call.name,
            description=description or None,
            parent_subagent_run_id=parent.owner,
            parent_tool_call_id=call.id,
            parent_message_id=f"{parent.prefix}:reply-{parent.replies}",
        )
        self.push(started)

    def tool_ended(self, track: Track, call: ToolCall, content: str, error: str | None) -> None:
        """A call's end, heard before the transition recording it, or alone for a call kept at a cut or a stop."""
        self._enter(track, "ExecuteTool")
        self._tool_done(track, call, content, error)
        track.sent.add(call.id)

    def close(self) -> None:
        """The run ended, however: every text message and step still open is closed, and each sub-agent ended."""
        for track in self.children.values():
            self._close_track(track)
        for parent in (self.own, *self.children.values()):
            for run_id in list(parent.children):
                parent.children.pop(run_id)
                message = "the run ended before this sub-agent's call finished"
                self.push(SubagentErrorEvent(subagent_run_id=run_id, message=message))
        self._close_track(self.own)

    # --- the pieces ---------------------------------------------------------------------------------------------

    def _enter(self, track: Track, state: str) -> None:
        if track.step == state:
            return
        if track.step is not None:
            self.push(StepFinishedEvent(step_name=track.step, subagent_run_id=track.owner))
        self.push(StepStartedEvent(step_name=state, subagent_run_id=track.owner))
        track.step = state

    def _end_text(self, track: Track) -> None:
        if track.text is not None:
            self.push(TextMessageEndEvent(message_id=track.text, subagent_run_id=track.owner))
            track.text = None

    def _reply(self, track: Track, content: str, calls: tuple[ToolCall, ...]) -> None:
        """A reply taken in: its text (unless it streamed) and the tool calls it asks for."""
        message_id = track.reply_id()
        track.replies += 1
        owner = track.owner
        if content and not track.streamed:
            self.push(TextMessageStartEvent(message_id=message_id, role="assistant", subagent_run_id=owner))
            self.push(TextMessageContentEvent(message_id=message_id, delta=content, subagent_run_id=owner))
            self.push(TextMessageEndEvent(message_id=message_id, subagent_run_id=owner))
        track.streamed = False
        for call in calls:
            start = ToolCallStartEvent(
                tool_call_id=call.id, tool_call_name=call.name, parent_message_id=message_id, subagent_run_id=owner
            )
            self.push(start)
            arguments = call.raw_arguments if call.raw_arguments is not None else json.dumps(call.arguments)
            self.push(ToolCallArgsEvent(tool_call_id=call.id, delta=arguments, subagent_run_id=owner))
            self.push(ToolCallEndEvent(tool_call_id=call.id, subagent_run_id=owner))

    def _tool_done(self, track: Track, call: ToolCall, content: str, error: str | None) -> None:
        """A tool call's outcome; a sub-agent's call ends that sub-agent first."""
        for run_id, running in list(track.children.items()):
            if running.id == call.id:
                del track.children[run_id]
                ended: Any = (
                    SubagentFinishedEvent(subagent_run_id=run_id, result=content)
                    if error is None
                    else SubagentErrorEvent(subagent_run_id=run_id, message=error)
                )
                self.push(ended)
        result = ToolCallResultEvent(
            message_id=f"{track.prefix}:result-{call.id}",
            tool_call_id=call.id,
            content=content,
            role="tool",
            subagent_run_id=track.owner,
        )
        self.push(result)

    def _close_track(self, track: Track) -> None:
        self._end_text(track)
        if track.step is not None:
            self.push(StepFinishedEvent(step_name=track.step, subagent_run_id=track.owner))
            track.step = None
