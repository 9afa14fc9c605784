// report.html in the run directory, written during the run (refreshed as it trains) and at its end,
// also when it fails or is interrupted. One chart per metric (a metric's val_/train_ twin and its
// per-rank columns share its chart, so accuracy is never flattened by a larger-scale metric), the
// compute / communication / waiting split per step with restart markers, each rank's throughput
// over time with restart and resize markers, a straggler panel, the all-reduce plan, and links to
// the timeline, the logs and the other files. One self-contained file: the data sits in a JSON
// script tag and the inline chart script (chart-script.ts, uPlot inlined) draws it, so it opens
// from disk, offline, in any browser. When drawing is done the script sets <body data-drawn="N"> (N
// charts drawn), which is what the rendering test looks for.
import { CHART_SCRIPT, chartHead } from "./chart-script.ts"

/** One step of one rank: forward/backward and apply count as compute, the all-reduce as communication, the time since the rank's previous step as waiting. */
export interface StepTime {
  readonly attempt: number
  readonly rank: number
  readonly step: number
  readonly computeMs: number
  readonly commMs: number
  readonly waitMs?: number
}

export interface ReportData {
  readonly title: string
  /** When the report was written (the run's end, or the last refresh while it runs). */
  readonly finishedAt: string
  /** "running" while the run goes on (the page then says it is a snapshot); absent or another word once it ended. */
  readonly state?: string
  readonly startedAt?: string
  readonly error?: string | undefined
  readonly restarts: number
  readonly history: ReadonlyArray<Record<string, unknown>>
  /** The generation (attempt) of each history row: markers where it changes. */
  readonly attempts?: ReadonlyArray<number>
  readonly steps: ReadonlyArray<StepTime>
  /** Samples per second of each rank over time (x: seconds since the run started). */
  readonly throughput?: ReadonlyArray<{ readonly rank: number; readonly points: ReadonlyArray<readonly [number, number | null]> }>
  /** What happened to the run besides training: restarts, resizes, NATS outages, failed checkpoint writes. */
  readonly incidents?: ReadonlyArray<Incident>
  /** explain.txt: the all-reduce plan and why. */
  readonly plan?: string
  /** Files of the run directory to link (relative paths). */
  readonly links?: ReadonlyArray<{ readonly href: string; readonly text: string }>
}

export interface Incident {
  readonly time: string
  readonly kind: "restart" | "resize" | "bus" | "nats-server" | "checkpoint" | "callback" | "parity" | "unprepared" | "accumulation"
  readonly text: string
}

/** At most this many points per step series: longer runs are averaged into bins (the file stays small). */
const MAX_STEP_POINTS = 600
/** At most this many throughput points per rank. */
const MAX_RATE_POINTS = 400
/** A rank whose mean step takes this much longer than the median rank's is a straggler. */
export const STRAGGLER_RATIO = 1.3

interface StepSeries {
  /** Mean over ranks per step, in run order (attempt, then step), binned. */
  readonly compute: number[]
  readonly comm: number[]
  readonly wait: number[]
  readonly binSize: number
  /** x (1-based binned step position) where a new attempt begins, with the attempt. */
  readonly attemptStarts: Array<{ x: number; attempt: number }>
  readonly perRank: Array<{ rank: number; steps: number; computeMs: number; commMs: number; waitMs: number }>
}

/** Reduces raw step times to what the page draws (so the page's data stays bounded). */
export const summarizeSteps = (steps: ReadonlyArray<StepTime>): StepSeries => {
  const byKey = new Map<string, { attempt: number; step: number; compute: number; comm: number; wait: number; n: number }>()
  const ranks = new Map<number, { rank: number; steps: number; computeMs: number; commMs: number; waitMs: number }>()
  for (const s of steps) {
    const key = `${s.attempt}:${s.step}`
    const e = byKey.get(key) ?? { attempt: s.attempt, step: s.step, compute: 0, comm: 0, wait: 0, n: 0 }
    e.compute += s.computeMs
    e.comm += s.commMs
    e.wait += s.waitMs ?? 0
    e.n++
    byKey.set(key, e)
    const r = ranks.get(s.rank) ?? { rank: s.rank, steps: 0, computeMs: 0, commMs: 0, waitMs: 0 }
    r.steps++
    r.computeMs += s.computeMs
    r.commMs += s.commMs
    r.waitMs += s.waitMs ?? 0
    ranks.set(s.rank, r)
  }
  const ordered = [...byKey.values()].sort((a, b) => a.attempt - b.attempt || a.step - b.step)
  const binSize = Math.max(1, Math.ceil(ordered.length / MAX_STEP_POINTS))
  const compute: number[] = []
  const comm: number[] = []
  const wait: number[] = []
  const attemptStarts: Array<{ x: number; attempt: number }> = []
  for (let i = 0; i < ordered.length; i += binSize) {
    const bin = ordered.slice(i, i + binSize)
    compute.push(bin.reduce((a, e) => a + e.compute / e.n, 0) / bin.length)
    comm.push(bin.reduce((a, e) => a + e.comm / e.n, 0) / bin.length)
    wait.push(bin.reduce((a, e) => a + e.wait / e.n, 0) / bin.length)
  }
  for (let i = 1; i < ordered.length; i++) {
    if (ordered[i].attempt !== ordered[i - 1].attempt) attemptStarts.push({ x: Math.floor(i / binSize) * binSize + 1, attempt: ordered[i].attempt })
  }
  const perRank = [...ranks.values()]
    .sort((a, b) => a.rank - b.rank)
    .map((r) => ({ rank: r.rank, steps: r.steps, computeMs: r.computeMs / r.steps, commMs: r.commMs / r.steps, waitMs: r.waitMs / r.steps }))
  return { compute, comm, wait, binSize, attemptStarts, perRank }
}

/** Ranks by mean step time against the median rank's: ratio and whether it is a straggler. */
export const stragglers = (perRank: ReadonlyArray<{ rank: number; computeMs: number; commMs: number; waitMs: number }>) => {
  // Compute and waiting say who is slow; communication is where the others wait for it.
  const own = perRank.map((r) => r.computeMs + r.waitMs)
  const sorted = [...own].sort((a, b) => a - b)
  const median = sorted.length ? sorted[Math.floor((sorted.length - 1) / 2)] : 0
  return perRank.map((r, i) => {
    const ratio = median > 0 ? own[i] / median : 1
    return { rank: r.rank, ratio, straggler: perRank.length > 1 && ratio > STRAGGLER_RATIO }
  })
}

const escapeHtml = (s: string): string => s.replace(/[&<>"]/g, (c) => ({ "&": "&amp;", "<": "&lt;", ">": "&gt;", '"': "&quot;" })[c] as string)

/** The chart a metric goes on: its own, shared with its val_/train_/test_ twin and its per-rank columns (name/rank<i>). */
export const chartOfMetric = (key: string): string => key.replace(/^(val|train|test|eval|validation)_/, "").replace(/\/rank\d+$/, "")

/** Numeric columns of the history, one chart per metric (see chartOfMetric); the x axis is epoch when reported. */
const metricCharts = (history: ReadonlyArray<Record<string, unknown>>, attempts: ReadonlyArray<number> | undefined) => {
  const skip = new Set(["epoch", "report", "time", "step", "attempt"])
  const keys = [...new Set(history.flatMap((r) => Object.keys(r)))].filter(
    (k) => !skip.has(k) && history.some((r) => typeof r[k] === "number" && Number.isFinite(r[k]))
  )
  const byEpoch = history.some((r) => typeof r.epoch === "number")
  const x = history.map((r, i) => (typeof r.epoch === "number" ? r.epoch + 1 : i + 1))
  const charts = new Map<string, Array<{ name: string; points: Array<[number, number | null]> }>>()
  for (const k of keys) {
    const chart = chartOfMetric(k)
    const series = charts.get(chart) ?? []
    series.push({ name: k, points: history.map((r, i) => [x[i], typeof r[k] === "number" && Number.isFinite(r[k]) ? (r[k] as number) : null]) })
    charts.set(chart, series)
  }
  // Losses first, then the rest in the order they were first reported.
  const ordered = [...charts.entries()].sort(([a], [b]) => Number(!/loss/i.test(a)) - Number(!/loss/i.test(b)))
  const markers: Array<{ x: number; kind: string; label: string }> = []
  if (attempts) {
    for (let i = 1; i < attempts.length && i < x.length; i++) {
      // (-1: the rows of an earlier fit() of the run, which this one resumed: run-recorder.ts's EARLIER_RUN)
      if (attempts[i] !== attempts[i - 1]) markers.push({ x: x[i], kind: "restart", label: attempts[i - 1] === -1 ? "resumed" : `attempt ${attempts[i]}` })
    }
  }
  return { xLabel: byEpoch ? "epoch" : "report", charts: ordered.map(([title, series]) => ({ title, series })), markers }
}

const thin = <A>(points: ReadonlyArray<A>, max: number): A[] => {
  if (points.length <= max) return [...points]
  const every = Math.ceil(points.length / max)
  return points.filter((_, i) => i % every === 0 || i === points.length - 1)
}

// Draws every chart from the JSON data; runs after CHART_SCRIPT.
const DRAW = String.raw`
(function () {
  var data = JSON.parse(document.getElementById("gw-data").textContent);
  var drawn = 0, grid = document.getElementById("metric-charts");
  data.metrics.charts.forEach(function (c, i) {
    var card = document.createElement("div");
    card.className = "card";
    var h = document.createElement("h2");
    h.textContent = c.title + " per " + data.metrics.xLabel;
    card.appendChild(h);
    var holder = document.createElement("div");
    holder.id = "metric-" + i;
    holder.setAttribute("data-metric", c.title);
    card.appendChild(holder);
    grid.appendChild(card);
    drawn += gwCharts.line(holder, { series: c.series, xLabel: data.metrics.xLabel, yLabel: c.title, markers: data.metrics.markers });
  });
  if (!data.metrics.charts.length) grid.appendChild(document.createTextNode("no metrics were reported"));
  var st = data.steps, xs = [];
  for (var i = 0; i < st.compute.length; i++) xs.push(i * st.binSize + 1);
  drawn += gwCharts.stack(document.getElementById("split"), {
    xs: xs,
    layers: [
      { name: "compute", label: "compute (forward/backward + apply)", values: st.compute },
      { name: "communication", label: "communication (gradient all-reduce)", values: st.comm },
      { name: "waiting", label: "waiting (between steps: data, reports, checkpoints)", values: st.wait }
    ],
    xLabel: "step" + (st.binSize > 1 ? " (mean of " + st.binSize + " steps)" : ""),
    yLabel: "ms per step (mean over ranks)",
    markers: st.attemptStarts.map(function (a) { return { x: a.x, kind: "restart", label: "attempt " + a.attempt }; })
  });
  drawn += gwCharts.line(document.getElementById("throughput"), {
    series: data.throughput.map(function (r) { return { name: "rank " + r.rank, points: r.points }; }),
    xLabel: "time since start", yLabel: "samples/s", time: true, zero: true, markers: data.incidentMarkers,
    emptyText: "no throughput was reported"
  });
  drawn += gwCharts.bars(document.getElementById("stragglers"), data.stragglers.map(function (r) {
    return { label: "rank " + r.rank, parts: [r.computeMs, r.commMs, r.waitMs], flag: r.straggler, note: r.straggler ? "(" + r.ratio.toFixed(1) + "x: straggler)" : "" };
  }), { names: ["compute", "communication", "waiting"], unit: " ms", emptyText: "no step times were reported" });
  document.body.setAttribute("data-drawn", String(drawn));
})();
`

/** The whole report as one HTML string. */
export const renderReport = (d: ReportData): string => {
  const metrics = metricCharts(d.history, d.attempts)
  const steps = summarizeSteps(d.steps)
  const totalCompute = steps.perRank.reduce((a, r) => a + r.computeMs * r.steps, 0)
  const totalComm = steps.perRank.reduce((a, r) => a + r.commMs * r.steps, 0)
  const totalWait = steps.perRank.reduce((a, r) => a + r.waitMs * r.steps, 0)
  const total = totalCompute + totalComm + totalWait
  const share = (v: number): string => (total > 0 ? ((100 * v) / total).toFixed(1) : "0.0")
  const slow = stragglers(steps.perRank)
  const start = d.startedAt ? Date.parse(d.startedAt) : NaN
  const incidentMarkers = Number.isFinite(start)
    ? (d.incidents ?? [])
        .filter((i) => i.kind === "restart" || i.kind === "resize")
        .map((i) => ({ x: (Date.parse(i.time) - start) / 1000, kind: i.kind, label: i.kind }))
        .filter((m) => Number.isFinite(m.x))
    : []
  const data = {
    metrics,
    steps,
    throughput: (d.throughput ?? []).map((r) => ({ rank: r.rank, points: thin(r.points, MAX_RATE_POINTS) })),
    incidentMarkers,
    stragglers: steps.perRank.map((r, i) => ({ ...r, ratio: slow[i].ratio, straggler: slow[i].straggler }))
  }
  const last = d.history.at(-1) ?? {}
  // JSON inside <script> must not be able to close the tag.
  const json = JSON.stringify(data).replace(/</g, "\\u003c")
  const rows = steps.perRank
    .map((r, i) => {
      const all = r.computeMs + r.commMs + r.waitMs
      return (
        `<tr${slow[i].straggler ? ' class="straggler"' : ""}><td>${r.rank}</td><td>${r.steps}</td><td>${r.computeMs.toFixed(2)}</td><td>${r.commMs.toFixed(2)}</td>` +
        `<td>${r.waitMs.toFixed(2)}</td><td>${((100 * r.commMs) / Math.max(1e-9, all)).toFixed(0)}%</td><td>${slow[i].ratio.toFixed(2)}x</td></tr>`
      )
    })
    .join("")
  const incidents = (d.incidents ?? [])
    .map((i) => `<tr><td>${escapeHtml(i.time)}</td><td>${escapeHtml(i.kind)}</td><td style="text-align:left">${escapeHtml(i.text)}</td></tr>`)
    .join("")
  const lastText = Object.entries(last)
    .filter(([k, v]) => typeof v === "number" && k !== "report")
    .map(([k, v]) => `${escapeHtml(k)} = ${Number.isInteger(v) ? v : (v as number).toPrecision(4)}`)
    .join(", ")
  const running = d.state === "running"
  const when = running ? `running; this snapshot ${escapeHtml(d.finishedAt)} (refreshed as it trains: reload)` : `${escapeHtml(d.state ?? "finished")} ${escapeHtml(d.finishedAt)}`
  const links = (d.links ?? []).map((l) => `<a href="${escapeHtml(l.href)}">${escapeHtml(l.text)}</a>`).join(" · ")
  const flagged = slow.filter((s) => s.straggler).map((s) => `rank ${s.rank} (${s.ratio.toFixed(1)}x)`)
  return `<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>${escapeHtml(d.title)} — gradwire report</title>
<style>
body { font: 14px/1.4 system-ui, sans-serif; margin: 24px; color: #222; max-width: 1400px; }
h1 { font-size: 20px; margin: 0 0 4px; } h2 { font-size: 15px; margin: 0 0 8px; }
.meta { color: #555; margin-bottom: 8px; } .error { color: #b00; } .links { margin-bottom: 16px; }
.grid { display: flex; flex-wrap: wrap; gap: 18px; margin-bottom: 18px; } .card { border: 1px solid #ddd; border-radius: 6px; padding: 10px 12px; }
.legend span { margin-right: 14px; font-size: 12px; } .legend i { display: inline-block; width: 10px; height: 10px; margin-right: 4px; border-radius: 2px; }
table { border-collapse: collapse; font-size: 13px; } td, th { border: 1px solid #ddd; padding: 3px 8px; text-align: right; }
tr.straggler td { color: #b00; font-weight: bold; } pre { font-size: 12px; background: #f7f7f7; padding: 8px; overflow: auto; max-height: 420px; }
.nodata { color: #777; }
</style>
${chartHead()}</head>
<body data-drawn="0">
<h1>${escapeHtml(d.title)}</h1>
<div class="meta">${when} · ${d.history.length} report rounds · ${d.restarts} restart(s)${lastText ? ` · last: ${lastText}` : ""}</div>
${links ? `<div class="links">${links}</div>` : ""}
${d.error ? `<p class="error">run failed: ${escapeHtml(d.error)}</p>` : ""}
<div class="grid" id="metric-charts"></div>
<div class="grid">
<div class="card"><h2>Compute / communication / waiting per step</h2><div id="split"></div>
<p>over all ranks: compute ${share(totalCompute)}%, communication ${share(totalComm)}%, waiting ${share(totalWait)}% of step time</p></div>
<div class="card"><h2>Throughput per rank</h2><div id="throughput"></div></div>
<div class="card" id="straggler-panel"><h2>Stragglers (mean ms per step)</h2><div id="stragglers"></div>
<p>${flagged.length ? `stragglers (compute + waiting over ${STRAGGLER_RATIO}x the median rank's): ${flagged.join(", ")}` : "no straggler: every rank within " + STRAGGLER_RATIO + "x of the median"}</p></div>
<div class="card"><h2>Per rank (mean ms per step)</h2>
<table><tr><th>rank</th><th>steps</th><th>compute</th><th>comm</th><th>waiting</th><th>comm share</th><th>x median</th></tr>${rows}</table></div>
${incidents ? `<div class="card" id="incidents"><h2>Restarts, resizes and outages</h2>
<table><tr><th>time</th><th>what</th><th>detail</th></tr>${incidents}</table></div>` : ""}
</div>
${d.plan ? `<div class="card" id="plan"><h2>All-reduce plan (explain.txt)</h2><pre>${escapeHtml(d.plan)}</pre></div>` : ""}
<script type="application/json" id="gw-data">${json}</script>
<script>${CHART_SCRIPT}</script>
<script>${DRAW}</script>
</body></html>
`
}
