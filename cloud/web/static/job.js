/* The job page: state, phase, elapsed time and ETA, figures and a progress bar; live charts of
 * loss / accuracy / throughput (log loss, EMA smoothing with the raw series faint, step or
 * wall-clock x axis), the pipeline timeline and bubble fraction, one panel per trainer feature
 * (features.js) and federated rounds. Events come from the job's stream, the phase / ETA /
 * features from GET /v1/jobs/<id> every 2 s (or, from a cloudd that does not send them, from the
 * events). Redraws are throttled to two per second and charts downsample, so a 10,000-step job
 * costs the same to draw as a short one. A job cloudd does not know shows "no job <id>". */
"use strict";

const COLORS = ["#2f6fdf", "#e07b24", "#7a4fd0", "#1b8a4b", "#c0392b", "#5b6b82"];
const VIEW_KEY = "edgefed.chartView";

function newSeries() {
  const perFeature = Object.fromEntries(features.NAMES.map(n => [n, {records: [], decisions: []}]));
  return {loss: [], sps: [], evalAcc: [], evalLoss: [], bubble: [], stages: [], stepTimes: [], rounds: [],
          feature: perFeature, phase: null, t0: null, start: null, state: null, last: null, registered: null, error: null};
}

/* Points keep [step, value, seconds since the job's first timed event]. */
function point(s, step, value, e) {
  return [step, value, Number.isFinite(e.time) ? e.time - s.t0 : null];
}

/* Fold one event into the series (pure apart from `s`). */
function addEvent(s, kind, e) {
  if (s.t0 === null && Number.isFinite(e.time)) s.t0 = e.time;
  if (kind === "start") s.start = e;
  else if (kind === "step") {
    s.last = e;
    s.loss.push(point(s, e.step, e.loss, e));
    if (Number.isFinite(e.time)) s.stepTimes.push([e.step, e.time]);
    if (e.samples_per_s !== undefined) s.sps.push(point(s, e.step, e.samples_per_s, e));
    if (e.stages) {
      let busy = 0, idle = 0;
      e.stages.forEach((st, i) => {
        const total = st.busy_s + st.idle_s;
        (s.stages[i] = s.stages[i] || []).push(total > 0 ? st.busy_s / total : 0);
        busy += st.busy_s; idle += st.idle_s;
      });
      if (busy + idle > 0) s.bubble.push(point(s, e.step, idle / (busy + idle), e));
    }
    for (const name of features.NAMES) {
      if (e[name] && typeof e[name] === "object") {
        s.feature[name].records.push({step: e.step, epoch: e.epoch, t: point(s, e.step, 0, e)[2], values: e[name]});
      }
    }
  } else if (kind === "eval") {
    if (e.accuracy !== undefined && e.accuracy !== null) s.evalAcc.push(point(s, e.step, e.accuracy, e));
    if (e.loss !== undefined) s.evalLoss.push(point(s, e.step, e.loss, e));
  } else if (kind === "phase") s.phase = e.phase;
  else if (kind === "round") s.rounds.push(e);
  else if (kind === "state") s.state = e.state;
  else if (kind === "registered") s.registered = e.model;
  else if (kind === "error") s.error = e.message;
  else {
    const name = features.NAMES.find(n => kind === n || kind === `${n}_decision`);
    if (name) s.feature[name].decisions.push(e);
  }
}

/* A feature's mode: the job's `features` entry; from a trainer that sends none, "on" when its
 * figures came and "off" once the job started without them; undefined before the start (and for
 * the settings without panels, precision / device / wire codec, whenever the job does not say). */
function featureMode(s, summary, name) {
  const declared = (summary && summary.features) || (s.start && s.start.features);
  if (declared && declared[name] !== undefined && declared[name] !== null) return String(declared[name]);
  const own = s.feature[name];
  if (!own) return undefined;  // precision, device, wire codec: only the job's `features` say
  if (own.records.length || own.decisions.length) return "on";
  return s.start || (summary && ["succeeded", "failed", "cancelled"].includes(summary.state)) ? "off" : undefined;
}

/* The phase: cloudd's summary, else the trainer's latest phase event, else guessed from the state. */
function currentPhase(s, summary) {
  if (summary && summary.phase) return summary.phase;
  const state = (summary && summary.state) || s.state;
  if (state && state !== "running") return state;
  if (s.phase) return s.phase;
  return state === "running" ? (s.last ? "training" : "starting") : "-";
}

function elapsedAndEta(s, summary, now) {
  const total = s.start ? s.start.total_steps : null;
  let elapsed = summary && Number.isFinite(summary.elapsed_s) ? summary.elapsed_s : null;
  if (elapsed === null && summary && summary.started_ts) elapsed = (summary.finished_ts || now) - summary.started_ts;
  const done = summary && summary.finished_ts;
  let eta = summary && Number.isFinite(summary.eta_s) ? summary.eta_s : done ? 0 : scales.etaSeconds(s.stepTimes, total, 20);
  return {elapsed, eta};
}

function listPanel(box, rows, columns, empty) {
  if (!rows.length) { charts.noData(box, empty); return; }
  const last = rows.slice(-12).reverse();
  box.innerHTML = `<div class="scroll"><table><thead><tr>${columns.map(c => `<th>${c}</th>`).join("")}</tr></thead><tbody>` +
    last.map(r => "<tr>" + columns.map(c => `<td>${pages.esc(typeof r[c] === "number" ? charts.fmt(r[c]) : r[c])}</td>`).join("") + "</tr>").join("") +
    `</tbody></table></div><div class="legend">${rows.length} in all, newest first</div>`;
}

function loadView() {
  try { return {log: false, smooth: 0.6, x: "step", ...JSON.parse(localStorage.getItem(VIEW_KEY) || "{}")}; }
  catch (err) { return {log: false, smooth: 0.6, x: "step"}; }
}

function jobPage(page, jobId) {
  page.innerHTML = `<p class="nodata">loading job ${pages.esc(jobId)}…</p>`;
  const s = newSeries(), view = loadView();
  let summary = null, stream = null, timer = null, dirty = true, missing = false, stopped = false;

  function layout() {
    page.innerHTML = `<h1>Job <span id="job-id">${pages.esc(jobId)}</span> <span id="job-state"></span>
      <span class="phase" id="job-phase"></span> <button id="job-cancel">Cancel</button></h1>
      <div class="figures" id="job-figures"></div>
      <div class="toolbar" id="chart-controls">
        <label><input type="checkbox" id="ctl-log"> log-scale loss</label>
        <label>smoothing <input type="range" id="ctl-smooth" min="0" max="0.99" step="0.01"> <span id="ctl-smooth-value"></span></label>
        <label>x axis <select id="ctl-x"><option value="step">step</option><option value="time">wall-clock</option></select></label>
      </div>
      <div class="grid">
        <div class="panel"><h2>Loss</h2><div id="chart-loss"></div></div>
        <div class="panel"><h2>Accuracy (held out)</h2><div id="chart-accuracy"></div></div>
        <div class="panel"><h2>Throughput (samples/s)</h2><div id="chart-throughput"></div></div>
        <div class="panel"><h2>Pipeline timeline: busy fraction per stage</h2><div id="chart-timeline"></div></div>
        <div class="panel"><h2>Bubble fraction (idle / all)</h2><div id="chart-bubble"></div></div>
        ${features.NAMES.map(features.panelHtml).join("")}
        <div class="panel"><h2>Federated rounds</h2><div id="panel-rounds"></div></div>
      </div>`;
    const log = page.querySelector("#ctl-log"), smooth = page.querySelector("#ctl-smooth"), xAxis = page.querySelector("#ctl-x");
    log.checked = view.log; smooth.value = String(view.smooth); xAxis.value = view.x;
    const changed = () => {
      Object.assign(view, {log: log.checked, smooth: Number(smooth.value), x: xAxis.value});
      localStorage.setItem(VIEW_KEY, JSON.stringify(view));
      dirty = true; draw();
    };
    [log, smooth, xAxis].forEach(c => c.addEventListener("input", changed));
    page.querySelector("#job-cancel").addEventListener("click", async () => {
      try { await api.apiPost(`/v1/jobs/${encodeURIComponent(jobId)}/cancel`); } catch (err) { app.showError(err, "action"); }
    });
  }

  function figure(value, label, extra) {
    return `<div class="figure"><b>${pages.esc(value)}</b><span>${label}</span>${extra || ""}</div>`;
  }

  /* The scheduler's view: queue position and why, preemptions, attained service (device-s). */
  function scheduleFigures(sc) {
    if (!sc) return "";
    return (sc.queue_position != null ? figure("#" + sc.queue_position, "queue", `<span>${pages.esc(sc.reason || "")}</span>`) : "") +
      figure(String(sc.preemptions), "preemptions") + figure(charts.fmt(sc.attained_service_s), "device-s attained");
  }

  function header() {
    const total = s.start ? s.start.total_steps : null, step = s.last ? s.last.step : 0;
    const pct = total ? Math.min(100, 100 * step / total) : 0;
    const state = (summary && summary.state) || s.state;
    document.getElementById("job-state").innerHTML = state ? `<span class="state-${state}">${pages.esc(state)}</span>` : "";
    document.getElementById("job-phase").textContent = `phase: ${currentPhase(s, summary)}`;
    const {elapsed, eta} = elapsedAndEta(s, summary, Date.now() / 1000);
    const mode = name => featureMode(s, summary, name) || "-";
    document.getElementById("job-figures").innerHTML =
      figure(`${step}${total ? " / " + total : ""}`, "steps", `<div class="bar"><div style="width:${pct.toFixed(1)}%"></div></div>`) +
      figure(scales.fmtDuration(elapsed), "elapsed") + figure(eta === null ? "-" : scales.fmtDuration(eta), "ETA") +
      figure(charts.fmt(s.last && s.last.loss), "loss") +
      figure(s.evalAcc.length ? (100 * s.evalAcc[s.evalAcc.length - 1][1]).toFixed(1) + "%" : "-", "accuracy") +
      figure(charts.fmt(s.last && s.last.samples_per_s), "samples/s") +
      figure(s.bubble.length ? (100 * s.bubble[s.bubble.length - 1][1]).toFixed(0) + "%" : "-", "bubble") +
      figure(s.start ? s.start.plan : "-", `plan (${pages.esc(s.start ? s.start.schedule : "-")})`) +
      figure(mode("precision"), "precision") + figure(mode("device"), "device") +
      figure(mode("compression"), "compression") + figure(mode("wire_codec"), "wire codec") +
      scheduleFigures(summary && summary.schedule) +
      (s.registered ? figure(s.registered.name + "@" + s.registered.version, "registered") : "") +
      (s.error ? `<div class="figure"><b class="state-failed">error</b><span>${pages.esc(s.error)}</span></div>` : "");
  }

  function draw() {
    if (!dirty || missing || stopped) return;
    dirty = false;
    header();
    const time = view.x === "time";
    const xy = points => (time ? points.filter(p => p[2] !== null).map(p => [p[2], p[1]]) : points.map(p => [p[0], p[1]]));
    const xs = xy(s.loss).map(p => p[0]);
    const opts = {xTime: time, smooth: view.smooth, xDomain: xs.length ? [Math.min(0, xs[0]), xs[xs.length - 1]] : undefined};
    charts.lineChart(document.getElementById("chart-loss"), [{name: "train", color: COLORS[0], points: xy(s.loss)},
      {name: "held out", color: COLORS[1], points: xy(s.evalLoss)}], {...opts, log: view.log, empty: "no steps yet"});
    charts.lineChart(document.getElementById("chart-accuracy"), [{name: "accuracy", color: COLORS[3], points: xy(s.evalAcc)}],
      {...opts, smooth: 0, empty: "no evaluation yet"});
    charts.lineChart(document.getElementById("chart-throughput"), [{name: "samples/s", color: COLORS[2], points: xy(s.sps)}],
      {...opts, zero: true, empty: "no steps yet"});
    charts.heatRows(document.getElementById("chart-timeline"), s.stages.map((cells, i) =>
      ({name: `stage ${i}`, cells: charts.bucketMeans(cells, 180)})),
      {empty: "no steps yet", caption: "steps →  (red: idle, green: busy)"});
    charts.lineChart(document.getElementById("chart-bubble"), [{name: "bubble", color: COLORS[4], points: xy(s.bubble)}],
      {...opts, zero: true, empty: "no steps yet"});
    for (const name of features.NAMES) features.draw(name, {...s.feature[name], mode: featureMode(s, summary, name)}, time);
    listPanel(document.getElementById("panel-rounds"), s.rounds, ["round", "clients", "failures", "loss", "accuracy"],
      "off: no federated rounds in this job");
  }

  async function refresh() {
    if (missing || stopped) return;
    try {
      summary = await api.apiGet(`/v1/jobs/${encodeURIComponent(jobId)}`);
    } catch (err) {
      if (err.status !== 404) throw err;
      missing = true;
      page.innerHTML = `<div class="missing" id="job-missing"><h1>No job ${pages.esc(jobId)}</h1>` +
        `<p>cloudd has no job with this id (it answered 404). <a href="#/jobs">All jobs</a></p></div>`;
      return;
    }
    if (!stream) {
      layout();
      stream = api.followEvents(jobId, (kind, e) => { addEvent(s, kind, e); dirty = true; }, () => { dirty = true; });
      timer = setInterval(draw, 500);
      window.addEventListener("resize", redrawAll);
    }
    dirty = true;
  }
  function redrawAll() { dirty = true; draw(); }

  return {refresh, stop() {
    stopped = true;
    if (stream) stream.stop();
    clearInterval(timer);
    window.removeEventListener("resize", redrawAll);
  }};
}

window.jobview = {jobPage, addEvent, newSeries, featureMode, currentPhase};
