// report.html in the run directory: loss and metric curves per epoch (rank 0's metrics history)
// and the compute/communication split per step (every rank's step times, which workers send with
// their progress messages whether or not the timeline is on). One self-contained file: the data
// sits in a JSON script tag and a small inline script draws SVG from it, so it opens from disk,
// offline, in any browser. When drawing is done the script sets <body data-drawn="N"> (N charts),
// which is what the rendering test looks for.

/** One step of one rank: forward/backward and apply count as compute, the all-reduce as communication. */
export interface StepTime {
  readonly attempt: number
  readonly rank: number
  readonly step: number
  readonly computeMs: number
  readonly commMs: number
}

export interface ReportData {
  readonly title: string
  readonly finishedAt: string
  readonly error?: string | undefined
  readonly restarts: number
  readonly history: ReadonlyArray<Record<string, unknown>>
  readonly steps: ReadonlyArray<StepTime>
  /** What happened to the run besides training: restarts, resizes, NATS outages, failed checkpoint writes. */
  readonly incidents?: ReadonlyArray<Incident>
}

export interface Incident {
  readonly time: string
  readonly kind: "restart" | "resize" | "bus" | "nats-server" | "checkpoint" | "callback"
  readonly text: string
}

/** At most this many points per step series: longer runs are averaged into bins (the file stays small). */
const MAX_STEP_POINTS = 600

interface StepSeries {
  /** Mean over ranks per step, in run order (attempt, then step), binned. */
  readonly compute: number[]
  readonly comm: number[]
  readonly binSize: number
  readonly perRank: Array<{ rank: number; steps: number; computeMs: number; commMs: number }>
}

/** Reduces raw step times to what the page draws (so the page's data stays bounded). */
export const summarizeSteps = (steps: ReadonlyArray<StepTime>): StepSeries => {
  const byKey = new Map<string, { attempt: number; step: number; compute: number; comm: number; n: number }>()
  const ranks = new Map<number, { rank: number; steps: number; computeMs: number; commMs: number }>()
  for (const s of steps) {
    const key = `${s.attempt}:${s.step}`
    const e = byKey.get(key) ?? { attempt: s.attempt, step: s.step, compute: 0, comm: 0, n: 0 }
    e.compute += s.computeMs
    e.comm += s.commMs
    e.n++
    byKey.set(key, e)
    const r = ranks.get(s.rank) ?? { rank: s.rank, steps: 0, computeMs: 0, commMs: 0 }
    r.steps++
    r.computeMs += s.computeMs
    r.commMs += s.commMs
    ranks.set(s.rank, r)
  }
  const ordered = [...byKey.values()].sort((a, b) => a.attempt - b.attempt || a.step - b.step)
  const binSize = Math.max(1, Math.ceil(ordered.length / MAX_STEP_POINTS))
  const compute: number[] = []
  const comm: number[] = []
  for (let i = 0; i < ordered.length; i += binSize) {
    const bin = ordered.slice(i, i + binSize)
    compute.push(bin.reduce((a, e) => a + e.compute / e.n, 0) / bin.length)
    comm.push(bin.reduce((a, e) => a + e.comm / e.n, 0) / bin.length)
  }
  const perRank = [...ranks.values()]
    .sort((a, b) => a.rank - b.rank)
    .map((r) => ({ rank: r.rank, steps: r.steps, computeMs: r.computeMs / r.steps, commMs: r.commMs / r.steps }))
  return { compute, comm, binSize, perRank }
}

const escapeHtml = (s: string): string => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c] as string)

/** Numeric columns of the history, split into loss-like and other metrics; the x axis is epoch when reported. */
const metricSeries = (history: ReadonlyArray<Record<string, unknown>>) => {
  const skip = new Set(["epoch", "report", "time", "step", "attempt"])
  const keys = [...new Set(history.flatMap((r) => Object.keys(r)))].filter(
    (k) => !skip.has(k) && history.some((r) => typeof r[k] === "number" && Number.isFinite(r[k]))
  )
  const x = history.map((r, i) => (typeof r.epoch === "number" ? r.epoch + 1 : i + 1))
  const col = (k: string) => history.map((r) => (typeof r[k] === "number" && Number.isFinite(r[k]) ? (r[k] as number) : null))
  return {
    xLabel: history.some((r) => typeof r.epoch === "number") ? "epoch" : "report",
    x,
    loss: keys.filter((k) => /loss/i.test(k)).map((k) => ({ name: k, values: col(k) })),
    other: keys.filter((k) => !/loss/i.test(k)).map((k) => ({ name: k, values: col(k) }))
  }
}

// The drawing script (plain browser JavaScript, no dependencies). Kept as a string so the report
// needs nothing but this file.
const SCRIPT = String.raw`
(function () {
  var data = JSON.parse(document.getElementById("gw-data").textContent);
  var NS = "http://www.w3.org/2000/svg";
  var COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"];
  var W = 560, H = 260, L = 56, R = 16, T = 16, B = 36;
  function el(name, attrs, parent) {
    var e = document.createElementNS(NS, name);
    for (var k in attrs) e.setAttribute(k, attrs[k]);
    if (parent) parent.appendChild(e);
    return e;
  }
  function fmt(v) { var a = Math.abs(v); return a >= 1000 || (a > 0 && a < 0.01) ? v.toExponential(1) : +v.toPrecision(3) + ""; }
  function frame(holder, xs, lo, hi, xLabel, yLabel) {
    var svg = el("svg", { viewBox: "0 0 " + W + " " + H, width: W, height: H, role: "img" }, holder);
    var x0 = Math.min.apply(null, xs), x1 = Math.max.apply(null, xs);
    var whole = xs.every(function (x) { return x === Math.round(x); });
    if (x1 === x0) x1 = x0 + 1;
    if (hi === lo) { hi = lo + 1; }
    var sx = function (x) { return L + (x - x0) / (x1 - x0) * (W - L - R); };
    var sy = function (y) { return H - B - (y - lo) / (hi - lo) * (H - T - B); };
    el("rect", { x: L, y: T, width: W - L - R, height: H - T - B, fill: "none", stroke: "#ccc" }, svg);
    for (var i = 0; i <= 4; i++) {
      var yv = lo + (hi - lo) * i / 4, y = sy(yv);
      el("line", { x1: L, x2: W - R, y1: y, y2: y, stroke: "#eee" }, svg);
      el("text", { x: L - 6, y: y + 4, "text-anchor": "end", "font-size": 11, fill: "#555" }, svg).textContent = fmt(yv);
    }
    // Whole-number axes (epochs, steps) get ticks on whole numbers, so labels sit on the points.
    var xticks = [];
    if (whole) {
      var every = Math.max(1, Math.ceil((x1 - x0) / 8));
      for (var t = x0; t <= x1; t += every) xticks.push(t);
    } else {
      for (var k = 0; k <= 4; k++) xticks.push(x0 + (x1 - x0) * k / 4);
    }
    xticks.forEach(function (xv) {
      el("text", { x: sx(xv), y: H - B + 16, "text-anchor": "middle", "font-size": 11, fill: "#555" }, svg).textContent = fmt(whole ? xv : Math.round(xv * 100) / 100);
    });
    el("text", { x: (L + W - R) / 2, y: H - 4, "text-anchor": "middle", "font-size": 12 }, svg).textContent = xLabel;
    el("text", { x: 12, y: (T + H - B) / 2, "font-size": 12, transform: "rotate(-90 12 " + (T + H - B) / 2 + ")", "text-anchor": "middle" }, svg).textContent = yLabel;
    return { svg: svg, sx: sx, sy: sy };
  }
  function legend(holder, names) {
    var div = document.createElement("div");
    div.className = "legend";
    names.forEach(function (n, i) {
      var s = document.createElement("span");
      s.innerHTML = '<i style="background:' + COLORS[i % COLORS.length] + '"></i>';
      s.appendChild(document.createTextNode(n));
      div.appendChild(s);
    });
    holder.appendChild(div);
  }
  function lineChart(id, xs, series, xLabel, yLabel) {
    var holder = document.getElementById(id);
    var vals = [];
    series.forEach(function (s) { s.values.forEach(function (v) { if (v !== null) vals.push(v); }); });
    if (!vals.length || !xs.length) { holder.appendChild(document.createTextNode("no data")); return 0; }
    var lo = Math.min.apply(null, vals), hi = Math.max.apply(null, vals), pad = (hi - lo) * 0.05;
    var low = lo >= 0 && lo - pad < 0 ? 0 : lo - pad;
    var f = frame(holder, xs, low, hi + pad, xLabel, yLabel);
    series.forEach(function (s, i) {
      var d = "", c = COLORS[i % COLORS.length];
      s.values.forEach(function (v, j) {
        if (v === null) return;
        d += (d ? "L" : "M") + f.sx(xs[j]).toFixed(1) + "," + f.sy(v).toFixed(1);
        el("circle", { cx: f.sx(xs[j]), cy: f.sy(v), r: 2.5, fill: c }, f.svg);
      });
      el("path", { d: d, fill: "none", stroke: c, "stroke-width": 2, "class": "curve", "data-series": s.name }, f.svg);
    });
    legend(holder, series.map(function (s) { return s.name; }));
    return 1;
  }
  function splitChart(id, st) {
    var holder = document.getElementById(id);
    var n = st.compute.length;
    if (!n) { holder.appendChild(document.createTextNode("no step times were reported")); return 0; }
    var xs = [], totals = [];
    for (var i = 0; i < n; i++) { xs.push(i * st.binSize + 1); totals.push(st.compute[i] + st.comm[i]); }
    // A few slow steps (the first, with its warm-up; a checkpoint) would flatten the rest: the
    // scale stops at 1.5x the 95th percentile and taller steps are clipped at the top.
    var sorted = totals.slice().sort(function (a, b) { return a - b; });
    var max = sorted[n - 1], p95 = sorted[Math.min(n - 1, Math.floor(n * 0.95))];
    var hi = Math.min(max, 1.5 * p95) || max || 1;
    var clip = function (v) { return Math.min(v, hi); };
    var f = frame(holder, xs, 0, hi * 1.05, "step" + (st.binSize > 1 ? " (mean of " + st.binSize + " steps)" : ""), "ms per step (mean over ranks)");
    // Stacked areas: compute from 0, communication on top of it.
    function area(lower, upper, color, name) {
      var d = "";
      for (var i = 0; i < n; i++) d += (i ? "L" : "M") + f.sx(xs[i]).toFixed(1) + "," + f.sy(upper[i]).toFixed(1);
      for (var j = n - 1; j >= 0; j--) d += "L" + f.sx(xs[j]).toFixed(1) + "," + f.sy(lower[j]).toFixed(1);
      el("path", { d: d + "Z", fill: color, "fill-opacity": 0.75, stroke: color, "class": "area", "data-series": name }, f.svg);
    }
    var zero = st.compute.map(function () { return 0; });
    var comp = st.compute.map(clip);
    var top = totals.map(clip);
    area(zero, comp, COLORS[0], "compute");
    area(comp, top, COLORS[3], "communication");
    var clipped = totals.filter(function (t) { return t > hi; }).length;
    if (clipped) el("text", { x: W - R - 4, y: T + 12, "text-anchor": "end", "font-size": 11, fill: "#555" }, f.svg).textContent = clipped + " step(s) above " + fmt(hi) + " ms clipped (max " + fmt(max) + " ms)";
    var legendDiv = document.createElement("div");
    legendDiv.className = "legend";
    legendDiv.innerHTML = '<span><i style="background:' + COLORS[0] + '"></i>compute (forward/backward + apply)</span><span><i style="background:' + COLORS[3] + '"></i>communication (gradient all-reduce)</span>';
    holder.appendChild(legendDiv);
    return 1;
  }
  var drawn = 0;
  drawn += lineChart("loss", data.metrics.x, data.metrics.loss, data.metrics.xLabel, "loss");
  drawn += lineChart("metrics", data.metrics.x, data.metrics.other, data.metrics.xLabel, "value");
  drawn += splitChart("split", data.steps);
  document.body.setAttribute("data-drawn", String(drawn));
})();
`

/** The whole report as one HTML string. */
export const renderReport = (d: ReportData): string => {
  const metrics = metricSeries(d.history)
  const steps = summarizeSteps(d.steps)
  const totalCompute = steps.perRank.reduce((a, r) => a + r.computeMs * r.steps, 0)
  const totalComm = steps.perRank.reduce((a, r) => a + r.commMs * r.steps, 0)
  const commShare = totalCompute + totalComm > 0 ? (100 * totalComm) / (totalCompute + totalComm) : 0
  const last = d.history.at(-1) ?? {}
  // JSON inside <script> must not be able to close the tag.
  const json = JSON.stringify({ metrics, steps }).replace(/</g, "\\u003c")
  const rows = steps.perRank
    .map((r) => `<tr><td>${r.rank}</td><td>${r.steps}</td><td>${r.computeMs.toFixed(2)}</td><td>${r.commMs.toFixed(2)}</td><td>${((100 * r.commMs) / Math.max(1e-9, r.computeMs + r.commMs)).toFixed(0)}%</td></tr>`)
    .join("")
  const incidents = (d.incidents ?? [])
    .map((i) => `<tr><td>${escapeHtml(i.time)}</td><td>${escapeHtml(i.kind)}</td><td style="text-align:left">${escapeHtml(i.text)}</td></tr>`)
    .join("")
  const lastText = Object.entries(last)
    .filter(([k, v]) => typeof v === "number" && k !== "report")
    .map(([k, v]) => `${escapeHtml(k)} = ${Number.isInteger(v) ? v : (v as number).toPrecision(4)}`)
    .join(", ")
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(d.title)} — gradwire report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1300px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 16px; margin: 0 0 8px; }
.meta { color: #555; margin-bottom: 16px; } .error { color: #b00; }
.grid { display: flex; flex-wrap: wrap; gap: 24px; } .card { border: 1px solid #ddd; border-radius: 6px; padding: 12px; }
.legend span { margin-right: 14px; font-size: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
</style></head>
<body data-drawn="0">
<h1>${escapeHtml(d.title)}</h1>
<div class="meta">finished ${escapeHtml(d.finishedAt)} · ${d.history.length} report rounds · ${d.restarts} restart(s)${lastText ? ` · last: ${lastText}` : ""}</div>
${d.error ? `<p class="error">run failed: ${escapeHtml(d.error)}</p>` : ""}
<div class="grid">
<div class="card"><h2>Loss per ${metrics.xLabel}</h2><div id="loss"></div></div>
<div class="card"><h2>Metrics per ${metrics.xLabel}</h2><div id="metrics"></div></div>
<div class="card"><h2>Compute / communication per step</h2><div id="split"></div>
<p>communication: ${commShare.toFixed(1)}% of step time over all ranks</p></div>
<div class="card"><h2>Per rank (mean ms per step)</h2>
<table><tr><th>rank</th><th>steps</th><th>compute</th><th>comm</th><th>comm share</th></tr>${rows}</table></div>
${incidents ? `<div class="card" id="incidents"><h2>Restarts, resizes and outages</h2>
<table><tr><th>time</th><th>what</th><th>detail</th></tr>${incidents}</table></div>` : ""}
</div>
<script type="application/json" id="gw-data">${json}</script>
<script>${SCRIPT}</script>
</body></html>
`
}
