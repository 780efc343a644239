// Carpool operator console: signs in with an admin key (kept in sessionStorage, sent only as
// a Bearer header), polls /admin/stats once a second and redraws every panel. No library:
// plain DOM and SVG. Every number carries data-metric="<path>" (the browser test reads them).
"use strict";

const KEY = "carpool.adminKey";
const POLL_MS = 1000;
const SVG = "http://www.w3.org/2000/svg";
let timer = null;

const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  for (const c of children) node.append(c instanceof Node ? c : String(c));
  return node;
}

function fmt(x, digits = 2) {
  if (x === null || x === undefined) return "–";
  if (typeof x !== "number") return String(x);
  if (Number.isInteger(x)) return String(x);
  return x.toFixed(digits);
}

function ms(seconds) {
  if (seconds === null || seconds === undefined) return "–";
  const v = seconds * 1000;
  return (v < 10 ? v.toFixed(2) : v.toFixed(0)) + " ms";
}

function metric(path, text) {
  return el("span", { "data-metric": path, class: "num" }, text);
}

function row(label, ...cells) {
  return el("tr", {}, el("th", {}, label), ...cells.map((c) => el("td", {}, c)));
}

function reasons(map) {
  const parts = Object.entries(map || {}).map(([k, v]) => `${k} ${fmt(v)}`);
  return parts.length ? parts.join(", ") : "0";
}

// -- charts ------------------------------------------------------------------------------

function svg(w, h) {
  const s = document.createElementNS(SVG, "svg");
  s.setAttribute("viewBox", `0 0 ${w} ${h}`);
  s.setAttribute("width", w);
  s.setAttribute("height", h);
  return s;
}

function svgEl(tag, attrs) {
  const n = document.createElementNS(SVG, tag);
  for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
  return n;
}

// points: [[seconds before now (<= 0), value]], drawn over what there is (1 to 5 minutes)
function lines(series, w = 320, h = 70) {
  const s = svg(w, h);
  const oldest = Math.min(0, ...series.flatMap(([, pts]) => pts.map((p) => p[0])));
  const span = Math.min(300, Math.max(60, -oldest));
  const all = series.flatMap(([, pts]) => pts.map((p) => p[1]));
  const top = Math.max(1, ...all);
  s.append(svgEl("rect", { x: 0, y: 0, width: w, height: h, class: "chart-bg" }));
  for (const [cls, pts] of series) {
    if (!pts.length) continue;
    const d = pts.map(([t, v], i) => {
      const x = w + (t / span) * w;
      const y = h - 2 - (v / top) * (h - 6);
      return `${i ? "L" : "M"}${x.toFixed(1)},${y.toFixed(1)}`;
    }).join(" ");
    s.append(svgEl("path", { d, class: `line ${cls}` }));
  }
  const label = svgEl("text", { x: 4, y: 12, class: "axis" });
  label.textContent = `max ${fmt(top, 1)} · last ${Math.round(span)} s`;
  s.append(label);
  return s;
}

// buckets: [[upper bound, count]] (not cumulative); empty leading/trailing buckets trimmed
function bars(buckets, w = 320, h = 90) {
  const s = svg(w, h);
  let lo = buckets.findIndex((b) => b[1] > 0);
  let hi = buckets.length - 1 - [...buckets].reverse().findIndex((b) => b[1] > 0);
  if (lo < 0) { lo = 0; hi = Math.min(buckets.length - 1, 5); }
  const shown = buckets.slice(lo, hi + 1);
  const top = Math.max(1, ...shown.map((b) => b[1]));
  const bw = w / Math.max(1, shown.length);
  shown.forEach(([le, n], i) => {
    const bh = (n / top) * (h - 22);
    s.append(svgEl("rect", { x: i * bw + 2, y: h - 14 - bh, width: bw - 4, height: bh,
                             class: "bar" }));
    const t = svgEl("text", { x: i * bw + bw / 2, y: h - 2, class: "axis", "text-anchor": "middle" });
    t.textContent = `≤${le}`;
    s.append(t);
  });
  return s;
}

// -- panels ------------------------------------------------------------------------------

function renderDoctor(doc, stats) {
  const box = $("doctor");
  box.replaceChildren();
  if (doc.healthy) {
    const eng = stats.engine;
    box.append(el("p", { class: "ok", "data-metric": "doctor.verdict" }, "No symptom"));
    const parts = Object.entries(stats.tiers).map(
      ([t, s]) => `${t}: TTFT p50 ${ms(s.ttft_s.p50)} / p99 ${ms(s.ttft_s.p99)}`);
    if (eng) parts.push(`tokens/s ${fmt(eng.tokens_per_s)}`, `KV used ${eng.kv_used}/${eng.kv_total}`);
    box.append(el("p", { class: "muted" }, parts.join(" · ")));
    return;
  }
  box.append(el("p", { class: "bad", "data-metric": "doctor.verdict" },
                `${doc.findings.length} symptom(s)`));
  for (const f of doc.findings) {
    const ev = Object.entries(f.evidence).map(([k, v]) => `${k}=${fmt(v, 3)}`).join("  ");
    box.append(el("div", { class: "finding", "data-symptom": f.symptom },
      el("h3", {}, f.title),
      el("p", {}, el("b", {}, "cause: "), f.cause),
      el("p", { class: "evidence" }, ev),
      el("p", {}, el("b", {}, "turn: "), f.knob)));
  }
}

// The TTFT budget (policies/ttft_split.py): where the time to first token went, p50 / p99.
const TTFT_PARTS = [["gateway_in", "gateway in"], ["redis_queue", "Redis queue"],
  ["drainer_to_engine", "drainer to engine"], ["step_wait", "wait for the step in flight"],
  ["prefill", "prefill steps"], ["first_token_out", "first token out"]];

function ttftBudget(p, t) {
  const split = t.ttft_split || {};
  const steps = t.ttft_steps || {};
  return el("table", { class: "ttft-budget" },
    el("tr", {}, el("th", {}, "TTFT budget"), el("th", {}, "p50"), el("th", {}, "p99")),
    ...TTFT_PARTS.map(([k, label]) => row(label,
      metric(`${p}.ttft.${k}_p50`, ms((split[k] || {}).p50)),
      metric(`${p}.ttft.${k}_p99`, ms((split[k] || {}).p99)))),
    row("steps to first token", metric(`${p}.ttft.steps_p50`, fmt(steps.p50)),
        metric(`${p}.ttft.steps_p99`, fmt(steps.p99))));
}

function renderTiers(tiers) {
  const box = $("tiers");
  box.replaceChildren();
  for (const [name, t] of Object.entries(tiers)) {
    const p = `tier.${name}`;
    const table = el("table", {},
      row("queue depth", metric(`${p}.queue_depth`, fmt(t.queue_depth))),
      row("TTFT p50 / p99", metric(`${p}.ttft_p50`, ms(t.ttft_s.p50)), metric(`${p}.ttft_p99`, ms(t.ttft_s.p99))),
      row("TPOT p50 / p99", metric(`${p}.tpot_p50`, ms(t.tpot_s.p50)), metric(`${p}.tpot_p99`, ms(t.tpot_s.p99))),
      row("queue wait p99", metric(`${p}.queue_wait_p99`, ms(t.queue_wait_s.p99))),
      row("admitted /s", metric(`${p}.admitted_per_s`, fmt(t.admitted_per_s))),
      row("completed /s", metric(`${p}.completed_per_s`, fmt(t.completed_per_s))),
      row("rejected /s", metric(`${p}.rejected_per_s`, reasons(t.rejected_per_s))),
      row("cancelled /s", metric(`${p}.cancelled_per_s`, fmt(t.cancelled_per_s))),
      row("timed out /s", metric(`${p}.timed_out_per_s`, fmt(t.timed_out_per_s))),
      row("tokens /s", metric(`${p}.tokens_per_s`, fmt(t.tokens_per_s))));
    box.append(el("div", { class: "card", "data-tier": name },
      el("h3", {}, name), lines([["depth", t.queue_series]]),
      el("p", { class: "legend" }, "queue depth"), table, ttftBudget(p, t)));
  }
}

function renderEngine(e) {
  const box = $("engine");
  box.replaceChildren();
  if (!e) {
    box.append(el("p", { class: "muted" }, "No worker publishes an engine yet."));
    return;
  }
  const used = e.kv_total ? (100 * e.kv_used) / e.kv_total : 0;
  const fill = el("div", {});
  fill.style.width = `${used.toFixed(1)}%`;  // CSSOM: the page's CSP refuses style attributes
  const kvbar = el("div", { class: "kvbar", title: `${e.kv_used} of ${e.kv_total} blocks` }, fill);
  const table = el("table", {},
    row("running / waiting / swapped", metric("engine.running", fmt(e.running)),
        metric("engine.waiting", fmt(e.waiting)), metric("engine.swapped", fmt(e.swapped))),
    row("seats (max_num_seqs)", metric("engine.max_num_seqs", fmt(e.max_num_seqs))),
    row("KV blocks used / free", metric("engine.kv_used", fmt(e.kv_used)), metric("engine.kv_free", fmt(e.kv_free))),
    row("steps /s", metric("engine.steps_per_s", fmt(e.steps_per_s))),
    row("tokens /s", metric("engine.tokens_per_s", fmt(e.tokens_per_s))),
    row("rows per step p50 / p99", metric("engine.batch_p50", fmt(e.batch_size.p50)), metric("engine.batch_p99", fmt(e.batch_size.p99))),
    row("tokens per step p50 / p99", metric("engine.step_tokens_p50", fmt(e.step_tokens.p50)), metric("engine.step_tokens_p99", fmt(e.step_tokens.p99))),
    row("preemptions /s recompute / swap", metric("engine.preempt_recompute_per_s", fmt(e.preemptions_per_s.recompute)),
        metric("engine.preempt_swap_per_s", fmt(e.preemptions_per_s.swap))),
    row("swap blocks /s in / out", metric("engine.swap_in_per_s", fmt(e.swap_blocks_per_s.in)),
        metric("engine.swap_out_per_s", fmt(e.swap_blocks_per_s.out))));
  box.append(el("div", { class: "cards" },
    el("div", { class: "card" }, el("h3", {}, "state"), table, el("p", { class: "legend" }, `KV used ${used.toFixed(1)}%`), kvbar),
    el("div", { class: "card" }, el("h3", {}, "batch size (rows per step)"), bars(e.batch_size.buckets),
       el("h3", {}, "tokens per step"), bars(e.step_tokens.buckets)),
    el("div", { class: "card" }, el("h3", {}, "running / waiting / KV used"),
       lines([["running", e.series.running], ["waiting", e.series.waiting], ["kv", e.series.kv_used]], 320, 120),
       el("p", { class: "legend" }, el("span", { class: "k-running" }, "■ running "),
          el("span", { class: "k-waiting" }, "■ waiting "), el("span", { class: "k-kv" }, "■ KV blocks used")))));
}

// each live worker's step budget as it decided last (StepBudget.state, via /admin/stats)
function renderBudgets(budgets) {
  const box = $("budget");
  box.replaceChildren();
  const workers = Object.entries(budgets || {});
  if (!workers.length) {
    box.append(el("p", { class: "muted" }, "No worker publishes a step budget yet."));
    return;
  }
  const table = el("table", {}, el("tr", {}, ...["worker", "row cap", "TPOT target",
    "priced at (gain)", "alone bias", "interactive"].map((h) => el("th", {}, h))));
  workers.sort(([a], [b]) => a.localeCompare(b));  // statuses come freshest first
  for (const [w, b] of workers) {
    const bias = b.alone_bias == null ? "–"
      : `×${fmt(b.alone_bias)}`;
    const state = b.backlogged == null ? "–"
      : b.backlogged ? "backlogged: weights decide" : "protected";
    table.append(el("tr", {}, el("td", {}, w),
      el("td", {}, metric("budget.cap", b.cap == null ? "none" : fmt(b.cap))),
      el("td", {}, metric("budget.target", ms(b.target_s))),
      el("td", {}, metric("budget.priced", `${ms(b.cap_target_s)} (×${fmt(b.gain)})`)),
      el("td", {}, metric("budget.alone_bias", bias)),
      el("td", {}, metric("budget.backlogged", state))));
  }
  box.append(table);
}

function renderTenants(rows) {
  const table = $("tenants");
  table.replaceChildren(el("tr", {}, ...["tenant", "requests", "req/s", "tokens", "share",
                                          "429s", "TTFT p99"].map((h) => el("th", {}, h))));
  if (!rows.length) table.append(el("tr", {}, el("td", { colspan: 7, class: "muted" }, "no traffic in the window")));
  for (const r of rows) {
    const p = `tenant.${r.tenant}`;
    table.append(el("tr", {}, el("td", {}, r.tenant),
      el("td", {}, metric(`${p}.requests`, fmt(r.requests))),
      el("td", {}, metric(`${p}.requests_per_s`, fmt(r.requests_per_s))),
      el("td", {}, metric(`${p}.tokens`, fmt(r.tokens))),
      el("td", {}, metric(`${p}.share`, `${(100 * r.share).toFixed(1)}%`)),
      el("td", {}, metric(`${p}.rejected_429`, fmt(r.rejected_429))),
      el("td", {}, metric(`${p}.ttft_p99`, ms(r.ttft_p99_s)))));
  }
}

// the last admin actions (GET /admin/audit has them all): when, who, from where, what
function renderAudit(entries) {
  const table = $("audit");
  table.replaceChildren(el("tr", {}, ...["when", "action", "target", "admin key", "from",
                                          "change"].map((h) => el("th", {}, h))));
  if (!entries || !entries.length) {
    table.append(el("tr", {}, el("td", { colspan: 6, class: "muted" }, "no admin actions yet")));
    return;
  }
  for (const e of entries) {
    const change = `${JSON.stringify(e.before)} → ${JSON.stringify(e.after)}`;
    table.append(el("tr", {}, el("td", {}, new Date(e.ts * 1000).toLocaleString()),
      el("td", {}, e.action), el("td", {}, e.target), el("td", {}, e.admin_key_id),
      el("td", {}, e.address), el("td", { class: "muted" }, change)));
  }
}

function render(stats) {
  const procs = Object.keys(stats.processes || {}).length;
  const when = new Date(stats.ts * 1000).toLocaleTimeString();
  $("status").replaceChildren(
    `${procs} process(es) · admitted `, metric("counters.admitted", fmt(stats.admitted || 0)),
    " · completed ", metric("counters.completed", fmt(stats.completed || 0)), ` · ${when}`);
  document.querySelector('[data-metric="window_s"]').textContent = fmt(stats.window_s, 0);
  renderDoctor(stats.doctor, stats);
  renderTiers(stats.tiers);
  renderEngine(stats.engine);
  renderBudgets(stats.step_budget);
  renderTenants(stats.tenants);
  renderAudit(stats.audit);
}

// -- session -----------------------------------------------------------------------------

function showLogin(error) {
  clearTimeout(timer);
  timer = null;
  $("dash").hidden = true;
  $("logout").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = error || "";
  $("status").textContent = "signed out";
}

async function poll() {
  const key = sessionStorage.getItem(KEY);
  if (!key) { showLogin(); return; }
  let r;
  try {
    r = await fetch("/admin/stats", { headers: { Authorization: `Bearer ${key}` }, cache: "no-store" });
  } catch (e) {
    $("status").textContent = "server unreachable: retrying";
    timer = setTimeout(poll, POLL_MS);
    return;
  }
  if (r.status === 401 || r.status === 403) {
    const body = await r.json().catch(() => ({}));
    sessionStorage.removeItem(KEY);
    showLogin(`${r.status}: ${(body.error && body.error.message) || "refused"}`);
    return;
  }
  if (r.ok) {
    $("login").hidden = true;
    $("dash").hidden = false;
    $("logout").hidden = false;
    render(await r.json());
  } else {
    $("status").textContent = `stats answered ${r.status}: retrying`;
  }
  timer = setTimeout(poll, POLL_MS);
}

$("login-form").addEventListener("submit", (ev) => {
  ev.preventDefault();
  sessionStorage.setItem(KEY, $("key").value.trim());
  $("key").value = "";
  clearTimeout(timer);
  poll();
});

$("logout").addEventListener("click", () => {
  sessionStorage.removeItem(KEY);
  showLogin();
});

poll();
