/* The fleet page (one page of gateways, paged, sorted and filtered by cloudd: GET /v1/fleet), the
 * alerts page and the alert list the gateway page shows too. Invariant: the browser never holds
 * more than one page of gateways; sorting, filtering and paging are query parameters. */
"use strict";

const PAGE_SIZE = 50;
const int = n => (n === null || n === undefined ? "-" : Math.round(n).toLocaleString("en-US"));

function placementSummary(r) {
  return r.tasks ? `${r.cloud_tasks} of ${r.tasks} tasks in the cloud` : "-";
}

function stateHtml(state) {
  const cls = state === "online" ? "on" : state === "degraded" ? "warn" : "off";
  return `<span class="dot ${cls}"></span>${state}`;
}

function fleetPage(page) {
  page.innerHTML = `<h1>Fleet</h1><div class="figures" id="fleet-figures"></div>
    <div class="toolbar"><input id="fleet-filter" placeholder="filter by gateway id…" size="24">
    <select id="fleet-state"><option value="">every state</option><option>online</option>
    <option>degraded</option><option>offline</option></select>
    <span id="fleet-shown"></span>
    <span class="pager"><button type="button" id="fleet-prev">‹ prev</button>
    <button type="button" id="fleet-next">next ›</button></span></div><div id="fleet-table"></div>`;
  const state = {sort: "id", desc: false, server: true, offset: 0, doc: null};
  const columns = [
    {key: "state", label: "state", html: r => stateHtml(r.state)},
    {key: "id", label: "gateway", html: r => `<a href="#/gateways/${encodeURIComponent(r.id)}">${pages.esc(r.id)}</a>`},
    {key: "last_seen", label: "last seen", num: true, html: r => pages.ago(r.last_seen, state.doc.now)},
    {key: "backlog_records", label: "backlog", num: true, html: r => int(r.backlog_records)},
    {key: "rtt_ms", label: "link", opt: true, html: r => pages.esc(pages.linkText(r.link))},
    {key: "cloud_tasks", label: "placement", opt: true, html: r => placementSummary(r)},
    {key: "records", label: "records", num: true, opt: true, html: r => int(r.records)},
    {key: "alerts", label: "alerts", num: true,
     html: r => (r.alerts ? `<a class="state-failed" href="#/alerts/${encodeURIComponent(r.id)}">${r.alerts}</a>` : "0")},
  ];
  let typing = null;
  async function refresh() {
    const q = new URLSearchParams({sort: state.sort, offset: state.offset, limit: PAGE_SIZE,
      q: document.getElementById("fleet-filter").value.trim()});
    if (state.desc) q.set("desc", "1");
    const only = document.getElementById("fleet-state").value;
    if (only) q.set("state", only);
    state.doc = await api.apiGet(`/v1/fleet?${q}`);
    draw();
  }
  function draw() {
    const doc = state.doc, t = doc.totals, p = doc.page;
    const box = document.getElementById("fleet-table");
    box.innerHTML = pages.sortableTable(columns, state, doc.gateways);
    pages.bindSort(box, state, () => { state.offset = 0; refresh().catch(app.showError); });
    const last = Math.min(p.offset + doc.gateways.length, p.matched);
    document.getElementById("fleet-shown").textContent =
      p.matched ? `${int(p.offset + 1)}–${int(last)} of ${int(p.matched)}` : `none of ${int(t.gateways)} match`;
    document.getElementById("fleet-prev").disabled = p.offset === 0;
    document.getElementById("fleet-next").disabled = last >= p.matched;
    const figure = (value, label, cls) => `<div class="figure"><b class="${cls || ""}">${value}</b><span>${label}</span></div>`;
    document.getElementById("fleet-figures").innerHTML = figure(int(t.gateways), "gateways") +
      figure(int(t.online), "online", "state-succeeded") + figure(int(t.degraded), "degraded", "state-warn") +
      figure(int(t.offline), "offline", "state-failed") + figure(int(t.backlog_records), "records in backlogs") +
      figure(`<a href="#/alerts">${int(t.open_alerts)}</a>`, "open alerts", t.open_alerts ? "state-failed" : "");
  }
  const again = () => { state.offset = 0; refresh().catch(app.showError); };
  page.querySelector("#fleet-filter").addEventListener("input", () => { clearTimeout(typing); typing = setTimeout(again, 250); });
  page.querySelector("#fleet-state").addEventListener("change", again);
  page.querySelector("#fleet-prev").addEventListener("click", () => { state.offset = Math.max(0, state.offset - PAGE_SIZE); refresh().catch(app.showError); });
  page.querySelector("#fleet-next").addEventListener("click", () => { state.offset += PAGE_SIZE; refresh().catch(app.showError); });
  return {refresh, stop() { clearTimeout(typing); }};
}

/* The alert list of one gateway (or of the fleet when gateway is null) in `box`, newest first,
 * each with an acknowledge button; returns {refresh()}. */
function alertList(box, gateway) {
  const state = {openOnly: false};
  box.innerHTML = `<div class="toolbar"><label><input type="checkbox" class="alerts-open"> unacknowledged only</label>
    <button type="button" class="alerts-ack-all">acknowledge all shown</button></div><div class="alerts-body"></div>`;
  let shown = [];
  async function ack(ids) {
    try { await api.apiPost("/v1/alerts/ack", {ids}); app.showError(null, "ack"); } catch (err) { app.showError(err, "ack"); }
    await refresh();
  }
  async function refresh() {
    const q = new URLSearchParams({limit: 100});
    if (gateway) q.set("gateway", gateway);
    if (state.openOnly) q.set("open", "1");
    const doc = await api.apiGet(`/v1/alerts?${q}`);
    shown = doc.alerts;
    const body = box.querySelector(".alerts-body");
    if (!shown.length) { charts.noData(body, state.openOnly ? "no unacknowledged alerts" : "no alerts"); return; }
    body.innerHTML = `<div class="scroll"><table class="alerts"><thead><tr><th>when</th>${gateway ? "" : "<th>gateway</th>"}<th>device</th>` +
      `<th>what</th><th></th></tr></thead><tbody>` + shown.map(a => `<tr data-key="${a.id}" class="${a.acked_ts ? "acked" : ""}">` +
      `<td>${pages.ago(a.ts, Date.now() / 1000)}</td>${gateway ? "" : `<td><a href="#/gateways/${encodeURIComponent(a.gateway)}">${pages.esc(a.gateway)}</a></td>`}` +
      `<td><a href="#/devices/${encodeURIComponent(a.gateway)}/${encodeURIComponent(a.device)}">${pages.esc(a.device)}</a></td>` +
      `<td class="wrap">${pages.esc(alertText(a))}</td><td>${a.acked_ts ? "acknowledged" : `<button type="button" data-ack="${a.id}">acknowledge</button>`}</td></tr>`).join("") +
      "</tbody></table></div>";
    body.querySelectorAll("button[data-ack]").forEach(b => b.addEventListener("click", () => ack([Number(b.dataset.ack)])));
  }
  box.querySelector(".alerts-open").addEventListener("change", ev => { state.openOnly = ev.target.checked; refresh().catch(app.showError); });
  box.querySelector(".alerts-ack-all").addEventListener("click", () => {
    const open = shown.filter(a => !a.acked_ts).map(a => a.id);
    if (open.length) ack(open);
  });
  return {refresh};
}

function alertText(a) {
  const b = a.body || {};
  const reasons = Array.isArray(b.reasons) && b.reasons.length ? `: ${b.reasons.join("; ")}` : "";
  const score = typeof b.score === "number" ? ` (score ${charts.fmt(b.score)})` : "";
  return `${a.type}${score}${reasons}`;
}

function alertsPage(page, gateway) {
  page.innerHTML = `<h1>Alerts${gateway ? ` of <a href="#/gateways/${encodeURIComponent(gateway)}">${pages.esc(gateway)}</a>` : ""}</h1><div id="alerts-list"></div>`;
  const list = alertList(page.querySelector("#alerts-list"), gateway || null);
  return {refresh: list.refresh, stop() {}};
}

window.fleet = {fleetPage, alertsPage, alertList, placementSummary, stateHtml, int};
