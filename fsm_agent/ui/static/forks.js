// The run viewer's parts about forks, loaded after app.js (whose helpers it uses): a run's "forked from" line and
// "Save as test" link, the "Re-run from here" button of each transition, and the compare page of two runs.
// As in app.js, every stored text is put on the page with textContent, never as markup.
"use strict";

function compareLink(a, b) {
  return "/compare?" + new URLSearchParams({ a, b }).toString();
}

// A fork names its source and the transition it was forked at; every run can be saved as a test.
function forkView(run) {
  const parts = [];
  if (run.forked_from) {
    const [source, at] = run.forked_from;
    parts.push(
      el(
        "span",
        { id: "forked-from" },
        "forked from ",
        el("a", { href: runLink(source), id: "source-link", class: "run-id", title: source, text: shown(source) }),
        ` at ${at}`,
      ),
      el("a", { href: compareLink(source, run.run_id), id: "compare-link", text: "compare with its source" }),
    );
  }
  const test = "/api/test?" + new URLSearchParams({ id: run.run_id }).toString();
  parts.push(el("a", { href: test, id: "save-test", download: "", title: "the run's recording and a pytest file replaying it (a zip)", text: "Save as test" }));
  return el("p", { class: "run-actions", id: "run-actions" }, parts);
}

function forkBadge(run) {
  if (!run.forked_from) return null;
  const [source, at] = run.forked_from;
  return el("a", { href: runLink(source), class: "fork badge", title: `${source} at ${at}`, text: `fork of ${shown(source)} at ${at}` });
}

// "Re-run from here": fork the run at this transition with the viewer's agent, then open the fork.
function rerunButton(run, moment) {
  const allowed = state.config.can_fork;
  const button = el("button", {
    type: "button",
    class: "rerun",
    "data-at": moment.index,
    disabled: !allowed,
    title: allowed ? `re-run from transition #${moment.index}: a fork of this run, with the viewer's agent` : state.config.fork_refusal,
    text: "Re-run from here",
  });
  button.addEventListener("click", async () => {
    button.disabled = true;
    try {
      const fork = await getJSON("/api/fork?" + new URLSearchParams({ id: run.run_id }).toString(), {
        method: "POST",
        headers: { "content-type": "application/json" },
        body: JSON.stringify({ at: moment.index }),
      });
      location.href = runLink(fork.run_id);
    } catch (error) {
      button.disabled = false;
      button.after(el("p", { class: "error", role: "alert", text: String(error.message || error) }));
    }
  });
  return button;
}

// --- two runs side by side --------------------------------------------------------------------------

function compareColumn(key, column, other, data) {
  const forkedHere = column.forked_from && column.forked_from[0] === other.run_id ? column.forked_from[1] : null;
  const edges = column.edges.map((edge) =>
    el(
      "li",
      {
        class: `edge ${edge.index === data.first_edge ? "differs" : ""} ${edge.index === forkedHere ? "forked-here" : ""}`,
        id: edge.index === data.first_edge ? `first-edge-${key}` : null,
        "data-index": edge.index,
      },
      el("span", { class: "num", text: `#${edge.index}` }),
      ` ${edge.source} → ${edge.dest} `,
      el("span", { class: "label", text: edge.label }),
      edge.index === forkedHere ? el("span", { class: "badge fork", text: "forked here" }) : null,
    ),
  );
  if (data.first_edge !== null && data.first_edge === column.edges.length) {
    edges.push(el("li", { class: "edge differs ended", id: `first-edge-${key}`, text: "(no more transitions)" }));
  }
  const messages = column.messages.map((message, index) => {
    const item = messageView(message, false);
    if (index === data.first_message) {
      item.classList.add("differs");
      item.id = `first-message-${key}`;
    }
    return item;
  });
  return el(
    "section",
    { class: "compare-column", id: `column-${key}` },
    el("h2", {}, el("a", { href: runLink(column.run_id), class: "run-id", title: column.run_id, text: shown(column.run_id) })),
    el("p", { class: "status" }, `state ${column.state}`, column.reason ? `, reason ${column.reason}` : "", `, ${counted(column.edges.length, "transition")}`),
    el("h3", { text: "Transitions" }),
    el("ol", { class: "compare-edges" }, edges),
    el("h3", { text: "Messages" }),
    el("ol", { class: "messages" }, messages),
    column.final ? el("pre", { class: "text final", text: column.final }) : null,
  );
}

async function comparePage() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams({ a: params.get("a") || "", b: params.get("b") || "" });
  const data = await getJSON("/api/compare?" + query.toString());
  const summary =
    data.first_edge === null && data.first_message === null
      ? "The two runs took the same transitions and hold the same messages."
      : [
          data.first_edge === null ? "Same transitions" : `First different transition: #${data.first_edge}`,
          data.first_message === null ? "same messages" : `first different message: ${data.first_message + 1}`,
        ].join("; ") + " (marked in both columns).";
  show(
    el("h1", { text: "Two runs side by side" }),
    el("p", { class: "compare-summary", id: "compare-summary", text: summary }),
    el("div", { class: "compare", id: "compare" }, compareColumn("a", data.a, data.b, data), compareColumn("b", data.b, data.a, data)),
  );
}
