/* Charts drawn as SVG by hand: a line chart, a busy/idle timeline and a strip of categories.
 * downsampleMinMax keeps a 10,000-step series readable and cheap: at most 2 points per bucket
 * (the bucket's min and max, in x order), so spikes survive and the SVG stays small. */
"use strict";

const SVG_NS = "http://www.w3.org/2000/svg";

function downsampleMinMax(points, buckets) {
  if (points.length <= 2 * buckets) return points.slice();
  const out = [];
  const size = points.length / buckets;
  for (let b = 0; b < buckets; b++) {
    const from = Math.floor(b * size), to = Math.min(points.length, Math.floor((b + 1) * size));
    let lo = from, hi = from;
    for (let i = from; i < to; i++) {
      if (points[i][1] < points[lo][1]) lo = i;
      if (points[i][1] > points[hi][1]) hi = i;
    }
    if (lo === hi) out.push(points[lo]);
    else if (lo < hi) out.push(points[lo], points[hi]);
    else out.push(points[hi], points[lo]);
  }
  return out;
}

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG_NS, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, v);
  if (parent) parent.appendChild(node);
  return node;
}

function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  const a = Math.abs(v);
  if (a >= 1e9) return (v / 1e9).toFixed(1) + "G";
  if (a >= 1e6) return (v / 1e6).toFixed(1) + "M";
  if (a >= 1e4) return (v / 1e3).toFixed(1) + "k";
  if (a >= 100) return v.toFixed(0);
  if (a >= 1) return v.toFixed(2);
  return v.toPrecision(3);
}

function noData(container, text) {
  container.innerHTML = "";
  const div = document.createElement("div");
  div.className = "nodata";
  div.textContent = text || "no data";
  container.appendChild(div);
}

/* series: [{name, color, points: [[x, y], ...]}]. Sets data-points on the svg (plotted points). */
function lineChart(container, series, opts) {
  opts = opts || {};
  const width = opts.width || 420, height = opts.height || 160, pad = {l: 42, r: 8, t: 8, b: 18};
  const shown = series.filter(s => s.points.length);
  if (!shown.length) { noData(container, opts.empty); return; }
  const buckets = Math.floor((width - pad.l - pad.r) / 2);
  const drawn = shown.map(s => ({...s, points: downsampleMinMax(s.points, buckets)}));
  let x0 = Infinity, x1 = -Infinity, y0 = Infinity, y1 = -Infinity;
  for (const s of drawn) for (const [x, y] of s.points) {
    x0 = Math.min(x0, x); x1 = Math.max(x1, x); y0 = Math.min(y0, y); y1 = Math.max(y1, y);
  }
  if (opts.zero) y0 = Math.min(0, y0);
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 = y0 + 1; }
  const sx = x => pad.l + (x - x0) / (x1 - x0) * (width - pad.l - pad.r);
  const sy = y => height - pad.b - (y - y0) / (y1 - y0) * (height - pad.t - pad.b);
  container.innerHTML = "";
  const svg = el("svg", {width, height, viewBox: `0 0 ${width} ${height}`, class: "chart"}, container);
  el("line", {x1: pad.l, y1: height - pad.b, x2: width - pad.r, y2: height - pad.b, stroke: "#ccd"}, svg);
  for (const [v, y] of [[y1, pad.t + 8], [y0, height - pad.b]]) {
    el("text", {x: pad.l - 4, y, "text-anchor": "end"}, svg).textContent = fmt(v);
  }
  el("text", {x: pad.l, y: height - 4}, svg).textContent = fmt(x0);
  el("text", {x: width - pad.r, y: height - 4, "text-anchor": "end"}, svg).textContent = fmt(x1);
  let count = 0;
  for (const s of drawn) {
    const d = s.points.map(([x, y], i) => `${i ? "L" : "M"}${sx(x).toFixed(1)},${sy(y).toFixed(1)}`).join("");
    el("path", {d, fill: "none", stroke: s.color, "stroke-width": 1.5}, svg);
    count += s.points.length;
  }
  svg.dataset.points = String(count);
  const legend = document.createElement("div");
  legend.className = "legend";
  legend.innerHTML = shown.map(s => `<span><i style="background:${s.color}"></i>${s.name} ` +
    `${fmt(s.points[s.points.length - 1][1])}</span>`).join("");
  container.appendChild(legend);
}

/* rows: [{name, cells: [fraction 0..1 or null]}] drawn as a heat strip per row (a timeline). */
function heatRows(container, rows, opts) {
  opts = opts || {};
  if (!rows.length || !rows[0].cells.length) { noData(container, opts.empty); return; }
  const width = opts.width || 420, rowH = 14, left = 54;
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

/* Mean of each of `buckets` equal slices of values (null where a slice is empty). */
function bucketMeans(values, buckets) {
  if (values.length <= buckets) return values.slice();
  const out = [], size = values.length / buckets;
  for (let b = 0; b < buckets; b++) {
    const part = values.slice(Math.floor(b * size), Math.floor((b + 1) * size));
    out.push(part.length ? part.reduce((a, v) => a + v, 0) / part.length : null);
  }
  return out;
}

window.charts = {downsampleMinMax, lineChart, heatRows, bucketMeans, noData, fmt};
