// The official AG-UI client (@ag-ui/client's HttpAgent) sends user messages made of content parts to a live fsm_agent
// AG-UI app, run by tests/agui/test_agui_text_parts.py: `node run_text_parts.mjs URL` sends two text parts, a text
// part beside an image part, and a legacy binary part (which the client upgrades on its way out), each on a thread of
// its own, and prints one JSON object saying what the client saw of each run.
import { HttpAgent } from "@ag-ui/client";

const url = process.argv[2];

async function send(threadId, content) {
  const agent = new HttpAgent({ url, threadId, initialMessages: [{ id: `${threadId}-user`, role: "user", content }] });
  const seen = { events: [], finished: null, error: null, failed: null };
  try {
    await agent.runAgent(
      {},
      {
        onEvent({ event }) {
          seen.events.push(event.type);
        },
        onRunFinishedEvent(params) {
          seen.finished = { outcome: params.outcome, result: params.outcome === "success" ? (params.result ?? null) : null };
        },
        onRunErrorEvent({ event }) {
          seen.error = { code: event.code ?? null, message: event.message };
        },
        onRunFailed({ error }) {
          seen.failed = String(error?.message ?? error);
        },
      },
    );
  } catch (error) {
    seen.failed = seen.failed ?? String(error?.message ?? error);
  }
  seen.sent = agent.messages[0].content;
  return seen;
}

const image = { type: "image", source: { type: "url", value: "https://example.com/cat.png", mimeType: "image/png" } };
const report = {};
report.parts = await send("js-parts", [
  { type: "text", text: "2+3?" },
  { type: "text", text: "In French." },
]);
report.image = await send("js-image", [{ type: "text", text: "What is this?" }, image]);
report.binary = await send("js-binary", [
  { type: "text", text: "Read this." },
  { type: "binary", mimeType: "application/pdf", data: "JVBERi0xLjQK" },
]);
console.log(JSON.stringify(report));
