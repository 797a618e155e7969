// The official AG-UI client (@ag-ui/client's HttpAgent) against a live fsm_agent AG-UI app, run by
// tests/agui/test_official_client.py: `node run_client.mjs URL` runs a tool run, a streamed answer, a stop and an
// approval round trip (and a sub-agent's run), each on a thread of its own, and prints one JSON object saying what the client saw.
// The client verifies the stream itself (event order, open steps, messages and tool calls): a stream it rejects
// shows up as `failed`.
import { HttpAgent, buildResumeArray } from "@ag-ui/client";

const url = process.argv[2];

function agentOn(threadId, text) {
  return new HttpAgent({
    url,
    threadId,
    initialMessages: [{ id: `${threadId}-user`, role: "user", content: text }],
  });
}

async function run(agent, parameters) {
  const seen = { events: [], finished: null, error: null, failed: null, deltas: 0 };
  try {
    await agent.runAgent(parameters, {
      onEvent({ event }) {
        seen.events.push(event.stepName ? `${event.type} ${event.stepName}` : event.type);
        if (event.type === "TEXT_MESSAGE_CONTENT") seen.deltas += 1;
      },
      onRunFinishedEvent(params) {
        seen.finished = {
          outcome: params.outcome,
          result: params.outcome === "success" ? (params.result ?? null) : null,
          interrupts: params.outcome === "interrupt" ? params.interrupts : null,
          usage: params.event.usage ?? null,
          metadata: params.event.metadata ?? null,
        };
      },
      onRunErrorEvent({ event }) {
        seen.error = { code: event.code ?? null, message: event.message, metadata: event.metadata ?? null };
      },
      onRunFailed({ error }) {
        seen.failed = String(error?.message ?? error);
      },
    });
  } catch (error) {
    seen.failed = seen.failed ?? String(error?.message ?? error);
  }
  seen.messages = agent.messages.map((message) => ({
    role: message.role,
    content: typeof message.content === "string" ? message.content : null,
    toolCalls: (message.toolCalls ?? []).map((call) => call.function.name),
  }));
  return seen;
}

const report = {};
report.tool = await run(agentOn("js-tool", "add two and three"), { forwardedProps: { scenario: "tool" } });
report.stream = await run(agentOn("js-stream", "say something"), { forwardedProps: { scenario: "stream" } });
report.stop = await run(agentOn("js-stop", "loop"), { forwardedProps: { scenario: "stop" } });
report.subagent = await run(agentOn("js-subagent", "ask the helper"), { forwardedProps: { scenario: "subagent" } });

const approving = agentOn("js-approve", "send it to ada");
report.paused = await run(approving, { forwardedProps: { scenario: "approve" } });
report.pendingInterrupts = approving.pendingInterrupts.map((interrupt) => interrupt.id);
const resume = buildResumeArray(approving.pendingInterrupts, {
  s1: { status: "resolved", payload: { approved: true } },
});
report.resumed = await run(approving, { forwardedProps: { scenario: "approve" }, resume });

console.log(JSON.stringify(report));
