/* The charts' arithmetic, apart from drawing: nice tick values (linear and log), number and
 * duration labels, EMA smoothing and the downsampling that keeps long series cheap.
 * Invariant: every function here is pure (numbers in, numbers or strings out; no DOM). */
"use strict";

/* At most 2 points per bucket (the bucket's min and max, in x order): a 10,000-step series stays
 * small as SVG and its spikes survive. */
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

/* TensorBoard's smoothing: an exponential moving average with weight `weight` (0 = raw) on the
 * previous value, debiased so the first points are not pulled towards zero. */
function ema(points, weight) {
  if (!(weight > 0)) return points.slice();
  let last = 0, n = 0;
  return points.map(([x, y]) => {
    if (!Number.isFinite(y)) return [x, y];
    last = last * weight + (1 - weight) * y;
    n += 1;
    return [x, last / (1 - Math.pow(weight, n))];
  });
}

/* 1, 2 or 5 times a power of ten: the step between about `count` ticks covering a span (the
 * nearest of them on a log scale, as d3 picks: the thresholds are their geometric means). */
function niceStep(span, count) {
  const raw = span / Math.max(1, count);
  const power = Math.pow(10, Math.floor(Math.log10(raw)));
  const unit = raw / power;
  return (unit >= Math.sqrt(50) ? 10 : unit >= Math.sqrt(10) ? 5 : unit >= Math.sqrt(2) ? 2 : 1) * power;
}

/* Tick values inside [lo, hi], multiples of a nice step, about `count` of them (at least 2). */
function niceTicks(lo, hi, count) {
  if (!(hi > lo)) return [lo];
  const step = niceStep(hi - lo, count);
  const ticks = [];
  for (let v = Math.ceil(lo / step - 1e-9) * step; v <= hi + step * 1e-9; v += step) {
    ticks.push(Math.abs(v) < step * 1e-9 ? 0 : Number(v.toPrecision(12)));
  }
  return ticks;
}

/* Powers of ten inside [lo, hi] (lo > 0); with fewer than 2 of them, 1-2-5 steps of each decade. */
function logTicks(lo, hi) {
  const ticks = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    const p = Math.pow(10, e);
    if (p >= lo * (1 - 1e-9) && p <= hi * (1 + 1e-9)) ticks.push(p);
  }
  if (ticks.length >= 2) return ticks;
  const finer = [];
  for (let e = Math.floor(Math.log10(lo)); e <= Math.ceil(Math.log10(hi)); e++) {
    for (const m of [1, 2, 5]) {
      const v = m * Math.pow(10, e);
      if (v >= lo * (1 - 1e-9) && v <= hi * (1 + 1e-9)) finer.push(Number(v.toPrecision(12)));
    }
  }
  return finer.length >= 2 ? finer : niceTicks(lo, hi, 3);
}

const TIME_STEPS = [1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 10800, 21600, 43200, 86400];

/* Ticks for seconds (a wall-clock axis): whole seconds, minutes or hours, about `count` of them. */
function timeTicks(lo, hi, count) {
  const raw = (hi - lo) / Math.max(1, count);
  const step = TIME_STEPS.find(t => t >= raw);
  if (step === undefined || !(hi > lo)) return niceTicks(lo, hi, count);
  const ticks = [];
  for (let v = Math.ceil(lo / step) * step; v <= hi + 1e-9; v += step) ticks.push(v);
  return ticks;
}

const SI = [[1e12, "T"], [1e9, "G"], [1e6, "M"], [1e3, "k"]];

/* A short label: SI suffixes from 1000 up (12.5k, 3M), at most 3 significant digits below. */
function fmt(v) {
  if (v === null || v === undefined || Number.isNaN(v)) return "-";
  if (!Number.isFinite(v)) return v > 0 ? "∞" : "-∞";
  const a = Math.abs(v);
  for (const [size, suffix] of SI) {
    if (a >= size) return trimZeros((v / size).toPrecision(3)) + suffix;
  }
  if (a === 0) return "0";
  if (a >= 100) return v.toFixed(0);
  if (a >= 0.001) return trimZeros(v.toPrecision(3));
  return v.toExponential(1);
}

function trimZeros(text) {
  return text.includes(".") && !text.includes("e") ? text.replace(/\.?0+$/, "") : text;
}

/* Seconds as 45s, 3m 20s, 2h 05m, 3d 4h. */
function fmtDuration(seconds) {
  if (seconds === null || seconds === undefined || !Number.isFinite(seconds)) return "-";
  const s = Math.max(0, Math.round(seconds));
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m ${String(s % 60).padStart(2, "0")}s`;
  if (s < 86400) return `${Math.floor(s / 3600)}h ${String(Math.floor(s / 60) % 60).padStart(2, "0")}m`;
  return `${Math.floor(s / 86400)}d ${Math.floor(s / 3600) % 24}h`;
}

/* Remaining seconds from the rate over the last `window` (step, time) pairs; null when unknown. */
function etaSeconds(stepTimes, totalSteps, window) {
  if (!totalSteps || stepTimes.length < 2) return null;
  const recent = stepTimes.slice(-(window || 20));
  const [s0, t0] = recent[0], [s1, t1] = recent[recent.length - 1];
  if (s1 >= totalSteps) return 0;
  if (s1 <= s0 || t1 <= t0) return null;
  return (totalSteps - s1) * (t1 - t0) / (s1 - s0);
}

window.scales = {downsampleMinMax, bucketMeans, ema, niceStep, niceTicks, logTicks, timeTicks, fmt, fmtDuration, etaSeconds};
