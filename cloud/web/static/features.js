/* The job page's feature panels (compression, sync, balance, toggle), drawn generically from the
 * sub-object each `step` event carries per feature, so the trainer may add or rename keys inside
 * it: numbers become small charts over steps, lists of numbers one line per index (per rank, per
 * replica), strings and string-valued maps a strip of categories over steps, lists of objects a
 * decisions table; the latest values of every key are listed too. A few views add derived series
 * (bytes saved, shares per rank) on top.
 * Invariant: a panel shows "off" exactly when the job's `features` say the feature is off; before
 * the job says which features it has, the panel says it is waiting, never "off". */
"use strict";

const features = (() => {
  const MAX_SMALL_CHARTS = 4;
  const num = v => typeof v === "number" && Number.isFinite(v);
  const isNumberList = v => Array.isArray(v) && v.length > 0 && v.every(num);
  const isObjectList = v => Array.isArray(v) && v.some(d => d && typeof d === "object" && !Array.isArray(d));
  const isStringMap = v => v && typeof v === "object" && !Array.isArray(v) && Object.values(v).every(x => typeof x === "string");
  const sum = values => values.reduce((a, v) => a + v, 0);

  /* Per feature: the title of its panel, the x axis, derived charts and the keys they replace,
   * the numbers charted first (prefer; the others follow in the order they came) and how its long
   * category names read (label). Keys a view does not name are drawn all the same. */
  const VIEWS = {
    compression: {
      title: "Compression", x: "step",
      // "bfp(b=32,m=4,e=8,r=nearest,...)" as "bfp b32 m4 e8": the parts that tell formats apart
      label: t => t.replace(/^bfp\(b=(\d+),m=(\d+),e=(\d+)[^)]*\)$/, "bfp b$1 m$2 e$3"),
      derived: [{title: "bytes saved per log window", zero: true, consumes: ["saved_bytes_fp32", "saved_bytes_stored",
        "wire_bytes_fp32", "wire_bytes_sent", "bytes_saved"], series: [
        {name: "saved activations", value: v => num(v.saved_bytes_fp32) && num(v.saved_bytes_stored) ? v.saved_bytes_fp32 - v.saved_bytes_stored : v.bytes_saved},
        {name: "wire", value: v => num(v.wire_bytes_fp32) && num(v.wire_bytes_sent) ? v.wire_bytes_fp32 - v.wire_bytes_sent : undefined}]}],
    },
    sync: {title: "Sync scheduler", x: "step", derived: [], prefer: ["blocked_s", "decisions", "windows"]},
    balance: {
      title: "Rank balancing", x: "step", prefer: ["predicted_imbalance", "rebalances"],
      derived: [{title: "share of the batch per rank", zero: true, perIndex: v => isNumberList(v.shares) ? v.shares :
        isNumberList(v.sizes) && sum(v.sizes) > 0 ? v.sizes.map(s => s / sum(v.sizes)) : undefined,
        consumes: ["shares", "sizes", "stage"]}],
    },
    toggle: {
      title: "Toggle-rate selection", x: "epoch", prefer: ["mean_toggle_rate"],
      derived: [{title: "items selected and settled", zero: true, consumes: ["selected", "settled", "epoch", "rows"], series: [
        {name: "selected", value: v => v.selected}, {name: "settled", value: v => v.settled},
        {name: "all rows", value: v => v.rows}]}],
    },
  };
  const NAMES = Object.keys(VIEWS);

  function panelHtml(name) {
    return `<div class="panel feature" id="panel-${name}"><h2>${VIEWS[name].title} <span class="mode" id="mode-${name}"></span></h2>` +
      `<div class="feature-body" id="feature-${name}"></div></div>`;
  }

  /* state: {mode: "off"|"on"|<mode text>|undefined, records: [{step, epoch, t, values}],
   * decisions: [{...}]}; xTime: plot against seconds since start instead of steps. */
  function draw(name, state, xTime) {
    const view = VIEWS[name], box = document.getElementById(`feature-${name}`);
    const mode = state.mode, figures = state.records.length + state.decisions.length > 0;
    document.getElementById(`mode-${name}`).textContent = mode === undefined ? "" : mode;
    // A panel with figures takes the whole row (its charts side by side); a message, one cell.
    document.getElementById(`panel-${name}`).classList.toggle("wide", mode !== "off" && figures);
    if (mode === "off") {
      box.innerHTML = `<div class="nodata feature-off">off: ${pages.esc(name)} is not enabled in this job</div>`;
      return;
    }
    if (!figures) {
      charts.noData(box, mode === undefined ? "waiting for the job to say which features it runs" : `on (${mode}): no figures yet`);
      return;
    }
    box.innerHTML = "";
    /* One cell of the panel's grid: a caption and the element that holds its chart or table. */
    const add = (title, cls) => {
      const cell = document.createElement("div");
      cell.className = `cell ${cls || ""}`;
      cell.innerHTML = `<div class="caption">${pages.esc(title)}</div><div class="body"></div>`;
      box.appendChild(cell);
      return cell.querySelector(".body");
    };
    const label = view.label || (v => v);
    const useTime = xTime && view.x === "step";
    const xOf = r => (useTime ? r.t : view.x === "epoch" ? r.epoch : r.step);
    const records = state.records.filter(r => num(xOf(r)));
    const chartOpts = {height: 120, xTime: useTime, xLabel: useTime ? undefined : view.x};
    const consumed = new Set();
    for (const d of view.derived) {
      d.consumes.forEach(k => consumed.add(k));
      const series = d.perIndex ? perIndexSeries(records, xOf, d.perIndex, "rank") :
        d.series.map((s, i) => ({name: s.name, color: charts.PALETTE[i], points: records.map(r => [xOf(r), s.value(r.values)])}));
      if (!series.some(s => s.points.some(p => num(p[1])))) continue;
      charts.lineChart(add(d.title), series, {...chartOpts, zero: d.zero});
    }
    const keys = keysOf(records);
    const rank = k => { const i = (view.prefer || []).indexOf(k); return i < 0 ? Number.MAX_SAFE_INTEGER : i; };
    const numbers = keys.numbers.filter(k => !consumed.has(k)).sort((a, b) => rank(a) - rank(b));
    numbers.slice(0, MAX_SMALL_CHARTS).forEach((k, i) => {
      charts.lineChart(add(k), [{name: k, color: charts.PALETTE[(i + 2) % charts.PALETTE.length],
        points: records.map(r => [xOf(r), r.values[k]])}], chartOpts);
    });
    keys.lists.filter(k => !consumed.has(k)).forEach(k => {
      charts.lineChart(add(`${k} per index`), perIndexSeries(records, xOf, v => v[k], "#"), chartOpts);
    });
    const strips = [];
    const text = v => (v === undefined || v === null ? null : label(String(v)));
    keys.strings.forEach(k => strips.push({name: k, cells: records.map(r => text(r.values[k]))}));
    keys.maps.forEach(k => {
      const inner = [...new Set(records.flatMap(r => Object.keys(r.values[k] || {})))];
      inner.forEach(i => strips.push({name: `${k} ${i}`, cells: records.map(r => text((r.values[k] || {})[i]))}));
    });
    if (strips.length) {
      charts.categoryStrip(add(`${keys.strings.concat(keys.maps).join(", ")} over ${useTime ? "time" : view.x}s`), strips);
    }
    const decisions = state.decisions.concat(keys.objectLists.flatMap(k => records.flatMap(r => r.values[k] || [])));
    if (decisions.length) decisionsTable(add(`decisions (${decisions.length}, newest first)`, "wide"), decisions, label);
    if (records.length) latestTable(add(`latest (step ${records[records.length - 1].step})`), records[records.length - 1], label);
  }

  function perIndexSeries(records, xOf, listOf, label) {
    const width = Math.max(0, ...records.map(r => (listOf(r.values) || []).length));
    return Array.from({length: width}, (_, i) => ({name: `${label} ${i}`, color: charts.PALETTE[i % charts.PALETTE.length],
      points: records.map(r => [xOf(r), (listOf(r.values) || [])[i]])}));
  }

  /* Which keys of the records are numbers, lists of numbers, strings/booleans, string maps or decision lists. */
  function keysOf(records) {
    const out = {numbers: [], lists: [], strings: [], maps: [], objectLists: []};
    const seen = new Set();
    for (const r of records) {
      for (const [k, v] of Object.entries(r.values)) {
        if (seen.has(k)) continue;  // a key is classed by its first value that says what it is
        const kind = num(v) ? "numbers" : isNumberList(v) ? "lists" : typeof v === "string" || typeof v === "boolean" ?
          "strings" : isObjectList(v) ? "objectLists" : isStringMap(v) && Object.keys(v).length ? "maps" : null;
        if (kind === null) continue;  // null, [] or {} so far: the next record may tell
        seen.add(k);
        out[kind].push(k);
      }
    }
    return out;
  }

  function cell(v, label) {
    if (num(v)) return scales.fmt(v);
    if (Array.isArray(v)) return v.length && v.every(num) ? v.map(scales.fmt).join(" · ") : `${v.length} items`;
    if (v && typeof v === "object") return Object.entries(v).map(([k, x]) => `${k}: ${num(x) ? scales.fmt(x) : label(String(x))}`).join(", ");
    return label(String(v));
  }

  function decisionsTable(div, decisions, label) {
    const last = decisions.slice(-8).reverse();
    const columns = [...new Set(last.flatMap(d => Object.keys(d)))].filter(c => !["event", "seq", "time"].includes(c)).slice(0, 6);
    div.innerHTML = `<table class="fixed"><thead><tr>` + columns.map(c => `<th>${pages.esc(c)}</th>`).join("") + "</tr></thead><tbody>" +
      last.map(d => "<tr>" + columns.map(c => `<td>${pages.esc(d[c] === undefined ? "" : cell(d[c], label))}</td>`).join("") + "</tr>").join("") +
      "</tbody></table>";
  }

  function latestTable(div, record, label) {
    div.innerHTML = `<table class="kv"><tbody>` + Object.entries(record.values).map(([k, v]) =>
      `<tr><th>${pages.esc(k)}</th><td>${pages.esc(cell(v, label))}</td></tr>`).join("") + "</tbody></table>";
  }

  return {NAMES, VIEWS, panelHtml, draw, keysOf};
})();

window.features = features;
