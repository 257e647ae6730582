// specfleet's status page: plain JavaScript, no build step. Reads the daemon's API with the
// browser's session cookie; state-changing calls carry the session's CSRF token in a header.
// Live: every event from /v1/events re-reads what the current view shows.
"use strict";

const S = { csrf: "", header: "X-Specfleet-CSRF", events: [], watch: null, timers: [], charts: [] };

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v;
    else if (k.startsWith("on")) node.addEventListener(k.slice(2), v);
    else if (v !== undefined && v !== null) node.setAttribute(k, v);
  }
  for (const c of children.flat()) {
    if (c === null || c === undefined) continue;
    node.append(c instanceof Node ? c : document.createTextNode(String(c)));
  }
  return node;
}

async function api(path, options) {
  const opts = Object.assign({ credentials: "same-origin", headers: {} }, options || {});
  if (opts.method && opts.method !== "GET") opts.headers[S.header] = S.csrf;
  const resp = await fetch(path, opts);
  if (resp.status === 401) { location.href = "/ui/login"; throw new Error("logged out"); }
  const body = await resp.json().catch(() => ({}));
  return { status: resp.status, body };
}

const fmt = {
  num: (v, d = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(d)),
  pct: (v) => (v === null || v === undefined ? "–" : (100 * v).toFixed(1) + " %"),
  bytes: (n) => (!n ? "–" : n >= 2 ** 30 ? (n / 2 ** 30).toFixed(2) + " GiB" : (n / 2 ** 20).toFixed(0) + " MiB"),
  ago: (t) => {
    if (!t) return "–";
    const s = Math.max(0, Date.now() / 1000 - t);
    return s < 90 ? s.toFixed(0) + " s" : s < 5400 ? (s / 60).toFixed(0) + " min" : (s / 3600).toFixed(1) + " h";
  },
  time: (t) => new Date(t * 1000).toLocaleTimeString(),
};

function stateTag(state) { return el("span", { class: `state state-${state}`, "data-state": state }, state); }

function speculation(t) {
  const s = t.speculation || {};
  if (!s.method || s.method === "none") return "none";
  if (s.enabled === false) return `${s.method} (off)`;
  const n = (t.shown || {}).draft_length ?? s.draft_length;
  return `${s.method}${s.variant ? " " + s.variant : ""}` + (n !== undefined && n !== null ? ` n=${n}` : "");
}

// --- views ---

const views = {
  async fleet(main) {
    const { body } = await api("/v1/targets");
    const reload = el("button", { class: "act", id: "reload", onclick: doReload }, "Reload fleet file");
    const rows = (body.targets || []).map((t) => el("tr", { "data-target": t.name },
      el("td", {}, el("a", { href: `#/target/${encodeURIComponent(t.name)}` }, t.name)),
      el("td", {}, stateTag(t.state)),
      el("td", { class: "num pid" }, t.pid ?? "–"),
      el("td", { class: "num" }, t.started_at && t.pid ? fmt.ago(t.started_at) : "–"),
      el("td", {}, speculation(t)),
      el("td", { class: "num" }, fmt.pct((t.shown || {}).acceptance_rate)),
      el("td", { class: "num" }, fmt.num((t.shown || {}).tokens_per_second, 1)),
      el("td", { class: "num" }, fmt.bytes((t.resources || {}).vram_bytes || (t.resources || {}).rss_bytes)),
      el("td", { class: "muted" }, t.last_event ? t.last_event.reason : ""),
      el("td", {}, el("button", { class: "act restart", onclick: () => doRestart(t.name) }, "Restart")),
      el("td", { class: "sequence", id: `seq-${t.name}` }, S.sequences?.[t.name] || "")));
    main.replaceChildren(
      el("h2", {}, "Fleet ", el("span", { class: "muted" }, body.daemon ? body.daemon.fleet_file || "" : "")),
      el("div", { class: "toolbar" }, reload, el("span", { id: "reload-result" }, S.reloadNote || "")),
      S.problems ? el("div", { class: "problems", id: "problems" }, S.problems) : "",
      el("table", { id: "fleet" }, el("thead", {}, el("tr", {}, ["Target", "State", "PID", "Up",
        "Speculation", "Accepted", "Tok/s", "Memory", "Last event", "", "Restart progress"].map((h) => el("th", {}, h)))),
      el("tbody", {}, rows)));
  },

  async target(main, name) {
    const [{ body: t }, { body: hist }, { body: reqs }] = await Promise.all([
      api(`/v1/targets/${encodeURIComponent(name)}`),
      api(`/v1/targets/${encodeURIComponent(name)}/history`),
      api("/v1/requests?limit=200")]);
    if (!t.name) { main.replaceChildren(el("p", { class: "empty" }, `No target ${name}.`)); return; }
    const facts = el("dl", { class: "facts" },
      ...[["State", stateTag(t.state)], ["PID", t.pid ?? "–"], ["Endpoint", t.endpoint],
        ["Model", t.model], ["Speculation", speculation(t)],
        ["Acceptance", fmt.pct((t.shown || {}).acceptance_rate)],
        ["Tokens/s", fmt.num((t.shown || {}).tokens_per_second, 1)],
        ["Restarts", `${t.restarts} by the restart policy; ${JSON.stringify(t.restarts_by_reason || {})}`],
        ["Last event", t.last_event ? t.last_event.reason : "–"]].flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, v)]));
    const charts = el("div", { class: "charts", id: "charts" });
    const marks = hist.marks || [];
    const markRows = marks.slice(-50).reverse().map((m) => el("tr", { class: "mark", "data-kind": m.kind },
      el("td", {}, fmt.time(m.t)), el("td", {}, m.kind + (m.state ? " → " + m.state : "")),
      el("td", {}, m.reason), el("td", { class: "muted" }, numbers(m.data))));
    const log = el("pre", { class: "log", id: "log" }, "…");
    main.replaceChildren(el("h2", {}, name), facts,
      el("div", { class: "toolbar" }, el("button", { class: "act restart", onclick: () => doRestart(name) }, "Restart"),
        el("span", { class: "sequence", id: `seq-${name}` }, S.sequences?.[name] || "")),
      el("h3", {}, "History"), charts,
      el("h3", {}, "Restarts and decisions"),
      marks.length ? el("table", { id: "marks" }, el("tbody", {}, markRows)) : el("p", { class: "empty" }, "None yet."),
      el("h3", {}, "Requests"), requestsTable((reqs.requests || []).filter((r) => r.target === name)),
      el("h3", {}, "Log"), log);
    drawCharts(charts, hist);
    await tailLog(name, log);
    S.timers.push(setInterval(() => tailLog(name, log), 2000));
  },

  async requests(main) {
    const { body } = await api("/v1/requests?limit=500");
    main.replaceChildren(el("h2", {}, "Requests through the proxy"), requestsTable(body.requests || []));
  },

  async events(main) {
    const rows = S.events.slice().reverse().map((e) => el("tr", {},
      el("td", {}, fmt.time(e.time)), el("td", {}, e.target), el("td", {}, e.kind),
      el("td", {}, e.old ? `${e.old} → ${e.new}` : ""), el("td", {}, e.reason)));
    main.replaceChildren(el("h2", {}, "Events (since this page was opened)"),
      rows.length ? el("table", { id: "events" }, el("tbody", {}, rows)) : el("p", { class: "empty" }, "None yet."));
  },

  async daemon(main) {
    const { body } = await api("/v1/targets");
    const d = body.daemon || {};
    const rejected = d.rejected_reload;
    const applied = d.last_reload;
    main.replaceChildren(el("h2", {}, "Daemon"),
      el("dl", { class: "facts", id: "daemon" }, ...Object.entries(d)
        .filter(([k]) => k !== "rejected_reload" && k !== "last_reload")
        .flatMap(([k, v]) => [el("dt", {}, k), el("dd", {}, typeof v === "object" ? JSON.stringify(v) : String(v))])),
      el("h3", {}, "Last reload"),
      el("p", {}, applied ? `applied at ${fmt.time(applied.time)}: added ${applied.added.join(", ") || "none"}, ` +
        `removed ${applied.removed.join(", ") || "none"}, changed ${applied.changed.join(", ") || "none"}` : "none since the daemon started"),
      rejected ? el("div", { class: "problems" }, `rejected at ${fmt.time(rejected.time)}:\n` + rejected.problems.join("\n"))
        : el("p", { class: "ok" }, "No rejected reload."));
  },
};

// A decision's numbers in a line: its scalar values and those of its evidence (the
// per-position arrays stay in the API's JSON).
function numbers(data) {
  if (!data) return "";
  const flat = Object.assign({}, data, data.evidence || {});
  delete flat.evidence;
  return Object.entries(flat)
    .filter(([, v]) => v === null || typeof v !== "object")
    .map(([k, v]) => `${k} ${typeof v === "number" && !Number.isInteger(v) ? v.toFixed(3) : v}`)
    .join(", ");
}

function requestsTable(list) {
  if (!list.length) return el("p", { class: "empty" }, "No requests yet.");
  return el("table", { class: "requests" }, el("thead", {}, el("tr", {}, ["Time", "Target", "Status",
    "Prompt", "Generated", "Drafted", "Accepted", "Tok/s", "Duration"].map((h) => el("th", {}, h)))),
  el("tbody", {}, list.map((r) => el("tr", { class: "request", "data-target": r.target },
    el("td", {}, fmt.time(r.time)), el("td", {}, r.target), el("td", { class: "num" }, r.status),
    el("td", { class: "num" }, r.prompt_tokens ?? "–"), el("td", { class: "num" }, r.completion_tokens ?? "–"),
    el("td", { class: "num" }, r.draft_tokens ?? "–"), el("td", { class: "num" }, r.accepted_tokens ?? "–"),
    el("td", { class: "num" }, fmt.num(r.tokens_per_second, 1)), el("td", { class: "num" }, fmt.num(r.duration_s, 2) + " s")))));
}

// --- charts: uPlot, with restarts and decisions as vertical lines (hover: their numbers) ---

const SERIES = [["tokens_per_second", "Tokens/s"], ["acceptance_rate", "Acceptance rate"],
  ["mean_accepted_length", "Mean accepted length"], ["draft_length", "Draft length"]];

function drawCharts(box, hist) {
  S.charts.forEach((c) => c.destroy());
  S.charts = [];
  const samples = hist.samples || [];
  if (!samples.length) { box.append(el("p", { class: "empty", id: "no-history" }, "No readings yet.")); return; }
  const xs = samples.map((s) => s.t);
  for (const [key, label] of SERIES) {
    const host = el("div", { class: "chart", "data-series": key }, el("h4", {}, label));
    box.append(host);
    const data = [xs, samples.map((s) => s[key] ?? null)];
    const chart = new uPlot({
      width: 440, height: 180, legend: { show: false },
      series: [{}, { label, stroke: "#2563eb", width: 1.5, spanGaps: true }],
      axes: [{}, { size: 50 }],
      plugins: [marksPlugin(hist.marks || [])],
    }, data, host);
    host.dataset.points = String(samples.filter((s) => s[key] !== null && s[key] !== undefined).length);
    S.charts.push(chart);
  }
}

function marksPlugin(marks) {
  const colour = (m) => (m.kind === "tuning" ? "#9333ea" : m.state === "failed" || m.state === "backoff" ? "#dc2626" : "#6b7280");
  return {
    hooks: {
      draw: [(u) => {
        const ctx = u.ctx;
        ctx.save();
        for (const m of marks) {
          const x = u.valToPos(m.t, "x", true);
          if (x < u.bbox.left || x > u.bbox.left + u.bbox.width) continue;
          ctx.strokeStyle = colour(m);
          ctx.setLineDash(m.kind === "tuning" ? [] : [4, 3]);
          ctx.beginPath(); ctx.moveTo(x, u.bbox.top); ctx.lineTo(x, u.bbox.top + u.bbox.height); ctx.stroke();
        }
        ctx.restore();
      }],
      setCursor: [(u) => {
        const tip = document.getElementById("tip");
        const left = u.cursor.left;
        if (left === null || left < 0) { tip.hidden = true; return; }
        const near = marks.find((m) => Math.abs(u.valToPos(m.t, "x") - left) < 5);
        if (!near) { tip.hidden = true; return; }
        const rect = u.over.getBoundingClientRect();
        tip.textContent = `${fmt.time(near.t)} ${near.kind}${near.state ? " → " + near.state : ""}\n${near.reason}` +
          (near.data ? "\n" + numbers(near.data) : "");
        tip.style.left = `${rect.left + left + 12}px`;
        tip.style.top = `${rect.top + (u.cursor.top || 0) + 12}px`;
        tip.hidden = false;
      }],
    },
  };
}

async function tailLog(name, pre) {
  const { body } = await api(`/v1/targets/${encodeURIComponent(name)}/logs?lines=200`);
  const atEnd = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 20;
  pre.textContent = (body.lines || []).join("\n") || "(no output yet)";
  if (atEnd) pre.scrollTop = pre.scrollHeight;
}

// --- actions: the same API calls, behind the same token (session + CSRF header) ---

const REPLACE_STEPS = { beside: "loading beside", switched: "switched", retired: "old stopped",
  in_place: "in place", abandoned: "abandoned" };

async function doRestart(name) {
  S.sequences = S.sequences || {};
  S.sequences[name] = "restart asked";
  S.watch = name;
  const { status, body } = await api(`/v1/targets/${encodeURIComponent(name)}/restart`, { method: "POST" });
  if (status !== 202) S.sequences[name] = `restart refused: ${body.error || status}`;
  render();
}

async function doReload() {
  const { status, body } = await api("/v1/reload", { method: "POST" });
  S.problems = status === 200 ? "" : (body.problems || [body.error || String(status)]).join("\n");
  S.reloadNote = status === 200 ? "reloaded" : "reload rejected: the running fleet is unchanged";
  render();
}

// --- routing and live updates ---

let pending = null;
function refreshSoon() {
  clearTimeout(pending);
  pending = setTimeout(render, 150);
}

async function render() {
  S.timers.forEach(clearInterval);
  S.timers = [];
  const [, view, arg] = (location.hash || "#/").split("/");
  const main = document.getElementById("view");
  try {
    if (view === "target") await views.target(main, decodeURIComponent(arg || ""));
    else if (views[view]) await views[view](main);
    else await views.fleet(main);
  } catch (err) {
    if (err.message !== "logged out") main.replaceChildren(el("p", { class: "problems" }, String(err)));
  }
}

function listen() {
  const live = document.getElementById("live");
  const source = new EventSource("/v1/events");
  source.onopen = () => { live.textContent = "live"; live.classList.add("on"); };
  source.onerror = () => { live.textContent = "reconnecting…"; live.classList.remove("on"); };
  const onEvent = (msg) => {
    const e = JSON.parse(msg.data);
    S.events.push(e);
    if (S.events.length > 500) S.events.shift();
    if (S.sequences && S.sequences[e.target] !== undefined && S.watch === e.target) {
      if (e.kind === "state") {
        S.sequences[e.target] += ` → ${e.new}`;
        if (e.new === "ready" || e.new === "failed") S.watch = null;
      } else if (e.kind === "replace" && REPLACE_STEPS[e.data.replace]) {
        // A restart beside the old server: its steps, no state changes (docs/tuning.md).
        S.sequences[e.target] += ` → ${REPLACE_STEPS[e.data.replace]}`;
        if (e.data.replace === "retired" || e.data.replace === "abandoned") S.watch = null;
      }
    }
    refreshSoon();
  };
  for (const kind of ["state", "tuning", "load", "reload", "daemon", "gpu", "placement", "pairing", "error", "adopt",
    "replace"]) {
    source.addEventListener(kind, onEvent);
  }
}

async function start() {
  const { body } = await api("/ui/session");
  S.csrf = body.csrf || "";
  S.header = body.csrf_header || S.header;
  document.getElementById("logout").hidden = !body.login;
  window.addEventListener("hashchange", render);
  listen();
  await render();
}

start();
