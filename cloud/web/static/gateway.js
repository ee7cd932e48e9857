/* The gateway page (#/gateways/<id>, GET /v1/gateways/<id>): state, services, models, placement
 * and its recent changes, link and backlog over time, uplink counters, devices and alerts. Every
 * panel shows something: a chart, a table, or a line saying why there is nothing yet. */
"use strict";

function kv(pairs) {
  return `<table class="kv">${pairs.map(([k, v]) => `<tr><th>${k}</th><td>${v}</td></tr>`).join("")}</table>`;
}

function when(ts) {
  return ts ? new Date(ts * 1000).toISOString().slice(0, 19).replace("T", " ") + "Z" : "never";
}

const GATEWAY_PANELS = [
  ["status", "Status"], ["services", "Services"], ["models", "Models"], ["rtt", "Link RTT"],
  ["goodput", "Link goodput"], ["up", "Link up-fraction"], ["backlog", "Backlog"], ["disk", "Log disk"],
  ["rejected", "Rejected messages"], ["uplink", "Uplink"], ["devices", "Devices"], ["placement", "Placement"],
  ["decisions", "Recent placement changes"], ["alerts", "Alerts"],
];
const WIDE_PANELS = new Set(["placement", "decisions", "alerts"]);
const SHOWN_CHANGES = 12;

function gatewayPage(page, id) {
  page.innerHTML = `<h1>Gateway ${pages.esc(id)} <span id="gw-state"></span></h1><div class="grid">` +
    GATEWAY_PANELS.map(([key, title]) => `<div class="panel${WIDE_PANELS.has(key) ? " wide" : ""}" id="panel-${key}">` +
      `<h2>${title}</h2><div class="body" id="gw-${key}"></div></div>`).join("") + "</div>";
  const alerts = fleet.alertList(page.querySelector("#gw-alerts"), id);
  const body = key => document.getElementById(`gw-${key}`);
  function history(doc, pick, opts) {
    const points = doc.history.filter(h => pick(h) !== null && pick(h) !== undefined);
    const t0 = doc.history.length ? doc.history[0].ts : 0;
    charts.lineChart(body(opts.key), [{name: opts.name, color: opts.color, points: points.map(h => [h.ts - t0, pick(h)])}],
      {xTime: true, xLabel: "since the first heartbeat shown", zero: true, height: 150,
       empty: doc.history.length ? "the heartbeats carry no link estimate" : "no heartbeat since cloudd started"});
  }
  let last = null;
  function drawCharts(doc) {
    history(doc, h => h.rtt_ms, {key: "rtt", name: "RTT ms", color: charts.PALETTE[0]});
    history(doc, h => h.bandwidth_bps, {key: "goodput", name: "goodput bit/s", color: charts.PALETTE[1]});
    history(doc, h => (h.availability !== null ? h.availability : h.up === null ? null : Number(h.up)), {key: "up", name: "up fraction", color: charts.PALETTE[3]});
    history(doc, h => h.backlog_records, {key: "backlog", name: "records", color: charts.PALETTE[2]});
    const c = doc.counters;
    const budget = c && c.log_budget_bytes ? `<div class="bar" title="log disk use of its budget"><div style="width:${
      Math.min(100, 100 * c.log_bytes / c.log_budget_bytes).toFixed(1)}%"></div></div>` +
      `<p>${charts.fmt(c.log_bytes)}B of ${charts.fmt(c.log_budget_bytes)}B (${(100 * c.log_bytes / c.log_budget_bytes).toFixed(1)}%)</p>` :
      `<p>${c ? charts.fmt(c.log_bytes) + "B, no budget set" : ""}</p>`;
    body("disk").innerHTML = c ? budget + '<div id="gw-disk-chart"></div>' :
      `<div class="nodata">${doc.heartbeat ? "this gateway's heartbeat reports no log figures" : "no heartbeat since cloudd started"}</div>`;
    if (c) history(doc, h => h.log_bytes, {key: "disk-chart", name: "log bytes", color: charts.PALETTE[5]});
  }
  const redraw = () => { if (last) drawCharts(last); };
  window.addEventListener("resize", redraw);
  async function refresh() {
    const doc = last = await api.apiGet(`/v1/gateways/${encodeURIComponent(id)}`);
    const beat = doc.heartbeat;
    document.getElementById("gw-state").innerHTML = fleet.stateHtml(doc.state);
    body("status").innerHTML = kv([
      ["state", fleet.stateHtml(doc.state)], ["last heartbeat", `${pages.ago(doc.last_heartbeat, Date.now() / 1000)} (${when(doc.last_heartbeat)})`],
      ["interval", doc.interval_s ? `${doc.interval_s} s` : "-"], ["software", pages.esc(doc.software)],
      ["backlog", `${fleet.int(doc.backlog_records)} records, ${charts.fmt(doc.backlog_bytes)}B`],
      ["link", pages.esc(pages.linkText(doc.link))]]);
    body("services").innerHTML = doc.services.length ? `<table class="fixed"><thead><tr><th>service</th><th>state</th><th>last error</th></tr></thead><tbody>` +
      doc.services.map(s => `<tr><td>${pages.esc(s.service)}</td><td class="svc-${s.state}">${s.state}</td><td>${pages.esc(s.detail || "-")}</td></tr>`).join("") +
      "</tbody></table>" : `<div class="nodata">${beat ? "the heartbeat lists no services" : "no heartbeat since cloudd started"}</div>`;
    const models = doc.models;
    const figure = v => (v === null || v === undefined) ? "–" : charts.fmt(v);
    body("models").innerHTML = models && models.length ? `<table class="fixed"><thead><tr><th>model</th><th>version</th><th>stage</th><th>frames</th><th>confidence</th><th>shadow agreement</th></tr></thead><tbody>` +
      models.map(m => `<tr><td>${pages.esc(m.name)}</td><td>${pages.esc(m.version)}</td><td>${pages.esc(m.stage || "")}</td>` +
        `<td>${figure(m.frames)}</td><td>${figure(m.confidence_mean)}</td><td>${figure(m.shadow_agreement)}</td></tr>`).join("") + "</tbody></table>" :
      `<div class="nodata">${beat ? "this gateway's heartbeat reports no models" : "no heartbeat since cloudd started"}</div>`;
    body("placement").innerHTML = doc.placement.length ? `<p>${fleet.placementSummary(doc)}</p><table class="fixed placement"><thead><tr><th>service</th><th>task</th><th>where</th><th>why</th></tr></thead><tbody>` +
      doc.placement.map(p => `<tr><td>${pages.esc(p.service)}</td><td>${pages.esc(p.task)}</td><td>${p.where}</td><td>${pages.esc(p.reason || "-")}</td></tr>`).join("") +
      "</tbody></table>" : `<div class="nodata">no placement reported</div>`;
    body("decisions").innerHTML = doc.placement_changes.length ? `<table class="fixed placement"><thead><tr><th>when</th><th>task</th><th>to</th><th>why</th></tr></thead><tbody>` +
      doc.placement_changes.slice(0, SHOWN_CHANGES).map(c => `<tr><td>${pages.ago(c.ts, Date.now() / 1000)}</td><td>${pages.esc(c.service + "." + c.task)}</td><td>${c.where}</td><td>${pages.esc(c.reason || "-")}</td></tr>`).join("") +
      "</tbody></table>" : `<div class="nodata">no placement decisions seen yet</div>`;
    drawCharts(doc);
    const u = doc.uplink, c = doc.counters;
    const reasons = c ? Object.entries(c.rejected).sort((a, b) => b[1] - a[1]) : [];
    body("rejected").innerHTML = reasons.length ? `<table class="fixed"><thead><tr><th>reason</th><th class="num">messages</th></tr></thead><tbody>` +
      reasons.map(([r, n]) => `<tr><td>${pages.esc(r)}</td><td class="num">${fleet.int(n)}</td></tr>`).join("") + "</tbody></table>" :
      `<div class="nodata">${c ? "none refused since the gateway started" : doc.heartbeat ? "this gateway's heartbeat reports no refusals" : "no heartbeat since cloudd started"}</div>`;
    const sent = c ? Object.entries(c.uplink).filter(([, v]) => v).map(([k, v]) => [pages.esc(k.replace(/_/g, " ")), fleet.int(v)]) : [];
    body("uplink").innerHTML = "<h3>stored in the cloud</h3>" + kv([["records", fleet.int(u.records)], ["batches", fleet.int(u.batches)],
      ["duplicates (resent, stored once)", fleet.int(u.duplicates)], ["last upload", `${pages.ago(u.last_upload, Date.now() / 1000)}`]]) +
      (sent.length ? "<h3>the gateway's counters</h3>" + kv(sent) : "");
    body("devices").innerHTML = doc.devices.length ? pages.sortableTable([
      {key: "device", label: "device", html: r => `<a href="#/devices/${encodeURIComponent(id)}/${encodeURIComponent(r.device)}">${pages.esc(r.device)}</a>`},
      {key: "records", label: "records", num: true, html: r => fleet.int(r.records)},
      {key: "last_ts", label: "last message", html: r => pages.ago(r.last_ts, Date.now() / 1000)}], {sort: "device"}, doc.devices) :
      `<div class="nodata">no device data stored from this gateway</div>`;
    await alerts.refresh();
  }
  return {refresh, stop() { window.removeEventListener("resize", redraw); }};
}

window.gateway = {gatewayPage, kv, when};
