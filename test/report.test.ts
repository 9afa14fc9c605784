// The HTML report renders in a real browser: headless Chromium loads report.html (data and drawing
// script inline, no network) and the DOM after its scripts ran has the loss, metric and
// compute/communication charts drawn as SVG paths.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { renderReport, summarizeSteps, type StepTime } from "../actors/train/observe/report-html.ts"
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
for (let rank = 0; rank < 2; rank++) for (let step = 0; step < 50; step++) steps.push({ attempt: 0, rank, step, computeMs: 5 + (step % 3), commMs: 2 + rank })

/** Chart paths ("curve" lines and "area" stacks) with their data-series name and d length. */
const paths = (dom: string) =>
  [...dom.matchAll(/<path\b[^>]*>/g)].map((m) => ({
    cls: /class="([^"]*)"/.exec(m[0])?.[1],
    series: /data-series="([^"]*)"/.exec(m[0])?.[1],
    segments: (/ d="([^"]*)"/.exec(m[0])?.[1] ?? "").split(/[ML]/).filter(Boolean).length
  }))

describe("report.html", () => {
  it("bins long step series so the page stays small", () => {
    const many: StepTime[] = Array.from({ length: 5000 }, (_, step) => ({ attempt: 0, rank: 0, step, computeMs: 1, commMs: 1 }))
    const s = summarizeSteps(many)
    expect(s.compute.length).toBeLessThanOrEqual(600)
    expect(s.binSize).toBe(9)
    expect(s.perRank).toEqual([{ rank: 0, steps: 5000, computeMs: 1, commMs: 1 }])
  })

  it("draws loss and metric curves per epoch and the compute/communication split in headless Chromium", async () => {
    const file = path.join(dir, "report.html")
    fs.writeFileSync(file, renderReport({ title: "synthetic <run>", finishedAt: "2026-01-01T00:00:00Z", restarts: 0, history, steps }))
    const html = fs.readFileSync(file, "utf8")
    // Self-contained: nothing is fetched from anywhere.
    expect(html).not.toMatch(/\b(src|href)=["']?https?:/)
    expect(html).toContain("synthetic &lt;run&gt;")
    const dom = await dumpDom(file)
    expect(dom).toMatch(/<body[^>]*data-drawn="3"/)
    const drawn = paths(dom)
    const curves = drawn.filter((p) => p.cls === "curve")
    expect(curves.map((p) => p.series).sort()).toEqual(["accuracy", "loss", "val_accuracy", "val_loss"])
    // One vertex per epoch.
    for (const c of curves) expect(c.segments).toBe(6)
    const areas = drawn.filter((p) => p.cls === "area")
    expect(areas.map((p) => p.series)).toEqual(["compute", "communication"])
    for (const a of areas) expect(a.segments).toBeGreaterThanOrEqual(100)
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
})
