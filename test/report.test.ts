// The HTML report renders in a real browser: headless Chromium loads report.html (data and drawing
// script inline, no network) and the DOM after its scripts ran has one chart per metric (a metric
// and its val_ twin together, accuracy never on the loss's axis), the compute / communication /
// waiting split, per-rank throughput with restart and resize markers, and the straggler panel.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { renderReport, summarizeSteps, type StepTime } from "../actors/train/common/observe/report-html.ts"
import { dumpDom, screenshot } from "./support/chromium.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-report-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const history = Array.from({ length: 6 }, (_, epoch) => ({
  epoch,
  loss: 2 / (epoch + 1),
  val_loss: 2.2 / (epoch + 1),
  accuracy: 1 - 0.5 / (epoch + 1),
  val_accuracy: 1 - 0.6 / (epoch + 1),
  weights: "abc123"
}))
const steps: StepTime[] = []
for (let rank = 0; rank < 2; rank++) for (let step = 0; step < 50; step++) steps.push({ attempt: 0, rank, step, computeMs: 5 + (step % 3), commMs: 2 + rank, waitMs: 1 })

/** Chart series ("curve" lines and "area" stacks: their legend rows) with their data-series name and point count. */
const paths = (dom: string) =>
  [...dom.matchAll(/<tr\b[^>]*data-series="[^>]*>/g)].map((m) => ({
    cls: /class="[^"]*\b(curve|area)\b[^"]*"/.exec(m[0])?.[1],
    series: /data-series="([^"]*)"/.exec(m[0])?.[1],
    segments: Number(/data-points="(\d+)"/.exec(m[0])?.[1] ?? 0)
  }))

describe("report.html", () => {
  it("bins long step series so the page stays small", () => {
    const many: StepTime[] = Array.from({ length: 5000 }, (_, step) => ({ attempt: 0, rank: 0, step, computeMs: 1, commMs: 1 }))
    const s = summarizeSteps(many)
    expect(s.compute.length).toBeLessThanOrEqual(600)
    expect(s.binSize).toBe(9)
    expect(s.perRank).toEqual([{ rank: 0, steps: 5000, computeMs: 1, commMs: 1, waitMs: 0 }])
  })

  it("draws one chart per metric and the compute/communication/waiting split in headless Chromium", async () => {
    const file = path.join(dir, "report.html")
    fs.writeFileSync(file, renderReport({ title: "synthetic <run>", finishedAt: "2026-01-01T00:00:00Z", restarts: 0, history, steps }))
    const html = fs.readFileSync(file, "utf8")
    // Self-contained: nothing is fetched from anywhere.
    expect(html).not.toMatch(/\b(src|href)=["']?https?:/)
    expect(html).toContain("synthetic &lt;run&gt;")
    const dom = await dumpDom(file)
    // loss and accuracy charts, the step split, the straggler bars (no throughput was given).
    expect(dom).toMatch(/<body[^>]*data-drawn="4"/)
    const drawn = paths(dom)
    const curves = drawn.filter((p) => p.cls === "curve")
    expect(curves.map((p) => p.series).sort()).toEqual(["accuracy", "loss", "val_accuracy", "val_loss"])
    // One vertex per epoch.
    for (const c of curves) expect(c.segments).toBe(6)
    // Each metric on its own chart, with its val_ twin: accuracy has an axis of its own.
    const charts = [...dom.matchAll(/data-metric="([^"]*)"(.*?)(?=data-metric=|id="split")/gs)].map((m) => ({
      metric: m[1],
      series: [...m[2].matchAll(/class="u-series curve" data-series="([^"]*)"/g)].map((x) => x[1]).sort()
    }))
    expect(charts).toEqual([
      { metric: "loss", series: ["loss", "val_loss"] },
      { metric: "accuracy", series: ["accuracy", "val_accuracy"] }
    ])
    const areas = drawn.filter((p) => p.cls === "area")
    expect(areas.map((p) => p.series)).toEqual(["compute", "communication", "waiting"])
    // One point per step (50 steps, not binned).
    for (const a of areas) expect(a.segments).toBe(50)
    if (process.env.GW_REPORT_SCREENSHOT) await screenshot(file, process.env.GW_REPORT_SCREENSHOT)
  })

  it("says so instead of drawing when there is nothing to draw", async () => {
    const file = path.join(dir, "empty.html")
    fs.writeFileSync(file, renderReport({ title: "empty", finishedAt: "now", error: "boom", restarts: 1, history: [], steps: [] }))
    const dom = await dumpDom(file)
    expect(dom).toMatch(/<body[^>]*data-drawn="0"/)
    expect(dom).toContain("run failed: boom")
    expect(dom).toContain("no step times were reported")
  })

  it("draws per-rank throughput with restart and resize markers, flags a straggler, and links the run's files", async () => {
    const file = path.join(dir, "ranks.html")
    const start = Date.parse("2026-01-01T00:00:00Z")
    const slowSteps: StepTime[] = []
    for (let attempt = 0; attempt < 2; attempt++) {
      for (let rank = 0; rank < 3; rank++) for (let step = 0; step < 20; step++) slowSteps.push({ attempt, rank, step, computeMs: rank === 2 ? 20 : 5, commMs: 3, waitMs: 1 })
    }
    const throughput = [0, 1, 2].map((rank) => ({ rank, points: Array.from({ length: 30 }, (_, i) => [i, rank === 2 ? 50 : 200] as const) }))
    fs.writeFileSync(
      file,
      renderReport({
        title: "ranks",
        finishedAt: "2026-01-01T00:00:30Z",
        startedAt: new Date(start).toISOString(),
        state: "running",
        restarts: 1,
        history: [{ epoch: 0, loss: 1, accuracy: 0.5 }, { epoch: 1, loss: 0.5, accuracy: 0.8 }, { epoch: 2, loss: 0.4, accuracy: 0.85 }],
        attempts: [0, 1, 1],
        steps: slowSteps,
        throughput,
        incidents: [
          { time: new Date(start + 10_000).toISOString(), kind: "restart", text: "rank 1 failed" },
          { time: new Date(start + 20_000).toISOString(), kind: "resize", text: "grows" }
        ],
        plan: "bucket 0: ring <because>",
        links: [{ href: "timeline.json", text: "timeline.json" }, { href: "logs/worker_rank=0.log", text: "logs/worker_rank=0.log" }]
      })
    )
    const dom = await dumpDom(file)
    // loss, accuracy, split, throughput, stragglers
    expect(dom).toMatch(/<body[^>]*data-drawn="5"/)
    const rates = paths(dom).filter((p) => p.cls === "curve" && /^rank /.test(p.series ?? ""))
    expect(rates.map((p) => p.series)).toEqual(["rank 0", "rank 1", "rank 2"])
    const markers = [...dom.matchAll(/class="marker" data-kind="([^"]*)"/g)].map((m) => m[1])
    // The throughput chart's restart and resize, the split's and the metric charts' attempt change.
    expect(markers.filter((k) => k === "resize")).toHaveLength(1)
    expect(markers.filter((k) => k === "restart").length).toBeGreaterThanOrEqual(3)
    expect(dom).toMatch(/stragglers \(compute \+ waiting over 1\.3x the median rank's\): rank 2 \(3\.5x\)/)
    expect(dom).toContain("bucket 0: ring &lt;because&gt;")
    expect(dom).toContain('href="timeline.json"')
    expect(dom).toContain('href="logs/worker_rank=0.log"')
    expect(dom).toContain("running; this snapshot")
  })
})
