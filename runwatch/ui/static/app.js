// runwatch web view: fetches JSON from this server, redraws on Server-Sent Events.
// No framework and no external assets; charts arrive as SVG drawn by the server.
"use strict";

const $ = (sel) => document.querySelector(sel);
const esc = (v) => String(v ?? "").replace(/[&<>"']/g, (c) => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;", "'": "&#39;"}[c]));
const num = (v, digits = 4) => (v === null || v === undefined ? "–" : typeof v === "string" ? v : Number(v).toFixed(digits));
const pct = (v, digits = 2) => (v === null || v === undefined ? "–" : typeof v === "string" ? v : (100 * v).toFixed(digits) + "%");
const ago = (unix) => {
  const s = Math.max(0, Date.now() / 1000 - unix);
  return s < 60 ? `${s.toFixed(0)} s ago` : s < 3600 ? `${(s / 60).toFixed(0)} min ago` : `${(s / 3600).toFixed(1)} h ago`;
};

function auditText(a) {
  if (!a) return '<span class="muted">–</span>';
  if (a.error) return `<span class="pill bad" title="${esc(a.error)}">error</span>`;
  return a.agrees
    ? `<span class="pill ok" title="${a.anomalies} anomalies, ${a.commands} commands re-derived">agrees</span> <span class="muted">${ago(a.at_unix_s)}</span>`
    : `<span class="pill bad">DISAGREES</span> <span class="muted">${ago(a.at_unix_s)}</span>`;
}

function anomalyPills(byKind) {
  const kinds = Object.entries(byKind || {});
  if (!kinds.length) return '<span class="muted">none</span>';
  return kinds.map(([k, n]) => `<span class="pill warn" data-kind="${esc(k)}">${esc(k)} ×${n}</span>`).join("");
}

// ------------------------------------------------------------------ live updates

let busy = false, again = false;
function refresh(load) {
  if (busy) { again = true; return; }
  busy = true;
  load().catch((e) => banner(`cannot reach the runwatch server: ${e}`)).finally(() => {
    busy = false;
    if (again) { again = false; refresh(load); }
  });
}

function follow(load) {
  const live = $("#live");
  const source = new EventSource("/api/events");
  source.addEventListener("open", () => { live.className = "live on"; live.textContent = "live"; });
  source.addEventListener("error", () => { live.className = "live off"; live.textContent = "reconnecting"; });
  source.addEventListener("change", () => refresh(load));
  refresh(load);
}

function banner(text) {
  const b = $("#banner");
  b.hidden = !text;
  b.textContent = text || "";
}

async function getJSON(url) {
  const r = await fetch(url, {cache: "no-store"});
  const body = await r.json();
  if (!r.ok) throw new Error(body.error || r.statusText);
  return body;
}

// ------------------------------------------------------------------ fleet page

function fleetPage() {
  const params = new URLSearchParams(location.search);
  const state = {
    q: params.get("q") || "", status: params.get("status") || "", sort: params.get("sort") || "run",
    desc: params.get("desc") === "1", page: Number(params.get("page") || 0), size: Number(params.get("size") || 50),
  };
  $("#q").value = state.q;
  $("#status").value = state.status;
  $("#size").value = String(state.size);

  const remember = () => {
    const p = new URLSearchParams();
    for (const [k, v] of Object.entries(state)) if (v && !(k === "sort" && v === "run") && !(k === "size" && v === 50)) p.set(k, v === true ? "1" : v);
    history.replaceState(null, "", p.toString() ? `?${p}` : location.pathname);
  };

  async function load() {
    const p = new URLSearchParams({q: state.q, status: state.status, sort: state.sort, desc: state.desc ? "1" : "0", page: state.page, size: state.size});
    const data = await getJSON(`/api/fleet?${p}`);
    banner(data.error);
    state.page = data.page;
    drawChips(data);
    drawRows(data);
    $("#count").textContent = data.total === data.runs ? `${data.runs} runs` : `${data.total} of ${data.runs} runs`;
    $("#pageinfo").textContent = `page ${data.page + 1} of ${data.pages}`;
    $("#prev").disabled = data.page <= 0;
    $("#next").disabled = data.page >= data.pages - 1;
    for (const th of document.querySelectorAll("th[data-sort]")) {
      th.classList.toggle("sorted", th.dataset.sort === state.sort);
      th.classList.toggle("desc", th.dataset.sort === state.sort && state.desc);
    }
  }

  function drawChips(data) {
    const chips = [["", "runs", data.runs], ...Object.entries(data.statuses).map(([k, n]) => [k, k, n])];
    $("#status-chips").innerHTML = chips.map(([value, label, n]) =>
      `<span class="chip${state.status === value ? " active" : ""}" data-status="${esc(value)}"><b>${n}</b>${esc(label)}</span>`).join("");
  }

  function drawRows(data) {
    if (!data.rows.length) {
      const why = data.runs ? "no run matches the filter" : data.ready ? "no runs known to the processors yet" : "reading the processors' state…";
      $("#rows").innerHTML = `<tr><td colspan="11" class="empty">${why}</td></tr>`;
      return;
    }
    $("#rows").innerHTML = data.rows.map((r) => {
      const ranks = r.live_ranks.length + r.dead_ranks.length;
      const dead = r.dead_ranks.length ? ` <span class="pill bad" title="dead ranks ${r.dead_ranks.join(", ")}">${r.dead_ranks.length} dead</span>` : "";
      return `<tr data-run="${esc(r.run_id)}">
        <td class="run"><a href="/run/${encodeURIComponent(r.run_id)}">${esc(r.run_id)}</a></td>
        <td class="status"><span class="pill ${esc(r.status)}">${esc(r.status)}</span></td>
        <td class="num inc">${r.incarnation}</td>
        <td class="num step">${r.last_step ?? "–"}</td>
        <td class="num loss">${num(r.loss)}</td>
        <td class="num mfu">${pct(r.mfu)}</td>
        <td class="num ranks">${r.live_ranks.length}/${ranks}${dead}</td>
        <td class="anomalies">${anomalyPills(r.anomalies)}</td>
        <td class="num restarts">${r.restarts}</td>
        <td class="continuity">${r.continuity_ok ? '<span class="pill ok">ok</span>' : '<span class="pill bad">broken</span>'}</td>
        <td class="audit">${auditText(r.audit)}</td></tr>`;
    }).join("");
  }

  const reload = () => { remember(); refresh(load); };
  let timer = null;
  $("#q").addEventListener("input", () => { clearTimeout(timer); timer = setTimeout(() => { state.q = $("#q").value; state.page = 0; reload(); }, 200); });
  $("#status").addEventListener("change", () => { state.status = $("#status").value; state.page = 0; reload(); });
  $("#size").addEventListener("change", () => { state.size = Number($("#size").value); state.page = 0; reload(); });
  $("#prev").addEventListener("click", () => { state.page -= 1; reload(); });
  $("#next").addEventListener("click", () => { state.page += 1; reload(); });
  $("#status-chips").addEventListener("click", (e) => {
    const chip = e.target.closest(".chip");
    if (!chip) return;
    state.status = chip.dataset.status; $("#status").value = state.status; state.page = 0; reload();
  });
  for (const th of document.querySelectorAll("th[data-sort]")) {
    th.addEventListener("click", () => {
      if (state.sort === th.dataset.sort) state.desc = !state.desc; else { state.sort = th.dataset.sort; state.desc = false; }
      reload();
    });
  }
  follow(load);
}

// ------------------------------------------------------------------ run page

function cell(v) {
  if (v === null || v === undefined) return '<span class="muted">–</span>';
  if (typeof v === "number" && !Number.isInteger(v)) return esc(v.toPrecision(6));
  if (Array.isArray(v)) return v.length ? esc(v.join(", ")) : '<span class="muted">none</span>';
  if (typeof v === "object") return receiptHTML(v);
  return esc(v);
}

function receiptHTML(value) {
  // objects as key/value tables; lists of objects as one compact table (a row per item)
  if (Array.isArray(value) && value.length && typeof value[0] === "object") {
    const cols = Object.keys(value[0]);
    return `<table class="list"><tr>${cols.map((c) => `<th>${esc(c.replaceAll("_", " "))}</th>`).join("")}</tr>` +
      value.map((row) => `<tr>${cols.map((c) => `<td>${cell(row[c])}</td>`).join("")}</tr>`).join("") + "</table>";
  }
  if (value === null || typeof value !== "object" || Array.isArray(value)) return cell(value);
  return "<table>" + Object.entries(value).map(([k, v]) => {
    if (k === "recent") return `<tr><td class="k">recent</td><td class="muted">${v.length} listed in the verdict feed above</td></tr>`;
    return `<tr><td class="k">${esc(k.replaceAll("_", " "))}</td><td>${receiptHTML(v)}</td></tr>`;
  }).join("") + "</table>";
}

const FEED_SKIP = new Set(["type", "run_id", "ts_ns", "seq", "dropped", "detail"]);
function feedRow(e) {
  const time = new Date(e.ts_ns / 1e6).toISOString().slice(11, 23);
  let cls = "controller", what = e.type, step = "", rank = "", detail = "";
  if (e.type === "anomaly") {
    cls = "anomaly"; what = e.kind; step = e.step; rank = e.rank ?? ""; detail = e.detail;
  } else if (e.type === "restart_requested") {
    cls = "command"; what = `command: ${e.action}`;
    detail = `ends incarnation ${e.incarnation ?? 0} for ${e.cause_kind}; checkpoint ${e.max_checkpoint_step == null ? "latest" : "≤ " + e.max_checkpoint_step}`;
  } else if (e.type === "restart_completed") {
    what = "restarted"; detail = `from ${e.checkpoint_step == null ? "scratch" : "step " + e.checkpoint_step} with ${e.world_size} ranks in ${num(e.duration_s, 1)} s`;
  } else if (e.type === "restart_failed" || e.type === "command_rejected") {
    cls = "anomaly"; what = e.type === "restart_failed" ? "restart failed" : "command rejected"; detail = e.reason;
  }
  if (e.shadow) {  // shadow mode: recorded, shown, never executed
    cls += " shadow"; what = `${what} (shadow)`;
    if (e.type === "restart_requested") detail = `shadow, not executed: would have ${detail.replace(/^ends/, "ended")}`;
  }
  const fields = Object.entries(e).filter(([k, v]) => !FEED_SKIP.has(k) && v !== null && v !== undefined && v !== "")
    .map(([k, v]) => `<dt>${esc(k)}</dt><dd>${esc(typeof v === "object" ? JSON.stringify(v) : v)}</dd>`).join("");
  return `<tr class="${cls}" data-type="${esc(e.type)}"${e.kind ? ` data-kind="${esc(e.kind)}"` : ""}>
    <td class="muted">${time}</td><td class="kind">${esc(what)}</td><td>${esc(step)}</td><td>${esc(rank)}</td>
    <td class="detail"><details><summary>${esc(detail)}</summary><dl>${fields}</dl></details></td></tr>`;
}

function runPage() {
  const runId = decodeURIComponent(location.pathname.slice("/run/".length));
  document.title = `runwatch · ${runId}`;
  $("#run-title").textContent = runId;
  const open = new Set();

  async function load() {
    let data;
    try {
      data = await getJSON(`/api/runs/${encodeURIComponent(runId)}`);
    } catch (e) {
      banner(String(e.message || e));
      return;
    }
    banner("");
    const s = data.summary;
    const badge = $("#status-badge");
    badge.textContent = s ? s.status : "unknown";
    badge.className = `badge pill ${s ? s.status : ""}`;
    const kpi = (id, label, value, cls = "") => `<div class="kpi"><div class="label">${label}</div><div class="value ${cls}" id="kpi-${id}">${value}</div></div>`;
    const anomalies = s ? s.anomalies_total : 0;
    $("#kpis").innerHTML = s ? [
      kpi("step", "step", s.last_step ?? "–"),
      kpi("loss", "loss", num(s.loss)),
      kpi("mfu", "MFU (run)", pct(s.mfu_avg)),
      kpi("ranks", "live ranks", `${s.live_ranks.length}/${s.live_ranks.length + s.dead_ranks.length}`, s.dead_ranks.length ? "bad" : ""),
      kpi("incarnation", "incarnation", s.incarnation),
      kpi("restarts", "restarts", s.restarts),
      kpi("anomalies", "anomalies", anomalies, anomalies ? "bad" : "ok"),
      kpi("continuity", "continuity", s.continuity_ok ? "ok" : "broken", s.continuity_ok ? "ok" : "bad"),
      ...(s.replica_groups ? [
        kpi("groups", "replica groups", `${s.replica_groups - s.replicas_lost.length}/${s.replica_groups}`, s.replicas_lost.length ? "bad" : "ok"),
        kpi("degraded", "degraded steps", s.degraded_steps, s.degraded_steps ? "warn" : "ok"),
      ] : []),
    ].join("") : "";
    $("#loss-chart").innerHTML = data.charts.loss;
    $("#grad-chart").innerHTML = data.charts.grad_norm;
    $("#mfu-chart").innerHTML = data.charts.mfu;
    $("#restarts").innerHTML = data.restarts.length
      ? "<tr><th>first step</th><th>resumed from</th><th>incarnation</th><th>continuity</th><th>checked steps</th><th>max z</th></tr>" +
        data.restarts.map((r) => `<tr><td>${r.at_step}</td><td>step ${r.from_step}</td><td>${r.incarnation}</td>
          <td><span class="pill ${r.continuity === "broken" ? "bad" : r.continuity === "ok" ? "ok" : ""}">${esc(r.continuity)}</span></td>
          <td>${r.checked_steps}</td><td>${num(r.max_z, 2)}</td></tr>`).join("")
      : '<tr><td class="muted">no restarts</td></tr>';
    const spans = data.degraded || [];
    $("#degraded-card").hidden = !(spans.length || (s && s.replica_groups));
    const degradedSteps = spans.reduce((n, d) => n + d.last - d.first + 1, 0);
    $("#degraded-count").textContent = spans.length ? `(${degradedSteps} steps in ${spans.length} spans, newest first)` : "";
    $("#degraded").innerHTML = spans.length
      ? "<tr><th>steps</th><th>replica groups stepping</th><th>steps</th></tr>" +
        spans.slice().reverse().map((d) => `<tr data-from="${d.first}" data-to="${d.last}"><td>${d.first}–${d.last}</td><td>${d.groups} of ${d.of}</td><td>${d.last - d.first + 1}</td></tr>`).join("")
      : '<tr><td class="muted">every step had every replica group</td></tr>';
    $("#audit").innerHTML = `<p>${auditText(data.audit)}</p>` + (data.audit && !data.audit.error ? `<p class="muted">${data.audit.anomalies} anomalies and ${data.audit.commands} commands re-derived from ${data.audit.input_records} input records</p>` : "");
    $("#audit-now").disabled = data.auditing;
    $("#audit-now").textContent = data.auditing ? "auditing…" : "audit now";
    for (const d of document.querySelectorAll("#feed details[open]")) open.add(d.closest("tr").dataset.i);
    const feed = data.feed.slice().reverse();
    $("#feed-count").textContent = `(${feed.length}, newest first)`;
    $("#feed").innerHTML = feed.length
      ? "<tr><th>log time (UTC)</th><th>what</th><th>step</th><th>rank</th><th>detail</th></tr>" + feed.map(feedRow).join("")
      : '<tr><td class="muted">no verdicts: nothing wrong seen</td></tr>';
    feed.forEach((e, i) => { const tr = $("#feed").rows[i + 1]; if (tr) tr.dataset.i = `${e.ts_ns}:${e.verdict_id || e.command_id}`; });
    for (const tr of $("#feed").rows) if (open.has(tr.dataset.i)) tr.querySelector("details")?.setAttribute("open", "");
    $("#receipt").innerHTML = receiptHTML(data.receipt);
  }

  $("#audit-now").addEventListener("click", async () => {
    $("#audit-now").disabled = true;
    const token = document.querySelector('meta[name="runwatch-csrf"]')?.content || "";
    await fetch(`/api/runs/${encodeURIComponent(runId)}/audit`, {method: "POST", headers: {"X-Runwatch-CSRF": token}});
    refresh(load);
  });
  follow(load);
}

if (document.body.dataset.page === "fleet") fleetPage(); else runPage();
