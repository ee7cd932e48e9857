/* The federated page: the cloud's aggregation rounds (GET /v1/federated/status): versions,
 * updates applied per round and their staleness, bytes received, and each participating gateway. */
"use strict";

const federated = (() => {
  const COLORS = ["#2563eb", "#ea580c", "#16a34a"];

  function page(root) {
    root.innerHTML = `<h1>Federated training</h1><div class="figures" id="fed-figures"></div>
      <div class="grid"><section class="panel"><h2>Updates per round</h2><div id="fed-updates" class="chart"></div></section>
      <section class="panel"><h2>Staleness per round</h2><div id="fed-staleness" class="chart"></div></section></div>
      <h2>Participants</h2><div id="fed-table"></div>`;
    const state = {sort: "applied", desc: true};
    const columns = [{key: "gateway", label: "gateway"}, {key: "applied", label: "updates applied", num: true},
      {key: "payload_bytes", label: "bytes", num: true, html: r => charts.fmt(r.payload_bytes) + "B"},
      {key: "last_staleness", label: "last staleness", num: true},
      {key: "last_applied_version", label: "last version", num: true}];
    let rows = [];
    function draw() {
      const box = document.getElementById("fed-table");
      box.innerHTML = pages.sortableTable(columns, state, rows);
      pages.bindSort(box, state, draw);
    }
    function figures(doc) {
      const fig = (value, label) => `<div class="figure"><b>${pages.esc(value)}</b><span>${label}</span></div>`;
      const u = doc.updates, s = doc.staleness;
      return fig(`${doc.model}@${doc.version}`, `global model (${doc.aggregator})`) + fig(doc.rounds, "rounds") +
        fig(u.applied, "updates applied") + fig(u.duplicates, "duplicates") + fig(u.refused_total, "refused") +
        fig(doc.buffered, "waiting") + fig(charts.fmt(doc.bytes.payload) + "B", "update bytes") +
        fig(s.mean === null ? "-" : s.mean.toFixed(1) + " / " + s.max, "staleness mean / max");
    }
    async function refresh() {
      const doc = await api.apiGet("/v1/federated/status");
      if (doc.job === null) {
        document.getElementById("fed-figures").innerHTML = `<p class="empty">no federated job is running</p>`;
        return;
      }
      document.getElementById("fed-figures").innerHTML = figures(doc);
      const history = doc.history || [];
      charts.lineChart(document.getElementById("fed-updates"), [{name: "updates", color: COLORS[0],
        points: history.map(h => [h.version, h.updates])}], {zero: true, empty: "no rounds yet"});
      charts.lineChart(document.getElementById("fed-staleness"), [
        {name: "mean", color: COLORS[1], points: history.map(h => [h.version, h.staleness_mean])},
        {name: "max", color: COLORS[2], points: history.map(h => [h.version, h.staleness_max])}],
        {zero: true, empty: "no rounds yet"});
      rows = doc.participants;
      draw();
    }
    return {refresh, stop() {}};
  }
  return {page};
})();

window.federated = federated;
