/* The jobs, models and datasets pages, and the helpers every page shares (the fleet's pages are in
 * fleet.js, gateway.js and device.js). Each render(page) builds its DOM once and returns
 * {refresh(), stop()}; the router calls refresh every few seconds. */
"use strict";

const esc = s => String(s === null || s === undefined ? "-" : s).replace(/[&<>"]/g,
  c => ({"&": "&amp;", "<": "&lt;", ">": "&gt;", "\"": "&quot;"}[c]));

function ago(ts, now) {
  if (!ts) return "never";
  const s = Math.max(0, Math.round(now - ts));
  return s < 120 ? `${s}s ago` : s < 7200 ? `${Math.round(s / 60)}m ago` : `${Math.round(s / 3600)}h ago`;
}

function linkText(link) {
  if (!link) return "-";
  if (!link.up) return "down";
  const parts = [];
  if (link.rtt_ms !== null && link.rtt_ms !== undefined) parts.push(`${link.rtt_ms.toFixed(0)} ms`);
  if (link.bandwidth_bps) parts.push(`${charts.fmt(link.bandwidth_bps / 8)}B/s`);
  if (link.availability !== null && link.availability !== undefined) parts.push(`${(100 * link.availability).toFixed(0)}%`);
  return parts.join(" · ") || "up";
}

const rowKey = r => r.id || (r.name && r.version ? `${r.name}@${r.version}` : r.gateway ? `${r.gateway}/${r.device}` : "");

/* A sortable table: columns [{key, label, num, wrap, opt, value(row), html(row)}]; each row's
 * data-key names it (id, name@version, gateway/device). Narrow screens scroll it sideways and hide
 * the `opt` columns. With state.server the rows come sorted (by cloudd) and are kept in order. */
function sortableTable(columns, state, rows) {
  const col = columns.find(c => c.key === state.sort) || columns[0];
  const value = r => (col.value ? col.value(r) : r[col.key]);
  if (!state.server) rows = rows.slice().sort((a, b) => {
    const va = value(a), vb = value(b);
    const missA = va === null || va === undefined, missB = vb === null || vb === undefined;
    if (missA || missB) return missA === missB ? 0 : missA ? 1 : -1;  // unknown values last, either way
    const cmp = va === vb ? 0 : va < vb ? -1 : 1;
    return state.desc ? -cmp : cmp;
  });
  const cls = c => `${c.num ? "num" : ""}${c.wrap ? " wrap" : ""}${c.opt ? " opt" : ""}`;
  const head = columns.map(c => `<th data-key="${c.key}" class="${cls(c)}">${c.label}` +
    `${c.key === state.sort ? (state.desc ? " ▼" : " ▲") : ""}</th>`).join("");
  const body = rows.map(r => `<tr data-key="${esc(rowKey(r))}">` + columns.map(c =>
    `<td class="${cls(c)}">${c.html ? c.html(r) : esc(r[c.key])}</td>`).join("") + "</tr>").join("");
  return `<div class="scroll"><table><thead><tr>${head}</tr></thead><tbody>${body}</tbody></table></div>`;
}

function bindSort(container, state, redraw) {
  container.querySelectorAll("th[data-key]").forEach(th => th.addEventListener("click", () => {
    state.desc = state.sort === th.dataset.key ? !state.desc : false;
    state.sort = th.dataset.key;
    redraw();
  }));
}

function jobsPage(page) {
  page.innerHTML = `<h1>Jobs</h1>${submitForm.HTML}<div id="jobs-table"></div>`;
  const state = {sort: "seq", desc: true};
  const columns = [
    {key: "id", label: "job", html: r => `<a href="#/job/${encodeURIComponent(r.id)}">${esc(r.id)}</a>`},
    {key: "state", label: "state", html: r => `<span class="state-${r.state}">${r.state}</span>`},
    {key: "model", label: "model", value: r => r.spec.model, html: r => esc(r.spec.model)},
    {key: "nproc", label: "nproc", num: true, value: r => r.spec.nproc, html: r => r.spec.nproc},
    {key: "seq", label: "progress", num: true, html: r => r.progress && r.progress.total_steps ?
      `${r.progress.step}/${r.progress.total_steps}` : "-"},
    {key: "loss", label: "loss", num: true, value: r => r.progress && r.progress.loss,
     html: r => charts.fmt(r.progress && r.progress.loss)},
    {key: "accuracy", label: "accuracy", num: true, value: r => r.progress && r.progress.accuracy,
     html: r => charts.fmt(r.progress && r.progress.accuracy)},
    {key: "registered", label: "model version", value: r => r.model && r.model.version,
     html: r => r.model ? esc(`${r.model.name}@${r.model.version}`) : "-"},
    // where the scheduler has it: queue position (#0 runs next) and why, times preempted
    {key: "queue", label: "queue", num: true, value: r => r.schedule && r.schedule.queue_position,
     html: r => queueHtml(r.schedule)},
    {key: "preemptions", label: "preempted", num: true, value: r => r.schedule ? r.schedule.preemptions : 0,
     html: r => r.schedule ? r.schedule.preemptions : "-"},
    {key: "error", label: "error", wrap: true},
  ];
  let rows = [];
  function draw() {
    const box = document.getElementById("jobs-table");
    box.innerHTML = sortableTable(columns, state, rows);
    bindSort(box, state, draw);
  }
  submitForm.attach(page);
  return {refresh: async () => {
    const doc = await api.apiGet("/v1/jobs");
    rows = doc.jobs;
    draw();
    submitForm.showLimits(page, doc);
  }, stop() {}};
}

/* "#2" with the policy's reason as its tooltip, for a waiting job; "-" for the others. */
function queueHtml(schedule) {
  if (!schedule || schedule.queue_position === null || schedule.queue_position === undefined) return "-";
  return `<span title="${esc(schedule.reason || "")}">#${schedule.queue_position}</span>`;
}

/* Lineage in one short line (job, dataset, how many gateways) and, for uploaded data, the full
 * list of gateways and LSN ranges behind a disclosure that wraps: it can be thousands of runs. */
function lineageHtml(l) {
  if (!l) return "uploaded by hand";
  if (!l.job) return esc(l.dataset || JSON.stringify(l));
  const sources = l.sources ? Object.entries(l.sources) : [];
  const short = `${esc(l.job)}: ${esc(l.dataset)}` + (sources.length ? ` from ${sources.length} gateway${sources.length > 1 ? "s" : ""}` : "");
  if (!sources.length) return short;
  const full = sources.map(([gw, logs]) => `${gw} (` + Object.entries(logs).map(([log, runs]) =>
    `${log} ${runs.map(r => r.join("-")).join(", ")}`).join("; ") + ")").join(", ");
  return `<details class="lineage"><summary>${short}</summary><div class="wrap">${esc(full)}</div></details>`;
}

function modelsPage(page) {
  page.innerHTML = `<h1>Models</h1><div id="models-table"></div>`;
  const state = {sort: "seq", desc: true};
  const columns = [
    {key: "name", label: "model"}, {key: "version", label: "version"}, {key: "seq", label: "seq", num: true},
    {key: "size", label: "bytes", num: true, html: r => charts.fmt(r.size) + "B"},
    {key: "uploaded_ts", label: "stored", html: r => new Date(r.uploaded_ts * 1000).toISOString().slice(0, 19).replace("T", " ") + "Z"},
    {key: "lineage", label: "lineage", wrap: true, value: r => (r.lineage ? r.lineage.job || "" : ""), html: r => lineageHtml(r.lineage)},
  ];
  let rows = [];
  const open = new Set();  // versions whose lineage the user expanded survive the 2 s redraw
  function draw() {
    const box = document.getElementById("models-table");
    box.innerHTML = sortableTable(columns, state, rows);
    box.querySelectorAll("details.lineage").forEach(d => {
      const key = d.closest("tr").dataset.key;
      d.open = open.has(key);
      d.addEventListener("toggle", () => (d.open ? open.add(key) : open.delete(key)));
    });
    bindSort(box, state, draw);
  }
  return {refresh: async () => { rows = (await api.apiGet("/v1/models")).models; draw(); }, stop() {}};
}

function datasetsPage(page) {
  page.innerHTML = `<h1>Datasets</h1><div class="figures" id="ds-figures"></div><div id="ds-table"></div>`;
  const state = {sort: "gateway", desc: false};
  const columns = [{key: "gateway", label: "gateway"}, {key: "device", label: "device"},
    {key: "records", label: "records", num: true}, {key: "last_ts", label: "last reading", html: r => ago(r.last_ts, Date.now() / 1000)}];
  let rows = [];
  function draw() { const box = document.getElementById("ds-table"); box.innerHTML = sortableTable(columns, state, rows); bindSort(box, state, draw); }
  return {refresh: async () => {
    const doc = await api.apiGet("/v1/datasets");
    rows = doc.gateways.flatMap(g => g.devices.map(d => ({gateway: g.id, ...d})));
    document.getElementById("ds-figures").innerHTML = `<div class="figure"><b>${charts.fmt(doc.totals.records)}</b><span>records</span></div>` +
      `<div class="figure"><b>${doc.totals.devices}</b><span>devices</span></div>`;
    draw();
  }, stop() {}};
}

window.pages = {jobsPage, modelsPage, datasetsPage, esc, ago, linkText, sortableTable, bindSort, queueHtml};
