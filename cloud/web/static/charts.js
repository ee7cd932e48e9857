/* Charts drawn as SVG by hand: a line chart (nice ticks, optional log y, EMA smoothing with the raw
 * series faint behind, a step or wall-clock x axis), a busy/idle heat timeline and a strip of
 * categories. Invariant: a chart is as wide as its container (never wider, so a 420 px screen does
 * not scroll sideways) and sets data-points on its svg (how many points it plotted). */
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";
const CHAR_PX = 6;  // about one character of the 10 px tick font: labels are spaced by it
const PALETTE = ["#2f6fdf", "#e07b24", "#7a4fd0", "#1b8a4b", "#c0392b", "#5b6b82", "#0e9aa7", "#b5179e"];

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function noData(container, text) {
  container.innerHTML = "";
  const div = document.createElement("div");
  div.className = "nodata";
  div.textContent = text || "no data";
  container.appendChild(div);
}

/* The container's inner width (the chart fills it), or opts.width when it is not laid out yet. */
function widthOf(container, opts) {
  const w = container.clientWidth;
  return Math.max(160, Math.floor(w > 0 ? w : opts.width || 420));
}

/* Keep ticks whose labels do not overlap the previous kept one (x axis, labels centred). */
function spacedTicks(ticks, position, label) {
  const kept = [];
  let right = -Infinity;
  for (const t of ticks) {
    const half = label(t).length * CHAR_PX / 2;
    if (position(t) - half >= right + 6) { kept.push(t); right = position(t) + half; }
  }
  return kept;
}

function yScale(values, opts, height) {
  let lo = Math.min(...values), hi = Math.max(...values);
  const count = Math.max(2, Math.floor(height / 30));
  if (opts.log) {
    const ticks = scales.logTicks(lo, hi === lo ? lo * 10 : hi);
    lo = Math.min(lo, ticks[0]); hi = Math.max(hi, ticks[ticks.length - 1], lo * 1.0001);
    return {lo, hi, ticks, map: v => (Math.log10(v) - Math.log10(lo)) / (Math.log10(hi) - Math.log10(lo))};
  }
  if (opts.zero) lo = Math.min(0, lo);
  if (hi === lo) { hi = lo + (Math.abs(lo) || 1); }
  const step = scales.niceStep(hi - lo, count);
  lo = Math.floor(lo / step + 1e-9) * step; hi = Math.ceil(hi / step - 1e-9) * step;
  return {lo, hi, ticks: scales.niceTicks(lo, hi, count), map: v => (v - lo) / (hi - lo)};
}

/* series: [{name, color, points: [[x, y], ...]}]; opts: {empty, zero, log, smooth (0..0.99),
 * xTime (x in seconds: duration labels), xLabel, xDomain ([lo, hi] the x axis covers at least:
 * charts of one job share it), height}. */
function lineChart(container, series, opts) {
  opts = opts || {};
  const keep = opts.log ? p => Number.isFinite(p[1]) && p[1] > 0 : p => Number.isFinite(p[1]);
  const shown = series.map(s => ({...s, points: s.points.filter(keep)})).filter(s => s.points.length);
  if (!shown.length) { noData(container, opts.empty); return; }
  const width = widthOf(container, opts), height = opts.height || 170;
  const plotH = height - 8 - 30;
  const smoothed = shown.map(s => ({...s, smooth: scales.ema(s.points, opts.smooth || 0)}));
  const ys = [];
  for (const s of smoothed) for (const [, y] of s.points) ys.push(y);
  const ya = yScale(ys, opts, plotH);
  const pad = {l: 8 + CHAR_PX * Math.max(...ya.ticks.map(t => scales.fmt(t).length)), r: 12, t: 8, b: 30};
  const plotW = width - pad.l - pad.r, buckets = Math.max(10, Math.floor(plotW / 2));
  let [x0, x1] = opts.xDomain || [Infinity, -Infinity];
  for (const s of smoothed) for (const [x] of s.points) { x0 = Math.min(x0, x); x1 = Math.max(x1, x); }
  if (x1 === x0) { x0 = Math.min(0, x0); x1 = x0 === x1 ? x1 + 1 : x1; }
  const sx = x => pad.l + (x - x0) / (x1 - x0) * plotW;
  const sy = y => pad.t + (1 - ya.map(y)) * plotH;
  container.innerHTML = "";
  const svg = el("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart"}, container);
  svg.dataset.yscale = opts.log ? "log" : "linear";
  for (const t of ya.ticks) {
    const y = sy(t).toFixed(1);
    el("line", {x1: pad.l, y1: y, x2: width - pad.r, y2: y, stroke: "#eef0f4"}, svg);
    el("text", {x: pad.l - 4, y: Number(y) + 3, "text-anchor": "end"}, svg).textContent = scales.fmt(t);
  }
  el("line", {x1: pad.l, y1: height - pad.b, x2: width - pad.r, y2: height - pad.b, stroke: "#ccd"}, svg);
  const xLabel = opts.xTime ? scales.fmtDuration : scales.fmt;
  const xCount = Math.max(2, Math.floor(plotW / 70));
  const xRaw = opts.xTime ? scales.timeTicks(x0, x1, xCount) : scales.niceTicks(x0, x1, xCount);
  for (const t of spacedTicks(xRaw.filter(t => t >= x0 && t <= x1), sx, xLabel)) {
    const x = sx(t);
    el("line", {x1: x, y1: height - pad.b, x2: x, y2: height - pad.b + 3, stroke: "#99a"}, svg);
    const anchor = x - pad.l < 12 ? "start" : width - pad.r - x < 12 ? "end" : "middle";
    el("text", {x, y: height - pad.b + 13, "text-anchor": anchor}, svg).textContent = xLabel(t);
  }
  el("text", {x: width - pad.r, y: height - 2, "text-anchor": "end", class: "axis-label"}, svg).textContent =
    opts.xLabel || (opts.xTime ? "wall-clock (since start)" : "step");
  const path = points => scales.downsampleMinMax(points, buckets).map(([x, y], i) =>
    `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
  let count = 0;
  for (const s of smoothed) {
    if (opts.smooth > 0) el("path", {d: path(s.points), fill: "none", stroke: s.color, "stroke-width": 1, opacity: 0.25, class: "raw"}, svg);
    const drawn = scales.downsampleMinMax(s.smooth, buckets);
    el("path", {d: path(s.smooth), fill: "none", stroke: s.color, "stroke-width": 1.5}, svg);
    if (drawn.length === 1) el("circle", {cx: sx(drawn[0][0]), cy: sy(drawn[0][1]), r: 2.5, fill: s.color}, svg);
    count += drawn.length;
  }
  svg.dataset.points = String(count);
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.innerHTML = smoothed.map(s => `<span><i style="background:${s.color}"></i>${pages.esc(s.name)} ` +
    `${scales.fmt(s.points[s.points.length - 1][1])}</span>`).join("");
  container.appendChild(legend);
}

/* rows: [{name, cells: [fraction 0..1 or null]}] drawn as a heat strip per row (a timeline). */
function heatRows(container, rows, opts) {
  opts = opts || {};
  if (!rows.length || !rows[0].cells.length) { noData(container, opts.empty); return; }
  const width = widthOf(container, opts), rowH = 14, left = 54;
  const height = rows.length * (rowH + 4) + 14;
  container.innerHTML = "";
  const svg = el("svg", {width, height, viewBox: `0 0 ${width} ${height}`}, container);
  const n = rows[0].cells.length, w = (width - left) / n;
  rows.forEach((row, r) => {
    const y = r * (rowH + 4);
    el("text", {x: 0, y: y + 11}, svg).textContent = row.name;
    row.cells.forEach((f, i) => {
      if (f === null) return;
      el("rect", {x: (left + i * w).toFixed(1), y, width: Math.max(1, w).toFixed(1), height: rowH,
        fill: `hsl(${Math.round(10 + 120 * f)}, 65%, ${Math.round(88 - 40 * f)}%)`}, svg);
    });
  });
  el("text", {x: left, y: height - 2}, svg).textContent = opts.caption || "";
  svg.dataset.points = String(n * rows.length);
}

/* rows: [{name, cells: [category string or null]}]: one colour per category, with a legend (e.g.
 * the BFP format each layer used, step by step; the sync policy over steps). */
function categoryStrip(container, rows, opts) {
  opts = opts || {};
  if (!rows.length || !rows.some(r => r.cells.length)) { noData(container, opts.empty); return; }
  const width = widthOf(container, opts), rowH = 10, left = Math.min(90, 8 + CHAR_PX * Math.max(...rows.map(r => r.name.length)));
  const names = [...new Set(rows.flatMap(r => r.cells).filter(c => c !== null))];
  const colour = c => PALETTE[names.indexOf(c) % PALETTE.length];
  const height = rows.length * (rowH + 3) + 2;
  container.innerHTML = "";
  const svg = el("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "strip"}, container);
  let count = 0;
  rows.forEach((row, r) => {
    const y = r * (rowH + 3), n = row.cells.length, w = (width - left) / Math.max(1, n);
    el("text", {x: 0, y: y + 9}, svg).textContent = row.name.length > 14 ? row.name.slice(0, 13) + "…" : row.name;
    row.cells.forEach((c, i) => {
      if (c === null) return;
      el("rect", {x: (left + i * w).toFixed(1), y, width: Math.max(1, w).toFixed(1), height: rowH, fill: colour(c)}, svg);
      count += 1;
    });
  });
  svg.dataset.points = String(count);
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.innerHTML = names.map(c => `<span><i style="background:${colour(c)}"></i>${pages.esc(c)}</span>`).join("");
  container.appendChild(legend);
}

window.charts = {lineChart, heatRows, categoryStrip, noData, PALETTE,
  fmt: scales.fmt, bucketMeans: scales.bucketMeans, downsampleMinMax: scales.downsampleMinMax};
