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

// Labels come from the API (each target's and the daemon's `display` block), computed once
// in supervisor/supervision/labels.py for the CLI and this page alike; here only times.
const fmt = {
  num: (v, d = 2) => (v === null || v === undefined ? "–" : Number(v).toFixed(d)),
  time: (t) => new Date(t * 1000).toLocaleTimeString(),
  date: (t) => (t ? new Date(t * 1000).toLocaleString() : "–"),
};

const NONE = "-";
const show = (v) => (v === undefined || v === null || v === NONE ? "–" : v);

function stateTag(state) { return el("span", { class: `state state-${state}`, "data-state": state }, state); }

// A table whose rows become labelled cards on a narrow screen (app.css): each cell carries
// its column's name.
function table(attrs, headers, rows) {
  return el("table", attrs, el("thead", {}, el("tr", {}, headers.map((h) => el("th", {}, h)))),
    el("tbody", {}, rows.map(([rowAttrs, cells]) => el("tr", rowAttrs,
      cells.map((c, i) => { c.dataset.label = headers[i]; return c; })))));
}

// --- views ---

const views = {
  async fleet(main) {
    const { body } = await api("/v1/targets");
    const reload = el("button", { class: "act", id: "reload", onclick: doReload }, "Reload fleet file");
    const rows = (body.targets || []).map((t) => {
      const d = t.display || {};
      return [{ "data-target": t.name }, [
        el("td", { class: "name" }, el("a", { href: `#/target/${encodeURIComponent(t.name)}` }, t.name)),
        el("td", {}, stateTag(t.state)),
        el("td", { class: "num pid" }, t.pid ?? "–"),
        el("td", { class: "num" }, show(d.uptime)),
        el("td", {}, show(d.speculation)),
        el("td", { class: "num" }, show(d.acceptance)),
        el("td", { class: "num" }, show(d.speed)),
        el("td", { class: "num" }, show(d.memory)),
        el("td", { class: "muted" }, t.last_event ? t.last_event.reason : ""),
        el("td", { class: "actions" }, el("button", { class: "act restart", onclick: () => doRestart(t.name) }, "Restart"),
          el("span", { class: "sequence", id: `seq-${t.name}` }, S.sequences?.[t.name] || ""))]];
    });
    main.replaceChildren(
      el("h2", {}, "Fleet ", el("span", { class: "muted path", id: "fleet-file" }, body.daemon ? body.daemon.fleet_file || "" : "")),
      el("div", { class: "toolbar" }, reload, el("span", { id: "reload-result" }, S.reloadNote || "")),
      S.problems ? el("div", { class: "problems", id: "problems" }, S.problems) : "",
      rows.length ? table({ id: "fleet", class: "cards" }, ["Target", "State", "PID", "Up", "Speculation", "Accepted",
        "Speed", "Memory", "Last event", "Restart"], rows) : el("p", { class: "empty" }, "No targets in the fleet file."));
  },

  async target(main, name) {
    const path = `/v1/targets/${encodeURIComponent(name)}`;
    const [{ body: t }, { body: hist }, { body: reqs }, { body: why }] = await Promise.all([
      api(path), api(`${path}/history`), api("/v1/requests?limit=200"), api(`${path}/tuning`)]);
    if (!t.name) { main.replaceChildren(el("p", { class: "empty" }, `No target ${name}.`)); return; }
    const d = t.display || {};
    const facts = el("dl", { class: "facts", id: "facts" },
      ...[["State", stateTag(t.state)], ["PID", t.pid ?? "–"], ["Up", show(d.uptime)], ["Endpoint", t.endpoint],
        ["Model", show(d.source)], ["Speculation", show(d.speculation)], ["Acceptance", show(d.acceptance)],
        ["Accepted length", show(d.accepted_length)], ["Speed", show(d.speed)], ["Memory", show(d.memory)],
        ["Restarts", show(d.restarts)], ["Last event", show(d.last_event)]]
        .flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, v)]));
    const charts = el("div", { class: "charts", id: "charts" });
    const marks = hist.marks || [];
    const markRows = marks.slice(-50).reverse().map((m) => [{ class: "mark", "data-kind": m.kind }, [
      el("td", {}, fmt.time(m.t)), el("td", {}, m.kind + (m.state ? " → " + m.state : "")),
      el("td", {}, m.reason), el("td", { class: "muted" }, numbers(m.data))]]);
    const log = el("pre", { class: "log", id: "log" }, "…");
    main.replaceChildren(el("h2", {}, name), facts,
      el("div", { class: "toolbar" }, el("button", { class: "act restart", onclick: () => doRestart(name) }, "Restart"),
        el("span", { class: "sequence", id: `seq-${name}` }, S.sequences?.[name] || "")),
      el("h3", {}, "Why this setting"), whyView(why),
      el("h3", {}, "History"), charts,
      el("h3", {}, "Restarts and decisions"),
      markRows.length ? table({ id: "marks", class: "cards" }, ["Time", "What", "Reason", "Numbers"], markRows)
        : el("p", { class: "empty" }, "None yet."),
      el("h3", {}, "Requests"), requestsTable((reqs.requests || []).filter((r) => r.target === name)),
      el("h3", {}, "Log"), log);
    drawCharts(charts, hist);
    await tailLog(name, log);
    if (main.current) S.timers.push(setInterval(() => tailLog(name, log), 2000));
  },

  async requests(main) {
    const { body } = await api("/v1/requests?limit=500");
    main.replaceChildren(el("h2", {}, "Requests through the proxy"), requestsTable(body.requests || []));
  },

  async events(main) {
    const rows = S.events.slice().reverse().map((e) => [{}, [
      el("td", {}, fmt.time(e.time)), el("td", {}, e.target), el("td", {}, e.kind),
      el("td", {}, e.old ? `${e.old} → ${e.new}` : ""), el("td", {}, e.reason)]]);
    main.replaceChildren(el("h2", {}, "Events (since this page was opened)"),
      rows.length ? table({ id: "events", class: "cards" }, ["Time", "Target", "Kind", "Change", "Reason"], rows)
        : el("p", { class: "empty" }, "None yet."));
  },

  async daemon(main) {
    const { body } = await api("/v1/targets");
    const d = body.daemon || {};
    const shown = d.display || {};
    const rejected = d.rejected_reload;
    const applied = d.last_reload;
    const facts = [["Status", d.status], ["Version", d.version], ["PID", d.pid], ["Up", show(shown.uptime)],
      ["Started", fmt.date(d.started)], ["Process created", fmt.date(d.create_time)],
      ["Status written", fmt.date(d.updated)], ["Fleet file", d.fleet_file], ["State directory", d.state_dir],
      ["API", d.api], ["Proxy", d.proxy || "off"]];
    const gpus = shown.gpus;
    main.replaceChildren(el("h2", {}, "Daemon"),
      el("dl", { class: "facts", id: "daemon" }, ...facts.flatMap(([k, v]) => [el("dt", {}, k), el("dd", { "data-fact": k }, show(v))])),
      el("h3", {}, "GPUs"),
      Array.isArray(gpus) && gpus.length ? table({ id: "gpus", class: "cards" }, ["GPU", "Name", "Free", "Total", "Busy", "Temperature"],
        gpus.map((g) => [{}, [g.index, g.name, g.free, g.total, g.utilization, g.temperature].map((v) => el("td", {}, show(v)))]))
        : el("p", { class: "empty", id: "gpus" }, typeof gpus === "string" ? gpus : "No GPU."),
      el("h3", {}, "Last reload"),
      el("p", {}, applied ? `applied at ${fmt.date(applied.time)}: added ${applied.added.join(", ") || "none"}, ` +
        `removed ${applied.removed.join(", ") || "none"}, changed ${applied.changed.join(", ") || "none"}` : "none since the daemon started"),
      rejected ? el("div", { class: "problems" }, `rejected at ${fmt.date(rejected.time)}:\n` + rejected.problems.join("\n"))
        : el("p", { class: "ok" }, "No rejected reload."));
  },
};

// --- why this setting: the tuner's model (GET /v1/targets/{name}/tuning, docs/tuning.md) ---

function whyView(why) {
  if (!why || !why.enabled) return el("p", { class: "empty", id: "why" }, "Not tuned: no speculation, or tuning is off for this target.");
  const decisions = (why.decisions || []).slice().reverse().map((x) => [{ class: "decision", "data-action": x.action }, [
    el("td", {}, fmt.date(x.time)), el("td", {}, `${x.old} → ${x.new}`), el("td", {}, x.reason),
    el("td", {}, x.expectation || "–"), el("td", {}, x.cost)]]);
  const classes = (why.classes || []).map((c) => [{ class: "class" }, [
    el("td", {}, c.name), el("td", { class: "num" }, `${Math.round(100 * c.share)} %`),
    el("td", { class: "num", title: `between ${pct(c.p0_low)} and ${pct(c.p0_high)}` }, pct(c.p0)),
    el("td", { class: "num", title: `between ${pct(c.rho_low)} and ${pct(c.rho_high)}` }, pct(c.rho)),
    el("td", { class: "num" }, fmt.num(c.steps, 0))]]);
  return el("div", { class: "why", id: "why" },
    el("p", { class: "summary", id: "why-summary" }, why.summary),
    why.waiting_for ? el("p", { class: "muted", id: "why-waiting" }, `Waiting for ${why.waiting_for}.`) : "",
    el("div", { class: "why-grid" },
      el("div", { class: "chart why-chart" }, el("h4", {}, "Predicted speedup over speculation off, for the current mix"), speedupChart(why)),
      el("div", { class: "chart why-cost", id: "why-cost" }, el("h4", {}, "What a step costs on this machine"), costView(why.cost))),
    el("h4", {}, "What each class of request accepts"),
    classes.length ? table({ id: "why-classes", class: "cards" }, ["Class", "Share of the mix", "First drafted token accepted",
      "Each next one, after an accepted one", "Drafted steps measured"], classes)
      : el("p", { class: "empty", id: "why-classes" }, "No drafted step measured yet."),
    el("h4", {}, "Decisions"),
    decisions.length ? table({ id: "decisions", class: "cards" }, ["When", "Setting", "Why", "Expected", "What the restart cost"], decisions)
      : el("p", { class: "empty", id: "decisions" }, "No decision yet."));
}

const pct = (v) => (typeof v === "number" ? `${Math.round(100 * v)} %` : "–");

function svgMaker() {
  const NS = "http://www.w3.org/2000/svg";
  return (tag, attrs, text) => {
    const n = document.createElementNS(NS, tag);
    for (const [k, v] of Object.entries(attrs)) n.setAttribute(k, v);
    if (text !== undefined) n.textContent = text;
    return n;
  };
}

// One bar per setting (its predicted speedup, the range its acceptance allows as a whisker),
// the running one filled and named, speculation off at 1.0×. A narrow viewBox, so that its
// text stays readable when a phone shrinks the chart to the screen.
function speedupChart(why) {
  const points = why.predicted || [];
  if (!points.length) return el("p", { class: "empty" }, "Nothing predicted yet.");
  const svg = svgMaker();
  const W = 420, H = 240, L = 40, B = 44, T = 12;
  const top = Math.max(1.2, ...points.map((p) => p.high)) * 1.08;
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const slot = Math.min((W - L - 8) / points.length, 90);
  const x0 = L + (W - L - 8 - slot * points.length) / 2;
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "speedup", role: "img", "aria-label": "predicted speedup by setting" });
  for (const v of [0, 0.5, 1, 1.5, 2, 2.5, 3, 4].filter((v) => v < top)) {
    root.append(svg("line", { x1: L, x2: W - 8, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: L - 4, y: y(v) + 5, class: "tick", "text-anchor": "end" }, `${v}×`));
  }
  points.forEach((p, i) => {
    const x = x0 + i * slot + slot * 0.15, mid = x + slot * 0.35;
    const bar = svg("rect", { x, y: y(p.mid), width: slot * 0.7, height: y(0) - y(p.mid),
      class: "bar" + (p.running ? " running" : ""), "data-setting": p.setting, "data-speedup": p.mid });
    bar.append(svg("title", {}, `${p.setting}: predicted ${p.mid}× speculation off (between ${p.low}× and ${p.high}×)`));
    root.append(bar, svg("line", { x1: mid, x2: mid, y1: y(p.low), y2: y(p.high), class: "range" }),
      svg("text", { x: mid, y: y(p.high) - 4, class: "value", "text-anchor": "middle" }, `${p.mid.toFixed(2)}×`),
      svg("text", { x: mid, y: H - B + 18, class: "tick", "text-anchor": "middle" }, p.setting));
    if (p.running) root.append(svg("text", { x: mid, y: H - B + 36, class: "note", "text-anchor": "middle" }, "running"));
  });
  root.append(svg("line", { x1: L, x2: W - 8, y1: y(1), y2: y(1), class: "off" }));
  return root;
}

// The cost in words and a small chart: a drafted step in plain steps by draft length, with
// none and with all of its draft accepted.
function costView(cost) {
  if (!cost) return el("p", { class: "empty" }, "Not measured yet: the calibration runs beside the server before the first decision.");
  const svg = svgMaker();
  const W = 420, H = 200, L = 40, B = 36, T = 10, K = 16;
  const steps = (k, accepted) => (cost.step_ms + cost.per_draft_ms * k + cost.per_accepted_ms * accepted) / cost.plain_ms;
  const top = Math.max(2, steps(K, K)) * 1.1;
  const x = (k) => L + (W - L - 10) * (k - 1) / (K - 1);
  const y = (v) => T + (H - T - B) * (1 - v / top);
  const root = svg("svg", { viewBox: `0 0 ${W} ${H}`, class: "speedup cost", role: "img", "aria-label": "cost of a drafted step by draft length" });
  for (const v of [0, 1, 2, 5, 10, 15, 20, 30].filter((v) => v < top)) {
    root.append(svg("line", { x1: L, x2: W - 10, y1: y(v), y2: y(v), class: "grid" }),
      svg("text", { x: L - 4, y: y(v) + 5, class: "tick", "text-anchor": "end" }, `${v}`));
  }
  for (const k of [1, 4, 8, 12, 16]) root.append(svg("text", { x: x(k), y: H - B + 18, class: "tick", "text-anchor": "middle" }, `n=${k}`));
  const line = (f, cls) => svg("polyline", { class: cls, fill: "none",
    points: Array.from({ length: K }, (_, i) => `${x(i + 1)},${y(f(i + 1))}`).join(" ") });
  root.append(line((k) => steps(k, 0), "cost-none"), line((k) => steps(k, k), "cost-all"),
    svg("text", { x: W - 12, y: y(steps(K, K)) - 6, class: "tick", "text-anchor": "end" }, "all accepted"),
    svg("text", { x: W - 12, y: y(steps(K, 0)) + 16, class: "tick", "text-anchor": "end" }, "none accepted"));
  return el("div", {},
    el("p", { id: "why-cost-words" }, `A plain step ${fmt.num(cost.plain_ms, 1)} ms; a drafted step ${fmt.num(cost.step_ms, 1)} ms ` +
      `+ ${fmt.num(cost.per_draft_ms, 2)} ms per drafted token + ${fmt.num(cost.per_accepted_ms, 2)} ms per accepted token ` +
      (cost.calibrated ? "(calibrated, refined by serving)." : "(learnt from serving only: not calibrated).")),
    el("p", { class: "muted" }, "A drafted step, in plain steps, by draft length:"), root);
}

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
  const tokens = (v) => el("td", { class: "num" }, v ?? "–");
  return table({ class: "requests cards" }, ["Time", "Target", "Status", "Prompt tokens", "Generated", "Drafted",
    "Accepted", "Speed", "Duration"], list.map((r) => [{ class: "request", "data-target": r.target }, [
    el("td", {}, fmt.time(r.time)), el("td", {}, r.target), el("td", { class: "num" }, r.status),
    el("td", { class: "num", title: "the whole prompt (OpenAI usage.prompt_tokens); cached: served from the runtime's prompt cache" },
      r.prompt_tokens ?? "–", r.cached_tokens ? el("span", { class: "muted" }, ` (${r.cached_tokens} cached)`) : ""),
    tokens(r.completion_tokens), tokens(r.draft_tokens), tokens(r.accepted_tokens),
    el("td", { class: "num" }, r.tokens_per_second ? `${fmt.num(r.tokens_per_second, 1)} tok/s` : "–"),
    el("td", { class: "num" }, fmt.num(r.duration_s, 2) + " s")]]));
}

// --- charts: uPlot, with restarts and decisions as vertical lines (hover: their numbers) ---
// Each chart fills its card and follows its width; its y-axis carries the unit the history's
// `series` gives (acceptance: a share sampled, a percentage shown).

function drawCharts(box, hist) {
  S.charts.forEach((c) => c.chart.destroy());
  S.charts.forEach((c) => c.observer.disconnect());
  S.charts = [];
  S.chartBy = {};
  const samples = hist.samples || [];
  const xs = samples.map((s) => s.t);
  for (const series of hist.series || []) {
    const host = el("div", { class: "chart", "data-series": series.key }, el("h4", {}, `${series.label} (${series.unit})`));
    box.append(host);
    const ys = samples.map((s) => (s[series.key] === null || s[series.key] === undefined ? null : s[series.key] * series.scale));
    const points = ys.filter((v) => v !== null).length;
    host.dataset.points = String(points);
    if (!points) { host.append(el("p", { class: "empty no-data" }, "No data yet.")); continue; }
    mountChart(host, series, [xs, ys], hist.marks || []);
  }
}

function mountChart(host, series, data, marks) {
  const width = () => Math.max(200, host.clientWidth - 16);
  const unit = series.unit === "%" ? "%" : "";
  // Shares from 0 to 100 %; other quantities from 0, so that a flat line reads as flat.
  const range = series.unit === "%" ? [0, 100] : (u, min, max) => [0, max > 0 ? max * 1.1 : 1];
  const chart = new uPlot({
    width: width(), height: 180, legend: { show: false }, scales: { y: { range } },
    series: [{}, { label: series.label, stroke: "#2563eb", width: 1.5, spanGaps: true }],
    axes: [{ space: 90 }, { size: 56, label: series.unit, labelSize: 16,
      values: (u, ticks) => ticks.map((v) => `${+v.toFixed(2)}${unit}`) }],
    plugins: [marksPlugin(marks)],
  }, data, host);
  const observer = new ResizeObserver(() => {
    if (Math.abs(chart.width - width()) > 2) chart.setSize({ width: width(), height: 180 });
  });
  observer.observe(host);
  S.charts.push({ chart, observer });
  S.chartBy[series.key] = chart;
}

function marksPlugin(marks) {
  const colour = (m) => (m.kind === "tuning" ? "#9333ea" : m.state === "failed" || m.state === "backoff" || m.state === "waiting" ? "#dc2626" : "#6b7280");
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
        // Every mark under the cursor, the nearest first: events seconds apart (a
        // calibration and the decision it allowed) draw one line.
        const dist = (m) => Math.abs(u.valToPos(m.t, "x") - left);
        const near = marks.filter((m) => dist(m) < 5).sort((a, b) => dist(a) - dist(b));
        if (!near.length) { tip.hidden = true; return; }
        const rect = u.over.getBoundingClientRect();
        tip.textContent = near.map((m) => `${fmt.time(m.t)} ${m.kind}${m.state ? " → " + m.state : ""}\n${m.reason}` +
          (m.data ? "\n" + numbers(m.data) : "")).join("\n\n");
        tip.style.left = `${Math.min(rect.left + left + 12, window.innerWidth - tip.offsetWidth - 8)}px`;
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

// Renders overlap: a hash change or an event starts one while another still awaits the API
// (two hash changes in a row, or a slow answer). Only the newest may draw: an older one that
// finishes later would put back the view the user left, and nothing redraws it until the
// next event. A view draws through `main`, which refuses (STALE) once a newer render began.
const STALE = new Error("a newer render began");
let renders = 0;

function canvas(view, mine) {
  return {
    replaceChildren(...nodes) {
      if (mine !== renders) throw STALE;
      view.replaceChildren(...nodes);
    },
    get current() { return mine === renders; },
  };
}

async function render() {
  S.timers.forEach(clearInterval);
  S.timers = [];
  const [, view, arg] = (location.hash || "#/").split("/");
  const main = canvas(document.getElementById("view"), ++renders);
  try {
    if (view === "target") await views.target(main, decodeURIComponent(arg || ""));
    else if (views[view]) await views[view](main);
    else await views.fleet(main);
  } catch (err) {
    if (main.current && err.message !== "logged out") {  // STALE: a newer render draws
      main.replaceChildren(el("p", { class: "problems" }, String(err)));
    }
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
  // A read key's session: the page without its buttons (the API would refuse them anyway).
  document.body.classList.toggle("readonly", body.admin === false);
  window.addEventListener("hashchange", render);
  listen();
  await render();
}

start();
