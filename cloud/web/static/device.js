/* The device page (#/devices/<gateway>/<device>, GET /v1/devices/...): last message, rate, gaps,
 * faults, and one chart per reading over a chosen window, downsampled by cloudd to about one
 * point per two pixels; "Export CSV" downloads the same window. Each chart's container keeps the
 * points it drew as `plotted` ([[t, mean, min, max, n], ...]) and, for raw windows, `seqs`. */
"use strict";

const WINDOWS = [["1 min", 60], ["5 min", 300], ["1 hour", 3600], ["6 hours", 21600], ["1 day", 86400], ["1 week", 604800]];

function devicePage(page, gatewayId, deviceId) {
  const base = `/v1/devices/${encodeURIComponent(gatewayId)}/${encodeURIComponent(deviceId)}`;
  page.innerHTML = `<h1>Device ${pages.esc(deviceId)} <span class="muted">on <a href="#/gateways/${encodeURIComponent(gatewayId)}">${pages.esc(gatewayId)}</a></span></h1>
    <div class="toolbar"><label>window <select id="dev-window">${WINDOWS.map(([l, s]) => `<option value="${s}"${s === 3600 ? " selected" : ""}>${l}</option>`).join("")}</select></label>
    <button type="button" id="dev-csv">Export CSV</button><span id="dev-resolution" class="muted"></span></div>
    <div class="grid"><div class="panel" id="panel-last"><h2>Last message</h2><div id="dev-last"></div></div>
    <div class="panel" id="panel-rate"><h2>Messages</h2><div id="dev-rate"></div></div>
    <div class="panel" id="panel-gaps"><h2>Gaps (missing seq)</h2><div id="dev-gaps"></div></div></div>
    <div class="grid" id="dev-charts"></div>`;
  const now = () => Date.now() / 1000;
  const span = () => Number(document.getElementById("dev-window").value);
  function query() {
    const end = now(), width = document.getElementById("dev-charts").clientWidth || 800;
    const points = Math.max(60, Math.min(2000, Math.floor(width / 2)));
    return new URLSearchParams({start: (end - span()).toFixed(3), end: end.toFixed(3), points});
  }
  let shown = null;
  const redraw = () => { if (shown) drawCharts(shown); };
  window.addEventListener("resize", redraw);
  async function refresh() {
    const doc = shown = await api.apiGet(`${base}?${query()}`);
    const last = doc.last_message;
    document.getElementById("dev-last").innerHTML = last ? gateway.kv([
      ["received", `${pages.ago(last.ts, now())} (${gateway.when(last.ts)})`], ["seq", last.seq],
      ["status", `<span class="${last.status === "fault" ? "state-failed" : "state-succeeded"}">${last.status}</span>`],
      ...Object.entries(last.readings).map(([k, v]) => [pages.esc(k), v === null ? "null (failed)" : charts.fmt(v)])]) :
      `<div class="nodata">no telemetry stored</div>`;
    const w = doc.window;
    document.getElementById("dev-rate").innerHTML = gateway.kv([
      ["rate (last minute)", `${charts.fmt(doc.rate_per_s)} msg/s`], ["in the window", fleet.int(w.messages)],
      ["faults in the window", `<span class="${w.faults ? "state-failed" : ""}">${fleet.int(w.faults)}</span>`],
      ["fault status", last && last.status === "fault" ? `<span class="state-failed">faulty now</span>` : "ok"],
      ["stored in all", fleet.int(doc.records)]]);
    document.getElementById("dev-gaps").innerHTML = w.gaps ? `<p><b>${fleet.int(w.gaps)}</b> seq numbers missing in the window</p>` +
      `<table class="fixed"><thead><tr><th>minute</th><th>missing</th></tr></thead><tbody>` +
      w.gap_buckets.map(g => `<tr><td>${gateway.when(g.ts)}</td><td class="num">${fleet.int(g.missing)}</td></tr>`).join("") + "</tbody></table>" :
      `<div class="nodata">no gaps: every seq between the first and last in the window arrived</div>`;
    drawCharts(doc);
  }
  function drawCharts(doc) {
    const chart = doc.chart, box = document.getElementById("dev-charts");
    document.getElementById("dev-resolution").textContent = chart.width === 0 ? "every message" :
      `one point per ${scales.fmtDuration(chart.step)} (from ${scales.fmtDuration(chart.width)} rollups)`;
    const names = Object.keys(chart.series).sort();
    if (!names.length) { box.innerHTML = `<div class="panel" id="panel-chart-none"><h2>Readings</h2><div class="nodata">no readings in this window</div></div>`; return; }
    for (const [i, name] of names.entries()) {
      const id = `chart-${name.replace(/[^\w-]/g, "_")}`;
      let node = document.getElementById(id);
      if (!node) {
        box.insertAdjacentHTML("beforeend", `<div class="panel" id="panel-${id}"><h2>${pages.esc(name)}</h2><div id="${id}"></div></div>`);
        node = document.getElementById(id);
      }
      const points = chart.series[name];
      node.plotted = points;
      node.seqs = chart.seq ? chart.seq[name] : null;
      const series = [{name: "mean", color: charts.PALETTE[i % charts.PALETTE.length], points: points.map(p => [p[0] - doc.start, p[1]])}];
      if (chart.width) {
        series.push({name: "min", color: "#aab", points: points.map(p => [p[0] - doc.start, p[2]])},
          {name: "max", color: "#aab", points: points.map(p => [p[0] - doc.start, p[3]])});
      }
      charts.lineChart(node, series, {xTime: true, xDomain: [0, doc.end - doc.start], xLabel: "time in the window", height: 170});
    }
    box.querySelectorAll(".panel").forEach(p => { if (!names.some(n => p.id === `panel-chart-${n.replace(/[^\w-]/g, "_")}`)) p.remove(); });
  }
  async function exportCsv() {
    try {
      const q = query();
      q.set("points", "100000");
      const response = await fetch(`${base}/series.csv?${q}`, {headers: {Authorization: "Bearer " + (localStorage.getItem(api.TOKEN_KEY) || "")}});
      if (!response.ok) throw new api.ApiError("series.csv", response.status, await response.json().catch(() => ({})));
      const link = document.createElement("a");
      link.href = URL.createObjectURL(await response.blob());
      link.download = `${gatewayId}-${deviceId}.csv`;
      link.click();
      URL.revokeObjectURL(link.href);
      app.showError(null, "csv");
    } catch (err) { app.showError(err, "csv"); }
  }
  document.getElementById("dev-window").addEventListener("change", () => refresh().catch(app.showError));
  document.getElementById("dev-csv").addEventListener("click", exportCsv);
  return {refresh, stop() { window.removeEventListener("resize", redraw); }};
}

window.device = {devicePage};
