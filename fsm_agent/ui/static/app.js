// The run viewer's page: the list of runs, and one run over the machine drawing.
// Everything a model or a tool produced arrives as JSON and is put on the page with textContent
// (or as a Text node), never as markup; the only markup inserted is the machine's SVG, which the
// server draws from the transition table.
"use strict";

const state = { config: null, run: null, selected: null, follow: true, source: null, svg: null };

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === null || value === undefined || value === false) continue;
    if (key === "text") node.textContent = String(value);
    else if (key === "class") node.className = value;
    else if (key === "on") for (const [event, handler] of Object.entries(value)) node.addEventListener(event, handler);
    else node.setAttribute(key, String(value));
  }
  for (const child of children.flat()) {
    if (child === null || child === undefined || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

async function getJSON(url, options) {
  const response = await fetch(url, options);
  const body = await response.json().catch(() => ({ error: `${response.status} ${response.statusText}` }));
  if (!response.ok) throw new Error(body.error || `${response.status} ${response.statusText}`);
  return body;
}

// "1 step", "2 steps": a count with its noun, singular for one.
function counted(n, noun) {
  return `${n} ${noun}${n === 1 ? "" : "s"}`;
}

function age(seconds) {
  if (seconds < 60) return `${Math.max(0, Math.round(seconds))} s ago`;
  if (seconds < 3600) return `${Math.round(seconds / 60)} min ago`;
  if (seconds < 86400) return `${Math.round(seconds / 3600)} h ago`;
  return `${Math.round(seconds / 86400)} d ago`;
}

// Bidi controls (overrides, isolates, marks) in an id or other stored text are shown as escapes, as the
// command line shows control characters: they could reorder what is around them, or dress one id up as another.
const BIDI_CONTROLS = /[\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]/g;

function shown(text) {
  return String(text).replace(BIDI_CONTROLS, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
}

function runLink(runId) {
  return "/run?" + new URLSearchParams({ id: runId }).toString();
}

function show(...nodes) {
  const main = document.getElementById("main");
  main.replaceChildren(...nodes.filter((node) => node !== null && node !== undefined));
}

function pretty(value) {
  // Indented JSON, but a short list of plain values (a counter's [used, limit]) stays on one line.
  return JSON.stringify(value, null, 2).replace(/\[\s+([^\[\]{}]*?)\s+\]/g, (_, inner) => `[${inner.replace(/\s+/g, " ")}]`);
}

function fail(error) {
  show(el("p", { class: "error", role: "alert", text: String(error.message || error) }));
}

// --- the list of runs -------------------------------------------------------------------------------

function filterSelect(name, label, values, current) {
  const select = el("select", { name, id: `filter-${name}` }, el("option", { value: "", text: `any ${label}` }));
  for (const value of values) select.append(el("option", { value, text: value, selected: value === current }));
  return el("label", {}, `${label} `, select);
}

async function listPage() {
  const params = new URLSearchParams(location.search);
  const query = new URLSearchParams();
  // ?after= (a cursor) is what the "older" link gives; ?offset= is kept for links made before cursors.
  for (const key of ["state", "reason", "session", "after", "offset"]) if (params.get(key)) query.set(key, params.get(key));
  const session = params.get("session");
  const data = await getJSON("/api/runs?" + query.toString());
  const form = el(
    "form",
    { class: "filters", id: "filters", method: "get", action: "/" },
    filterSelect("state", "state", state.config.states, params.get("state") || ""),
    filterSelect("reason", "reason", state.config.reasons, params.get("reason") || ""),
    session ? el("input", { type: "hidden", name: "session", value: session }) : null,
    el("button", { type: "submit", text: "Filter" }),
  );
  const rows = data.runs.map((run) =>
    el(
      "tr",
      { class: `run ${run.paused ? "paused" : ""}`, "data-run": run.run_id },
      el(
        "td",
        {},
        // An id is whoever stored the run's: shown in a box of its own (see app.css), cut if long, whole in its title.
        el("a", { href: runLink(run.run_id), class: "run-id", dir: "auto", title: run.run_id, text: shown(run.run_id) }),
        // A conversation's turn links to all its turns: the session's runs, grouped.
        run.session
          ? el("a", {
              href: "/?" + new URLSearchParams({ session: run.session }).toString(),
              class: "session badge",
              title: run.session,
              text: `session ${shown(run.session)}`,
            })
          : null,
        forkBadge(run),
      ),
      el(
        "td",
        { class: `state state-${run.state}` },
        shown(run.state),
        run.paused ? el("span", { class: "badge awaiting", text: "awaiting approval" }) : null,
      ),
      el("td", { class: "reason", text: run.reason ? shown(run.reason) : "—" }),
      el("td", { class: "num", text: run.tool_calls ?? "—" }),
      el("td", { class: "num", text: run.tokens ?? "—" }),
      el("td", { class: "age", title: new Date(run.updated * 1000).toISOString(), text: age(data.now - run.updated) }),
    ),
  );
  const table = el(
    "table",
    { class: "runs", id: "runs" },
    el(
      "thead",
      {},
      el(
        "tr",
        {},
        [["run", "run"], ["state", "state"], ["reason", "reason"], ["tool_calls", "tool calls"], ["tokens", "tokens"], ["updated", "updated"]].map(
          ([key, h]) => el("th", { class: `col-${key}`, text: h }),
        ),
      ),
    ),
    el("tbody", {}, rows),
  );
  // Pages go by cursor: "older" starts right after this page's last run (in the order runs were created, which a
  // save does not change), so a run added or saved meanwhile is neither shown twice nor passed over.
  const pages = el("nav", { class: "pages" });
  const first = data.after === null && data.offset === 0;
  const pageLink = (cursor, text, id) => {
    const next = new URLSearchParams(params);
    next.delete("offset");
    next.delete("after");
    if (cursor !== null) next.set("after", cursor);
    return el("a", { href: "/?" + next.toString(), class: "page", id, text });
  };
  if (!first) pages.append(pageLink(null, "← latest", "page-latest"));
  const shownRuns = first ? `runs 1–${data.runs.length}` : `${data.runs.length} older run${data.runs.length === 1 ? "" : "s"}`;
  pages.append(el("span", { class: "muted", text: ` ${shownRuns} ` }));
  if (data.more) pages.append(pageLink(data.next, "older →", "page-older"));
  const empty = data.runs.length ? null : el("p", { class: "muted", id: "no-runs", text: "No runs match." });
  const title = session
    ? el("h1", { id: "session-title", title: session }, `Turns of session ${shown(session)} `, el("a", { href: "/", class: "muted", text: "(all runs)" }))
    : el("h1", { text: "Runs" });
  show(title, form, table, empty, pages);
}

// --- one run ------------------------------------------------------------------------------------------

async function loadMachine() {
  if (state.svg !== null) return state.svg;
  const response = await fetch("/api/machine.svg");
  if (!response.ok) {
    const body = await response.json().catch(() => ({ error: response.statusText }));
    state.svg = { error: body.error };
    return state.svg;
  }
  const text = await response.text();
  const parsed = new DOMParser().parseFromString(text, "image/svg+xml");
  state.svg = { node: parsed.documentElement };
  return state.svg;
}

function bar(share) {
  // Set through the style object: the page's Content-Security-Policy refuses style attributes.
  const fill = el("span", { class: "fill" });
  fill.style.width = `${share}%`;
  return el("span", { class: "bar" }, fill);
}

// US dollars, to the millionth: a call's cost is often a fraction of a cent.
const dollars = (amount) => `$${+Number(amount).toFixed(6)}`;

function counterTable(counters, note) {
  if (!counters) return el("p", { class: "muted", text: "No counters recorded yet at this transition." });
  const rows = Object.entries(counters).map(([name, pair]) => {
    const [used, limit] = pair;
    const hit = limit !== null && limit !== undefined && used >= limit;
    const share = limit ? Math.min(100, Math.round((100 * used) / limit)) : 0;
    return el(
      "tr",
      { class: hit ? "hit" : "", "data-counter": name },
      el("th", { text: name }),
      el("td", { class: "num", text: name === "cost" ? dollars(used) : typeof used === "number" ? +used.toFixed(3) : used }),
      el("td", { class: "num", text: limit === null || limit === undefined ? "no limit" : `of ${name === "cost" ? dollars(limit) : limit}` }),
      el("td", {}, limit ? bar(share) : null),
    );
  });
  return el("div", {}, el("table", { class: "counters", id: "counters" }, el("tbody", {}, rows)), el("p", { class: "muted small", text: note }));
}

function messageView(message, isNew) {
  const calls = (message.tool_calls || []).map((call) =>
    el("pre", { class: "call" }, `${call.name}(${call.raw_arguments ?? JSON.stringify(call.arguments)})  [${call.id}]`),
  );
  return el(
    "li",
    { class: `message role-${message.role} ${isNew ? "new" : ""}` },
    el("span", { class: "role", text: message.role + (message.tool_call_id ? ` (${message.tool_call_id})` : "") }),
    message.content ? el("pre", { class: "text", text: message.content }) : null,
    calls,
  );
}

// --- sub-agents: a parent's calls link to the runs they were, a sub-agent's run to its parent -----------------

function childStanding(run, childId) {
  // Where a sub-agent run stands, as the server read it from the store for this page.
  const known = (run.children || []).find((child) => child.run_id === childId);
  if (!known) return "";
  if (!known.stored) return "not in this store";
  if (known.state === null) return "unreadable";
  return [known.state, known.reason, known.paused ? "paused" : null].filter(Boolean).join(" — ");
}

function childLink(run, childId, id) {
  const standing = childStanding(run, childId);
  return el(
    "span",
    { class: "sub-agent" },
    el("a", { href: runLink(childId), class: "child-link", id, title: childId, text: shown(childId) }),
    standing ? el("span", { class: "muted", text: ` (${standing})` }) : null,
  );
}

function parentView(run) {
  if (!run.parent_run_id) return null;
  const link = el("a", { href: runLink(run.parent_run_id), id: "parent-link", title: run.parent_run_id, text: shown(run.parent_run_id) });
  const call = run.parent_call_id ? ["call ", el("code", { text: run.parent_call_id }), " in run "] : ["run "];
  return el("p", { class: "parent-run", id: "parent-run" }, "Sub-agent run of ", call, link);
}

function childrenView(run) {
  if (!run.children || !run.children.length) return null;
  const items = run.children.map((child) =>
    el("li", { "data-child": child.run_id }, `${child.tool || "call"} [${child.call_id ?? "?"}] → `, childLink(run, child.run_id, null)),
  );
  return el("section", { class: "children", id: "children" }, el("h2", { text: "Sub-agent runs" }), el("ul", {}, items));
}

function detailView(run, moment) {
  if (!moment) return el("p", { class: "muted", text: "No transitions yet." });
  const [start, end] = moment.messages;
  const brought = run.messages.slice(start, end).map((m) => messageView(m, true));
  const earlier = run.messages.slice(0, start).map((m) => messageView(m, false));
  const title = `#${moment.index} ${moment.source} → ${moment.dest}` + (moment.reason ? ` (${moment.reason})` : "");
  const parts = [
    el("h2", { id: "detail-title", text: title }),
    el("p", { class: "edge-doc", id: "edge-doc", text: moment.tooltip || `${moment.trigger}${moment.guard ? ` [${moment.guard}]` : ""}` }),
  ];
  if (moment.evidence) {
    parts.push(el("h3", { text: moment.reason ? `Evidence of the stop: ${moment.reason}` : "Outcome" }));
    parts.push(el("pre", { class: "evidence", id: "evidence", text: pretty(moment.evidence) }));
  }
  if (moment.call) {
    parts.push(el("h3", { text: "Tool call" }));
    const call = moment.call;
    parts.push(el("pre", { class: "call", id: "tool-call", text: `${call.name}(${call.raw_arguments ?? JSON.stringify(call.arguments, null, 2)})  [${call.id}]` }));
  }
  if (moment.child) {
    parts.push(el("h3", { text: "Sub-agent run of this call" }));
    parts.push(el("p", { id: "sub-agent-run" }, childLink(run, moment.child, "child-link")));
  }
  if (moment.result) {
    parts.push(el("h3", { text: "Tool result" }));
    parts.push(el("pre", { class: "text", id: "tool-result", text: moment.result.content }));
  }
  parts.push(el("h3", { text: "Counters against limits" }));
  parts.push(counterTable(moment.counters, moment.counted_from ? `(${moment.counted_from})` : ""));
  parts.push(el("h3", { text: brought.length ? "Messages this transition brought" : "No new messages" }));
  parts.push(el("ol", { class: "messages", id: "new-messages", start: start + 1 }, brought));
  if (earlier.length) {
    parts.push(el("details", {}, el("summary", { text: `${earlier.length} earlier messages` }), el("ol", { class: "messages" }, earlier)));
  }
  return el("section", { class: "detail", id: "detail" }, parts);
}

function approvalView(run) {
  if (!run.paused) return null;
  const items = run.pending.map((call) => {
    const decided = Object.prototype.hasOwnProperty.call(run.approvals, call.id) ? run.approvals[call.id] : undefined;
    const item = el(
      "li",
      { class: "pending", "data-call": call.id },
      el("pre", { class: "call", text: `${call.name}(${call.raw_arguments ?? JSON.stringify(call.arguments, null, 2)})  [${call.id}]` }),
    );
    if (decided !== undefined) {
      item.append(el("p", { class: "decided", text: decided === true ? "approved" : `rejected: ${decided === false || decided === "" ? "no reason given" : decided}` }));
    } else if (state.config.allow_decisions) {
      const why = el("input", { type: "text", class: "why", placeholder: "why (for a rejection only)", "aria-label": "reason for rejecting" });
      // The page is drawn again on every change of the run: what was typed is kept per call, not lost with the box,
      // and so is the server's refusal of a decision (an approval keeps no text: one sent with a reason is refused),
      // which may arrive after a redraw has replaced this item.
      const typed = (state.why ??= {});
      const refused = (state.refused ??= {});
      why.value = typed[call.id] ?? "";
      why.addEventListener("input", () => { typed[call.id] = why.value; });
      const send = async (approve) => {
        try {
          const body = JSON.stringify({ call_id: call.id, approve, why: why.value });
          const updated = await getJSON("/api/decide?" + new URLSearchParams({ id: run.run_id }), {
            method: "POST",
            headers: { "content-type": "application/json" },
            body,
          });
          delete refused[call.id];
          renderRun(updated);
        } catch (error) {
          refused[call.id] = String(error.message || error);
          renderRun(state.run);
        }
      };
      item.append(
        el("button", { type: "button", class: "approve", text: "Approve", on: { click: () => send(true) } }),
        el("button", { type: "button", class: "reject", text: "Reject", on: { click: () => send(false) } }),
        why,
        refused[call.id] ? el("p", { class: "error", role: "alert", text: refused[call.id] }) : null,
      );
    } else {
      item.append(el("p", { class: "muted", text: "Read-only viewer: start it with --allow-decisions to decide here." }));
    }
    return item;
  });
  const decidedAll = run.pending.every((call) => Object.prototype.hasOwnProperty.call(run.approvals, call.id));
  return el(
    "section",
    { class: "approval", id: "approval" },
    el("h2", { text: "Paused: calls awaiting a person's decision" }),
    el("ul", {}, items),
    decidedAll ? el("p", { class: "muted", id: "resume-hint", text: `Decided. The run goes on when it is resumed: python -m fsm_agent runs resume ${run.run_id} --store … --model …` }) : null,
  );
}

function overlay(svg, run, selected) {
  svg.classList.add("overlay");
  const counts = new Map();
  for (const moment of run.moments) for (const id of moment.ids) counts.set(id, (counts.get(id) || 0) + 1);
  for (const group of svg.querySelectorAll("g.edge, g.node")) {
    group.classList.remove("taken", "final", "selected", "current");
    const label = group.querySelector("text");
    if (label) {
      if (!label.dataset.label) label.dataset.label = label.textContent;
      label.textContent = label.dataset.label;
    }
  }
  for (const [id, count] of counts) {
    const group = svg.getElementById(id);
    if (!group) continue;
    group.classList.add("taken");
    const label = group.querySelector("text");
    if (label && id.startsWith("row")) label.textContent = `${label.dataset.label} ×${count}`;
  }
  const last = run.moments[run.moments.length - 1];
  if (last && !run.live && !run.paused) for (const id of last.ids) svg.getElementById(id)?.classList.add("final", `final-${run.state}`);
  if (selected) for (const id of selected.ids) svg.getElementById(id)?.classList.add("selected");
  svg.getElementById(`state_${run.state}`)?.classList.add("current");
}

function timelineView(run) {
  const items = run.moments.map((moment) => {
    const button = el(
      "button",
      {
        type: "button",
        class: `moment ${moment.reason ? "stop" : ""} ${state.selected === moment.index ? "selected" : ""}`,
        "data-index": moment.index,
        "aria-pressed": state.selected === moment.index ? "true" : "false",
        on: {
          click: () => {
            state.selected = moment.index;
            state.follow = moment.index === run.moments.length - 1;
            renderRun(run);
          },
        },
      },
      el("span", { class: "num", text: `#${moment.index}` }),
      ` ${moment.source} → ${moment.dest} `,
      el("span", { class: "label", text: moment.label }),
      moment.child ? el("span", { class: "badge sub-agent", text: "sub-agent" }) : null,
    );
    return el("li", {}, button, rerunButton(run, moment));
  });
  return el("ol", { class: "timeline", id: "timeline" }, items);
}

async function renderRun(run) {
  state.run = run;
  if (state.follow || state.selected === null || state.selected >= run.moments.length) {
    state.selected = run.moments.length ? run.moments.length - 1 : null;
  }
  const selected = state.selected === null ? null : run.moments[state.selected];
  const machine = await loadMachine();
  const drawing = el("div", { class: "machine", id: "machine" });
  if (machine.node) {
    const svg = document.importNode(machine.node, true);
    overlay(svg, run, selected);
    drawing.append(svg);
    drawing.append(
      el(
        "p",
        { class: "overlay-key small" },
        el("span", { class: "k-taken", text: "blue: taken by this run, ×count" }),
        el("span", { class: "k-final", text: "thick red or green: its last edge" }),
        el("span", { class: "k-selected", text: "glow: the transition selected" }),
        el("span", { class: "k-faded", text: "grey: not taken" }),
      ),
    );
  } else {
    drawing.append(el("p", { class: "muted", text: machine.error }));
  }
  const status = run.live ? "live" : run.paused ? "paused" : run.state === "Done" ? "done" : "stopped";
  const header = el(
    "div",
    { class: "run-head" },
    el("h1", {}, "Run ", el("span", { class: "run-id", id: "run-id", title: run.run_id, text: shown(run.run_id) })),
    el(
      "p",
      { class: "status", id: "status" },
      el("span", { class: `badge status-${status}`, id: "status-badge", text: status }),
      ` state ${run.state}`,
      run.reason ? `, reason ${run.reason}` : "",
      // Steps are model turns, as in the counters below (max_steps); tool calls are counted on their own.
      `, ${counted(run.steps, "step")}, ${counted(run.tool_calls, "tool call")}, ${counted(run.tokens, "token")}, ${counted(run.moments.length, "transition")}`,
      run.cost === null || run.cost === undefined ? "" : `, ${dollars(run.cost)}`,
    ),
    parentView(run),
    forkView(run),
  );
  const final = run.final ? el("section", { class: "final" }, el("h2", { text: "Final text" }), el("pre", { class: "text", id: "final", text: run.final })) : null;
  const error = run.error ? el("p", { class: "error", id: "run-error", text: run.error }) : null;
  // A redraw must not take the reason box from under a person typing in it: what they type next would go nowhere.
  const typing = document.activeElement;
  const box = typing && typing.classList.contains("why") ? [typing.closest("li").dataset.call, typing.selectionStart, typing.selectionEnd] : null;
  show(
    header,
    error,
    approvalView(run),
    childrenView(run),
    el("div", { class: "run-grid" }, drawing, el("nav", { class: "side" }, el("h2", { text: "Timeline" }), timelineView(run))),
    detailView(run, selected),
    final,
  );
  if (box) {
    const again = [...document.querySelectorAll("li.pending input.why")].find((input) => input.closest("li").dataset.call === box[0]);
    if (again) {
      again.focus();
      again.setSelectionRange(box[1], box[2]);
    }
  }
}

function followRun(runId) {
  if (state.source) state.source.close();
  const source = new EventSource("/api/events?" + new URLSearchParams({ id: runId }).toString());
  state.source = source;
  source.onmessage = (event) => renderRun(JSON.parse(event.data));
  source.addEventListener("end", () => source.close());
  source.addEventListener("corrupted", (event) => {
    // The stored run no longer adds up to a run (the server ended the stream): say why, and stop following.
    source.close();
    fail(new Error(JSON.parse(event.data).error));
  });
  source.addEventListener("gone", () => {
    source.close();
    fail(new Error(`run ${runId} is no longer in the store`));
  });
  source.onerror = async () => {
    // A stream the server refused (a 404: the run was deleted before it started) is closed for good and says
    // nothing itself: the run's own page gives the store's words. A dropped connection reconnects by itself.
    if (source.readyState !== EventSource.CLOSED || state.source !== source) return;
    try {
      await getJSON("/api/run?" + new URLSearchParams({ id: runId }).toString());
      fail(new Error(`run ${runId} can no longer be followed: reload the page to follow it again`));
    } catch (error) {
      fail(error);
    }
  };
}

async function runPage() {
  const runId = new URLSearchParams(location.search).get("id") || "";
  const run = await getJSON("/api/run?" + new URLSearchParams({ id: runId }).toString());
  await renderRun(run);
  if (run.live || run.paused) followRun(runId);
}

async function start() {
  try {
    state.config = await getJSON("/api/config");
    document.getElementById("store").textContent = state.config.store;
    const mode = document.getElementById("mode");
    mode.textContent = state.config.mode;
    mode.classList.add(state.config.mode === "read-only" ? "readonly" : "decisions");
    if (location.pathname === "/run") await runPage();
    else if (location.pathname === "/compare") await comparePage();
    else await listPage();
  } catch (error) {
    fail(error);
  }
}

document.addEventListener("DOMContentLoaded", start);
