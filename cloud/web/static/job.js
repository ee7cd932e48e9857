/* The job page: figures and a progress bar, live charts of loss / accuracy / throughput, the
 * pipeline timeline (per-stage busy fraction over steps, bubble fraction), compression, sync
 * decisions and federated rounds, all from the job's event stream. Redraws are throttled to two
 * per second, and charts downsample, so a 10,000-step job costs the same to draw as a short one. */
"use strict";

const COLORS = ["#2f6fdf", "#e07b24", "#7a4fd0", "#1b8a4b", "#c0392b", "#5b6b82"];

function newSeries() {
  return {loss: [], sps: [], evalAcc: [], evalLoss: [], bubble: [], stages: [], compSaved: [], formats: [],
          sync: [], rounds: [], start: null, state: null, last: null, registered: null, error: null};
}

/* Fold one event into the series (pure apart from `s`). */
function addEvent(s, kind, e) {
  if (kind === "start") s.start = e;
  else if (kind === "step") {
    s.last = e;
    s.loss.push([e.step, e.loss]);
    if (e.samples_per_s !== undefined) s.sps.push([e.step, e.samples_per_s]);
    if (e.stages) {
      let busy = 0, idle = 0;
      e.stages.forEach((st, i) => {
        const total = st.busy_s + st.idle_s;
        (s.stages[i] = s.stages[i] || []).push(total > 0 ? st.busy_s / total : 0);
        busy += st.busy_s; idle += st.idle_s;
      });
      if (busy + idle > 0) s.bubble.push([e.step, idle / (busy + idle)]);
    }
    if (e.compression) addCompression(s, e.step, e.compression);
    if (e.sync) s.sync.push({step: e.step, ...e.sync});
  } else if (kind === "eval") {
    if (e.accuracy !== undefined) s.evalAcc.push([e.step, e.accuracy]);
    if (e.loss !== undefined) s.evalLoss.push([e.step, e.loss]);
  } else if (kind === "compression") addCompression(s, e.step, e);
  else if (kind === "sync") s.sync.push(e);
  else if (kind === "round") s.rounds.push(e);
  else if (kind === "state") s.state = e.state;
  else if (kind === "registered") s.registered = e.model;
  else if (kind === "error") s.error = e.message;
}

function addCompression(s, step, c) {
  if (c.bytes_saved !== undefined) s.compSaved.push([step, c.bytes_saved]);
  if (c.format) s.formats.push([step, c.format]);
}

function listPanel(box, rows, columns, empty) {
  if (!rows.length) { charts.noData(box, empty); return; }
  const last = rows.slice(-12).reverse();
  box.innerHTML = `<table><thead><tr>${columns.map(c => `<th>${c}</th>`).join("")}</tr></thead><tbody>` +
    last.map(r => "<tr>" + columns.map(c => `<td>${pages.esc(typeof r[c] === "number" ? charts.fmt(r[c]) : r[c])}</td>`).join("") + "</tr>").join("") +
    `</tbody></table><div class="legend">${rows.length} in all, newest first</div>`;
}

function formatStrip(box, formats) {
  if (!formats.length) return;
  const names = [...new Set(formats.map(f => f[1]))];
  const counts = names.map(n => `${n}: ${formats.filter(f => f[1] === n).length}`);
  const div = document.createElement("div");
  div.className = "legend";
  div.textContent = `formats chosen (steps): ${counts.join(", ")}; now ${formats[formats.length - 1][1]}`;
  box.appendChild(div);
}

function jobPage(page, jobId) {
  page.innerHTML = `<h1>Job <span id="job-id">${pages.esc(jobId)}</span> <span id="job-state"></span>
    <button id="job-cancel">Cancel</button></h1>
    <div class="figures" id="job-figures"></div>
    <div class="grid">
      <div class="panel"><h2>Loss</h2><div id="chart-loss"></div></div>
      <div class="panel"><h2>Accuracy (held out)</h2><div id="chart-accuracy"></div></div>
      <div class="panel"><h2>Throughput (samples/s)</h2><div id="chart-throughput"></div></div>
      <div class="panel"><h2>Pipeline timeline: busy fraction per stage</h2><div id="chart-timeline"></div></div>
      <div class="panel"><h2>Bubble fraction (idle / all)</h2><div id="chart-bubble"></div></div>
      <div class="panel"><h2>Compression: bytes saved</h2><div id="chart-compression"></div></div>
      <div class="panel"><h2>Sync decisions</h2><div id="panel-sync"></div></div>
      <div class="panel"><h2>Federated rounds</h2><div id="panel-rounds"></div></div>
    </div>`;
  const s = newSeries();
  let dirty = true, timer = null;
  function draw() {
    if (!dirty) return;
    dirty = false;
    const total = s.start ? s.start.total_steps : null, step = s.last ? s.last.step : 0;
    const pct = total ? Math.min(100, 100 * step / total) : 0;
    document.getElementById("job-state").innerHTML = s.state ? `<span class="state-${s.state}">${s.state}</span>` : "";
    document.getElementById("job-figures").innerHTML =
      `<div class="figure"><b>${step}${total ? " / " + total : ""}</b><span>steps</span>
        <div class="bar"><div style="width:${pct.toFixed(1)}%"></div></div></div>` +
      `<div class="figure"><b>${charts.fmt(s.last && s.last.loss)}</b><span>loss</span></div>` +
      `<div class="figure"><b>${s.evalAcc.length ? (100 * s.evalAcc[s.evalAcc.length - 1][1]).toFixed(1) + "%" : "-"}</b><span>accuracy</span></div>` +
      `<div class="figure"><b>${charts.fmt(s.last && s.last.samples_per_s)}</b><span>samples/s</span></div>` +
      `<div class="figure"><b>${s.bubble.length ? (100 * s.bubble[s.bubble.length - 1][1]).toFixed(0) + "%" : "-"}</b><span>bubble</span></div>` +
      `<div class="figure"><b>${s.start ? pages.esc(s.start.plan) : "-"}</b><span>plan (${s.start ? pages.esc(s.start.schedule) : "-"})</span></div>` +
      (s.registered ? `<div class="figure"><b>${pages.esc(s.registered.name + "@" + s.registered.version)}</b><span>registered</span></div>` : "") +
      (s.error ? `<div class="figure"><b class="state-failed">error</b><span>${pages.esc(s.error)}</span></div>` : "");
    charts.lineChart(document.getElementById("chart-loss"), [{name: "train", color: COLORS[0], points: s.loss},
      {name: "held out", color: COLORS[1], points: s.evalLoss}], {empty: "no steps yet"});
    charts.lineChart(document.getElementById("chart-accuracy"), [{name: "accuracy", color: COLORS[3], points: s.evalAcc}],
      {empty: "no evaluation in this job"});
    charts.lineChart(document.getElementById("chart-throughput"), [{name: "samples/s", color: COLORS[2], points: s.sps}],
      {zero: true, empty: "no steps yet"});
    charts.heatRows(document.getElementById("chart-timeline"), s.stages.map((cells, i) =>
      ({name: `stage ${i}`, cells: charts.bucketMeans(cells, 180)})),
      {empty: "no steps yet", caption: "steps →  (red: idle, green: busy)"});
    charts.lineChart(document.getElementById("chart-bubble"), [{name: "bubble", color: COLORS[4], points: s.bubble}],
      {zero: true, empty: "no steps yet"});
    const comp = document.getElementById("chart-compression");
    charts.lineChart(comp, [{name: "bytes saved", color: COLORS[1], points: s.compSaved}],
      {zero: true, empty: "no compression in this job"});
    formatStrip(comp, s.formats);
    listPanel(document.getElementById("panel-sync"), s.sync, ["step", "decision", "reason"], "no sync decisions in this job");
    listPanel(document.getElementById("panel-rounds"), s.rounds, ["round", "clients", "failures", "loss", "accuracy"],
      "no federated rounds in this job");
  }
  page.querySelector("#job-cancel").addEventListener("click", async () => {
    try { await api.apiPost(`/v1/jobs/${jobId}/cancel`); } catch (err) { app.showError(err); }
  });
  draw();
  const stream = api.followEvents(jobId, (kind, e) => { addEvent(s, kind, e); dirty = true; }, () => { dirty = true; });
  timer = setInterval(draw, 500);
  return {refresh: async () => {}, stop() { stream.stop(); clearInterval(timer); }};
}

window.jobview = {jobPage, addEvent, newSeries};
