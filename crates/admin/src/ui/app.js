// The Sluice dashboard: reads the admin API once a second (only what the open tab shows) and
// renders it. No framework and no build step; every value from the API is inserted as text.
"use strict";

const REFRESH_MS = 1000;
const ROWS = 200; // rows a table shows; the rest are counted below it
const state = { tab: "flow", detail: null, timer: null, busy: false };

const $ = (sel) => document.querySelector(sel);
const token = () => sessionStorage.getItem("sluice-token") || "";

async function api(path, options = {}) {
  const headers = Object.assign({ accept: "application/json" }, options.headers || {});
  if (token()) headers.authorization = "Bearer " + token();
  const resp = await fetch(path, Object.assign({}, options, { headers }));
  if (resp.status === 401) {
    showLogin("");
    throw new Error("unauthorized");
  }
  const text = await resp.text();
  let body = null;
  try { body = text ? JSON.parse(text) : null; } catch (_) { body = { message: text }; }
  if (!resp.ok) throw new Error((body && body.message) || resp.status + "");
  return body;
}

// Builds an element; children are nodes or text (never parsed as HTML).
function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === undefined || v === null || v === false) continue;
    if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (k === "class") node.className = v;
    else node.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat(Infinity)) {
    if (c === undefined || c === null) continue;
    node.append(c instanceof Node ? c : String(c));
  }
  return node;
}

const badge = (text, kind) => el("span", { class: "badge " + (kind || text || "") }, text || "–");
const fmt = (v) => (v === undefined || v === null || v === "" ? "–" : v);
const time = (iso) => (iso ? new Date(iso).toLocaleTimeString() : "–");

function fill(table, rows, more, total) {
  const body = $(table + " tbody");
  body.replaceChildren(...rows.slice(0, ROWS));
  if (rows.length === 0) {
    const cols = $(table + " thead tr").children.length;
    body.append(el("tr", {}, el("td", { colspan: cols, class: "empty" }, "nothing here")));
  }
  if (more) $(more).textContent = total > ROWS ? `showing ${ROWS} of ${total}` : "";
}

function showLogin(message) {
  $("#login").hidden = false;
  $("#main").hidden = true;
  $("#login-error").textContent = message;
  stop();
}

function summary(cards) {
  $("#summary").replaceChildren(
    ...cards.map(([label, value, id]) =>
      el("div", { class: "card", id }, el("div", { class: "value" }, fmt(value)), el("div", { class: "label" }, label)))
  );
}

// --- Charts -------------------------------------------------------------------------------

const SVG = "http://www.w3.org/2000/svg";

function svg(tag, attrs) {
  const node = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  return node;
}

// A line over `values` (nulls are gaps), scaled to its own maximum; the newest is on the right.
function sparkline(values, attrs) {
  const w = 120, h = 28;
  const max = Math.max(1e-9, ...values.filter((v) => v !== null && v !== undefined));
  const step = values.length > 1 ? w / (values.length - 1) : 0;
  const chart = svg("svg", Object.assign({ viewBox: `0 0 ${w} ${h}`, width: w, height: h, class: "chart" }, attrs || {}));
  let run = [];
  const flush = () => {
    if (run.length) chart.append(svg("polyline", { points: run.join(" "), fill: "none", class: "line" }));
    run = [];
  };
  values.forEach((v, i) => {
    if (v === null || v === undefined) return flush();
    run.push(`${(i * step).toFixed(1)},${(h - 2 - (v / max) * (h - 4)).toFixed(1)}`);
  });
  flush();
  return chart;
}

const lastOf = (values) => {
  for (let i = values.length - 1; i >= 0; i--) if (values[i] !== null && values[i] !== undefined) return values[i];
  return null;
};
const round = (v) => (v === null ? "–" : Number.isInteger(v) ? v : v.toFixed(1));

// The series a rule's card draws: name, title, values; the optional ones only when present.
function ruleCharts(r) {
  const all = [
    ["admitted", "admitted/s", r.admitted_per_second],
    ["running", "running", r.running],
    ["waiting", "waiting", r.waiting],
    ["refused", "refused/s", r.refused_per_second],
    ["p99-wait", "p99 wait ms", r.p99_wait_ms],
    ["adaptive", "adaptive limit", r.adaptive_limit],
    ["would-wait", "shadow: would wait", r.shadow_would_wait],
    ["would-reject", "shadow: would reject", r.shadow_would_reject],
    ["budget-spent", "budget spent", r.budget_spent || []],
  ];
  const optional = new Set(["adaptive", "would-wait", "would-reject", "budget-spent"]);
  return all.filter(([name, , values]) => !optional.has(name) || values.some((v) => v !== null));
}

function renderCharts(history) {
  const minutes = Math.round(((history.at || []).length * history.interval_ms) / 60000);
  $("#charts-window").textContent = history.interval_ms
    ? `last ${minutes || "<1"} min, a point every ${history.interval_ms / 1000} s` : "sampling is off (flow.history)";
  const cards = (history.rules || []).map((r) =>
    el("div", { class: "chart-card", "data-rule": r.rule, "data-level": r.level },
      el("h3", {}, el("span", { class: "mono" }, r.rule), " ", el("span", { class: "hint" }, r.level)),
      ruleCharts(r).map(([name, title, values]) =>
        el("div", { class: "series" },
          el("span", { class: "title" }, title),
          sparkline(values, { "data-series": name }),
          el("span", { class: "last", "data-series": name }, round(lastOf(values)))))));
  $("#charts").replaceChildren(...(cards.length ? cards : [el("p", { class: "empty" }, "no rule has counters yet")]));
}

// --- Flow control -------------------------------------------------------------------------

async function renderFlow() {
  const [rules, counters, history, weights] = await Promise.all([
    api("/limits/rules"), api("/limits/counters"), api("/limits/history").catch(() => ({ rules: [] })),
    api("/limits/weights").catch(() => ({ overrides: [] })),
  ]);
  fill("#weights", (weights.overrides || []).map((o) =>
    el("tr", { "data-counter": o.counter }, el("td", { class: "mono" }, o.counter), el("td", { class: "weight" }, o.weight))));
  renderCharts(history);
  const all = counters.counters || [];
  const byRule = {};
  for (const c of all) {
    const r = (byRule[c.rule || ""] = byRule[c.rule || ""] || { n: 0, usage: 0, queued: 0 });
    r.n += 1;
    if (c.level === "scope") { r.usage += c.usage; r.queued += c.queued; }
  }
  const scopes = all.filter((c) => c.level === "scope");
  summary([
    ["scopes live", scopes.length, "sum-scopes"],
    ["running (scoped)", scopes.reduce((a, c) => a + c.usage, 0), "sum-running"],
    ["held", scopes.reduce((a, c) => a + c.queued, 0), "sum-held"],
    ["rules", (rules.rules || []).length, "sum-rules"],
  ]);
  fill("#rules", (rules.rules || []).map((r) => {
    const u = byRule[r.pattern] || { n: 0, usage: 0, queued: 0 };
    const l = r.limits || {};
    return el("tr", { "data-rule": r.pattern, class: r.disabled ? "disabled" : "" },
      el("td", { class: "mono" }, r.pattern),
      el("td", {}, badge(r.disabled ? "disabled" : r.mode || "enforce")),
      el("td", {}, l.concurrency === undefined || l.concurrency === null ? "unlimited" : l.concurrency),
      el("td", {}, fmt(l.rate)), el("td", {}, fmt(l.max_queued)), el("td", {}, fmt(l.weight)),
      el("td", {}, fmt(l.burst_budget)), el("td", { class: "on-full" }, l.on_full || "queue"),
      el("td", { class: "debounce" }, fmt(l.debounce)),
      el("td", {}, u.n), el("td", {}, u.usage), el("td", { class: "held" }, u.queued));
  }));
  const filter = $("#counter-filter").value.trim();
  const shown = all
    .filter((c) => !filter || c.scope.includes(filter))
    .sort((a, b) => b.queued - a.queued || b.usage - a.usage || a.scope.localeCompare(b.scope));
  fill("#counters", shown.map((c) => {
    const pct = c.limit ? Math.min(100, Math.round((100 * c.usage) / c.limit)) : 0;
    return el("tr", { "data-scope": c.scope, "data-level": c.level },
      el("td", { class: "mono" }, c.scope), el("td", {}, c.level),
      el("td", { class: "mono" }, [c.l1, c.l2].filter(Boolean).join("/") || "–"),
      el("td", {}, el("div", { class: "meter" }, el("div", { class: "fill", style: `width:${pct}%` })), " ", c.usage),
      el("td", {}, c.limit === undefined || c.limit === null ? "∞" : c.limit),
      el("td", {}, fmt(c.rate)), el("td", {}, fmt(c.tokens)),
      el("td", { class: "held" }, c.queued),
      el("td", {}, c.budget ? `${c.budget_spent} / ${c.budget}` + (c.budget_reserved ? ` (+${c.budget_reserved} reserved)` : "") : "–"),
      el("td", { class: "mono" }, fmt(c.rule)),
      el("td", {}, c.shadow ? `${c.shadow.rule}: ${c.shadow.would_wait} / ${c.shadow.would_reject}` : "–"));
  }), "#counters-more", filter ? shown.length : Math.max(shown.length, counters.total || 0));
}

// --- Queues -------------------------------------------------------------------------------

async function queueAction(id, action) {
  try {
    await api(`/vqueues/${encodeURIComponent(id)}/${action}`, { method: "POST" });
  } catch (e) {
    alert(`${action} failed: ${e.message}`);
  }
  refresh();
}

async function renderQueues() {
  const [queues, history] = await Promise.all([api("/vqueues"), api("/limits/history").catch(() => ({ queues: [] }))]);
  const list = queues.vqueues || [];
  const trend = {};
  for (const q of history.queues || []) trend[q.id] = q.held;
  const filter = $("#queue-filter").value.trim();
  const shown = list
    .filter((q) => !filter || (q.scope || "").includes(filter) || q.service.includes(filter))
    .sort((a, b) => b.queued - a.queued || a.id.localeCompare(b.id));
  summary([
    ["queues", Math.max(list.length, queues.total || 0), "sum-queues"],
    ["held", list.reduce((a, q) => a + q.queued, 0), "sum-queued"],
    ["scheduled", list.reduce((a, q) => a + q.scheduled, 0), "sum-scheduled"],
    ["paused", list.filter((q) => q.status === "paused").length, "sum-paused"],
  ]);
  fill("#queues", shown.map((q) => {
    const paused = q.status === "paused";
    return el("tr", { "data-queue": q.id, "data-scope": q.scope || "" },
      el("td", { class: "mono" }, q.id), el("td", { class: "mono" }, fmt(q.scope)),
      el("td", { class: "mono" }, fmt(q.limit_key)), el("td", {}, q.service + (q.object_key ? "/" + q.object_key : "")),
      el("td", {}, q.priority), el("td", { class: "status" }, badge(q.status)), el("td", {}, fmt(q.blocked_on)),
      el("td", { class: "held" }, q.queued),
      el("td", { class: "trend" }, trend[q.id] ? sparkline(trend[q.id], { "data-queue": q.id }) : "–"),
      el("td", {}, q.scheduled),
      el("td", {}, el("button", {
        class: paused ? "resume" : "pause", "data-action": paused ? "resume" : "pause",
        onclick: () => queueAction(q.id, paused ? "resume" : "pause"),
      }, paused ? "Resume" : "Pause")));
  }), "#queues-more", filter ? shown.length : Math.max(shown.length, queues.total || 0));
}

// --- Invocations ----------------------------------------------------------------------------

async function renderInvocations() {
  const q = new URLSearchParams({ limit: String(ROWS) });
  for (const [key, sel] of [["status", "#inv-status"], ["scope", "#inv-scope"], ["service", "#inv-service"]]) {
    const v = $(sel).value.trim();
    if (v) q.set(key, v);
  }
  const list = (await api("/invocations?" + q)).invocations || [];
  summary([
    ["shown", list.length, "sum-shown"],
    ["running", list.filter((i) => i.status === "running").length, "sum-inv-running"],
    ["waiting", list.filter((i) => i.status === "pending" || i.status === "scheduled").length, "sum-inv-waiting"],
    ["failing", list.filter((i) => i.status === "backing-off" || i.status === "paused").length, "sum-inv-failing"],
  ]);
  fill("#invocations", list.map((i) => el("tr", {
    "data-invocation": i.id, class: "clickable" + (state.detail === i.id ? " selected" : ""),
    onclick: () => { state.detail = i.id; refresh(); },
  },
  el("td", { class: "mono" }, i.id), el("td", {}, i.target), el("td", {}, badge(i.status)),
  el("td", { class: "mono" }, fmt(i.scope)), el("td", {}, i.attempts), el("td", {}, time(i.created_at)))));
  if (state.detail) await renderDetail(state.detail);
}

async function renderDetail(id) {
  const [inv, journal] = await Promise.all([
    api("/invocations/" + encodeURIComponent(id)),
    api("/query", {
      method: "POST",
      headers: { "content-type": "application/json" },
      body: JSON.stringify({ query: `SELECT index, entry_type, payload_length FROM sys_journal WHERE id = '${id.replace(/[^A-Za-z0-9_]/g, "")}' ORDER BY index` }),
    }).catch(() => ({ rows: [] })),
  ]);
  const w = inv.waiting;
  const why = w ? whyWaiting(w) : inv.status === "completed" ? `completed: ${inv.completion || "–"}` : `${inv.status}`;
  const rows = [
    ["id", inv.id], ["target", inv.target], ["status", inv.status], ["scope", inv.scope], ["limit key", inv.limit_key],
    ["attempts", `${inv.attempts} (retry count ${inv.retry_count})`], ["deployment", inv.deployment_id],
    ["last error", inv.last_failure ? `[${inv.last_failure_error_code || "-"}] ${inv.last_failure}` : null],
    ["created", inv.created_at],
  ];
  $("#detail").hidden = false;
  $("#detail").replaceChildren(
    el("h3", {}, "Invocation ", el("button", { class: "close", onclick: () => { state.detail = null; $("#detail").hidden = true; } }, "×")),
    el("p", { class: "why", id: "why" }, why),
    el("dl", {}, rows.filter(([, v]) => v !== null && v !== undefined).map(([k, v]) => [el("dt", {}, k), el("dd", { class: "mono" }, v)])),
    el("h4", {}, "Journal"),
    el("table", { class: "journal" }, el("tbody", {}, (journal.rows || []).map((r) =>
      el("tr", {}, el("td", {}, r.index), el("td", {}, r.entry_type), el("td", {}, `${r.payload_length} B`))))),
  );
}

function whyWaiting(w) {
  switch (w.blocked_on) {
    case "queue-paused": return "Waiting: its queue is paused by an operator.";
    case "limit-key-concurrency":
      return `Waiting: the ${w.level} limit of ${w.limit} running is full` + (w.rule ? ` (rule ${w.rule}).` : ".");
    case "rate-limit": return `Waiting for a token of rate ${w.rate}` + (w.rule ? ` (rule ${w.rule})` : "") + `, next at ${time(w.next_token_at)}.`;
    case "quota": return `Waiting: the ${w.level} quota ${w.quota} is used up until ${time(w.quota_resets_at)}` + (w.rule ? ` (rule ${w.rule}).` : ".");
    case "budget-exhausted":
      return `Waiting: the ${w.level} budget ${w.budget} is spent (with what running calls hold reserved) until ${time(w.budget_resets_at)}, or until running calls end` + (w.rule ? ` (rule ${w.rule}).` : ".");
    case "deployment-concurrency":
      return w.closed_until
        ? `Waiting: deployment ${w.deployment} asked for no new work until ${time(w.closed_until)}.`
        : `Waiting: deployment ${w.deployment} runs ${w.running} of the ${w.limit} it takes now.`;
    case "lock": return "Waiting for the object's lock (another invocation of the same key runs).";
    case "invoker-concurrency": return "Waiting for a free invoker slot.";
    default: return `Waiting (${w.status}), ${w.queued} queued.`;
  }
}

// --- Deployments, services, plugins, subscriptions -----------------------------------------

async function renderServices() {
  const [deps, svcs] = await Promise.all([api("/deployments"), api("/services")]);
  summary([["deployments", deps.deployments.length], ["services", svcs.services.length]]);
  fill("#deployments", deps.deployments.map((d) => el("tr", {},
    el("td", { class: "mono" }, d.id), el("td", { class: "mono" }, d.uri || d.arn),
    el("td", {}, `V${d.min_protocol_version}–V${d.max_protocol_version}`),
    el("td", {}, (d.services || []).map((s) => s.name).join(", ")), el("td", {}, time(d.created_at)))));
  fill("#services", svcs.services.map((s) => el("tr", {},
    el("td", {}, s.name), el("td", {}, s.ty), el("td", {}, s.handlers.map((h) => h.name).join(", ")),
    el("td", { class: "mono" }, s.deployment_id), el("td", {}, s.revision))));
}

async function renderExtras() {
  const [plugins, subs] = await Promise.all([api("/plugins"), api("/subscriptions")]);
  summary([["plugins", plugins.plugins.length], ["subscriptions", subs.subscriptions.length]]);
  fill("#plugins", plugins.plugins.map((p) => el("tr", {},
    el("td", {}, p.name), el("td", {}, p.hook), el("td", {}, p.metrics.calls), el("td", {}, p.metrics.errors),
    el("td", {}, p.metrics.p50_us), el("td", {}, p.metrics.p99_us))));
  fill("#subscriptions", subs.subscriptions.map((s) => el("tr", {},
    el("td", { class: "mono" }, s.id), el("td", { class: "mono" }, s.source), el("td", { class: "mono" }, s.sink),
    el("td", {}, s.paused_partitions.length ? s.paused_partitions.join(", ") : "–"))));
}

// --- The loop --------------------------------------------------------------------------------

const views = { flow: renderFlow, queues: renderQueues, invocations: renderInvocations, services: renderServices, extras: renderExtras };

async function refresh() {
  if (state.busy) return;
  state.busy = true;
  try {
    const health = await fetch("/health").then((r) => r.ok).catch(() => false);
    const h = $("#health");
    h.textContent = health ? "healthy" : "unhealthy";
    h.className = "badge " + (health ? "healthy" : "unhealthy");
    await views[state.tab]();
    $("#updated").textContent = "updated " + new Date().toLocaleTimeString();
    $("#main").classList.remove("stale");
  } catch (e) {
    if (e.message !== "unauthorized") {
      $("#updated").textContent = "error: " + e.message;
      $("#main").classList.add("stale");
    }
  } finally {
    state.busy = false;
  }
}

function start() {
  stop();
  $("#login").hidden = true;
  $("#main").hidden = false;
  refresh();
  state.timer = setInterval(refresh, REFRESH_MS);
}

function stop() {
  if (state.timer) clearInterval(state.timer);
  state.timer = null;
}

for (const button of document.querySelectorAll("#tabs button")) {
  button.addEventListener("click", () => {
    state.tab = button.dataset.tab;
    for (const b of document.querySelectorAll("#tabs button")) b.classList.toggle("active", b === button);
    for (const s of document.querySelectorAll("[data-view]")) s.hidden = s.dataset.view !== state.tab;
    refresh();
  });
}
for (const input of document.querySelectorAll(".filter")) input.addEventListener("input", refresh);

$("#login-form").addEventListener("submit", async (event) => {
  event.preventDefault();
  sessionStorage.setItem("sluice-token", $("#token").value.trim());
  try {
    await api("/version");
    start();
  } catch (e) {
    showLogin(e.message === "unauthorized" ? "That token is not one of the admin tokens." : e.message);
  }
});

api("/version").then(start).catch((e) => { if (e.message !== "unauthorized") start(); });
