/* The jobs page's submit form: every JobSpec field a user may set (docs/training.md, "Job spec"),
 * sent as the JSON spec to POST /v1/jobs. The nproc limit shown is the one cloudd enforces
 * (GET /v1/jobs "limits", or the number in cloudd's refusal from a cloudd that does not list it).
 * Invariant: a field left at its default is not sent, so the spec holds exactly what the user
 * chose and cloudd's defaults apply to the rest. */
"use strict";

const submitForm = (() => {
  const COMPRESSION = {
    off: null,
    bfp: {activations: "bfp"},
    adaptive: {activations: "adaptive"},
    gist: {gist: true},
    "adaptive+gist": {activations: "adaptive", gist: true},
  };

  const HTML = `<form class="submit" id="job-form">
    <label>model <input id="job-model" list="job-models" value="digits_cnn" size="18"
      title="a built-in model or a factory package.module:function"></label>
    <datalist id="job-models"><option>digits_cnn</option><option>anomaly_autoencoder</option><option>scene_cnn</option></datalist>
    <label>dataset <input id="job-dataset" list="job-datasets" placeholder="the model's own" size="14"
      title="a built-in dataset or upload:NAME (cloudctl datasets upload NAME FILE)"></label>
    <datalist id="job-datasets"><option>digits</option><option>sensor_windows</option><option>camera_frames</option><option>upload:</option></datalist>
    <label>nproc <input id="job-nproc" type="number" value="2" min="1" size="3"></label><span id="job-nproc-limit" class="muted"></span>
    <label>epochs <input id="job-epochs" type="number" value="1" min="1" size="3"></label>
    <label>schedule <select id="job-schedule"><option>1f1b-flush</option><option>gpipe</option><option>1f1b-stash</option></select></label>
    <button type="submit">Train</button><span id="job-submitted"></span>
    <details id="job-options"><summary>trainer options</summary><div class="options">
      <label><input type="checkbox" id="job-vertical-sync"> vertical sync</label>
      <label>stages <input id="job-stages" placeholder="auto" size="4" title="auto or a number"></label>
      <label>replicas <input id="job-replicas" placeholder="auto" size="8" title="auto or one count per stage: 1,2"></label>
      <label>compression <select id="job-compression">${Object.keys(COMPRESSION).map(k => `<option>${k}</option>`).join("")}</select></label>
      <label>wire codec <select id="job-wire-codec"><option>fp32</option><option>bfp8</option><option>bfp6</option><option>bfp4</option></select></label>
      <label><input type="checkbox" id="job-sync"> sync scheduler</label>
      <label><input type="checkbox" id="job-balance"> rank balancing</label>
      <label>toggle fraction <input id="job-toggle" type="number" min="0.01" max="1" step="0.05" placeholder="off" size="4"></label>
      <label>precision <select id="job-precision"><option>fp32</option><option>bf16</option></select></label>
      <label>device <select id="job-device"><option>auto</option><option>cpu</option><option>cuda</option></select></label>
    </div></details></form>`;

  /* Form values (strings and booleans, as read) -> the JSON spec; throws naming the field. */
  function specFrom(v) {
    const spec = {model: v.model.trim() || "digits_cnn", nproc: Number(v.nproc), epochs: Number(v.epochs), schedule: v.schedule};
    if (v.dataset.trim()) spec.dataset = v.dataset.trim();
    if (v.vertical_sync) spec.vertical_sync = true;
    const stages = v.stages.trim();
    if (stages && stages !== "auto") {
      if (!/^\d+$/.test(stages)) throw new Error("stages: auto or a whole number");
      spec.stages = Number(stages);
    }
    const replicas = v.replicas.trim();
    if (replicas && replicas !== "auto") {
      const counts = replicas.split(",").map(r => r.trim());
      if (!counts.every(r => /^\d+$/.test(r))) throw new Error("replicas: auto or counts per stage, e.g. 1,2");
      spec.replicas = counts.map(Number);
    }
    if (!(v.compression in COMPRESSION)) throw new Error(`compression: one of ${Object.keys(COMPRESSION).join(", ")}`);
    if (COMPRESSION[v.compression]) spec.compression = {...COMPRESSION[v.compression]};
    if (v.wire_codec !== "fp32") spec.wire_codec = v.wire_codec;
    if (v.sync) spec.sync = {enabled: true};
    if (v.balance) spec.balance = {enabled: true};
    if (String(v.toggle).trim()) {
      const fraction = Number(v.toggle);
      if (!(fraction > 0 && fraction <= 1)) throw new Error("toggle fraction: a number in (0, 1], or empty for off");
      spec.toggle = {enabled: true, fraction};
    }
    if (v.precision !== "fp32") spec.precision = v.precision;
    if (v.device !== "auto") spec.device = v.device;
    return spec;
  }

  function read(root) {
    const val = id => root.querySelector(`#job-${id}`).value, on = id => root.querySelector(`#job-${id}`).checked;
    return {model: val("model"), dataset: val("dataset"), nproc: val("nproc"), epochs: val("epochs"), schedule: val("schedule"),
      vertical_sync: on("vertical-sync"), stages: val("stages"), replicas: val("replicas"), compression: val("compression"),
      wire_codec: val("wire-codec"), sync: on("sync"), balance: on("balance"), toggle: val("toggle"),
      precision: val("precision"), device: val("device")};
  }

  function showLimit(root, limit) {
    root.querySelector("#job-nproc").max = String(limit);
    root.querySelector("#job-nproc-limit").textContent = `(max ${limit})`;
  }

  /* cloudd's own limit, from GET /v1/jobs ("limits": max_nproc), which the jobs page reads anyway;
   * true once shown. */
  function showLimits(root, jobsDoc) {
    const limit = jobsDoc.limits && jobsDoc.limits.max_nproc;
    if (!Number.isFinite(limit)) return false;
    showLimit(root, limit);
    return true;
  }

  function attach(root) {
    const form = root.querySelector("#job-form");
    form.addEventListener("submit", async ev => {
      ev.preventDefault();
      try {
        const job = await api.apiPost("/v1/jobs", specFrom(read(root)));
        app.showError(null, "action");
        root.querySelector("#job-submitted").innerHTML = ` submitted <a href="#/job/${encodeURIComponent(job.id)}">${pages.esc(job.id)}</a>`;
      } catch (err) {
        const limit = /nproc: \d+ > this cloudd's limit (\d+)/.exec(err.detail || "");
        if (limit) showLimit(root, Number(limit[1]));
        app.showError(err, "action");
      }
    });
  }

  return {HTML, specFrom, attach, showLimits};
})();

window.submitForm = submitForm;
