// The run directory of a real (short) training run with the timeline on: 2 workers, 2 epochs of
// the digits MLP on the embedded cluster. timeline.json is valid Chrome trace-event JSON and its
// phases nest (forward/backward, all-reduce and apply inside their step; each bucket's compression
// and exchange inside the bucket, the bucket inside the step's all-reduce); the run directory has
// the resolved config, metrics JSONL and CSV, per-rank logs, checkpoints and a report that draws.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Trainer, loadDigits, trainTestSplit, type Result } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { dumpDom } from "./support/chromium.ts"

interface Ev {
  name: string
  ph: string
  ts: number
  dur?: number
  pid: number | string
  tid: number | string
  cat?: string
  args?: Record<string, unknown>
}

let storage: string
let result: Result
let events: Ev[]

beforeAll(async () => {
  storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-timeline-"))
  const { train, test } = trainTestSplit(await loadDigits(), 0.2, 11)
  result = await new Trainer({
    trainLoopPerWorker: path.resolve("examples/digits/train.ts") + "#trainLoop",
    trainLoopConfig: { epochs: 2, batchSize: 64 },
    scalingConfig: { numWorkers: 2 },
    runConfig: { name: "timeline", storagePath: storage, progress: false, timeline: true },
    // Pinned, so the bucket rows do not depend on what an automatic choice picks on this machine.
    collectiveConfig: { algorithm: "ring", compression: "none" },
    datasets: { train, test }
  }).fit()
  const raw = JSON.parse(fs.readFileSync(path.join(result.path, "timeline.json"), "utf8")) as { traceEvents: Ev[] }
  events = raw.traceEvents
}, 120_000)

afterAll(() => {
  fs.rmSync(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

const inside = (child: Ev, parent: Ev): boolean => child.ts >= parent.ts && child.ts + child.dur! <= parent.ts + parent.dur!
const spans = (pred: (e: Ev) => boolean): Ev[] => events.filter((e) => e.ph === "X" && pred(e))

describe("timeline.json", () => {
  it("is trace-event JSON with the required fields", () => {
    expect(Array.isArray(events)).toBe(true)
    expect(events.length).toBeGreaterThan(50)
    for (const e of events) {
      expect(typeof e.name).toBe("string")
      expect(typeof e.ph).toBe("string")
      expect(Number.isFinite(e.ts)).toBe(true)
      expect(e.pid).toBeDefined()
      expect(e.tid).toBeDefined()
      if (e.ph === "X") expect(e.dur).toBeGreaterThanOrEqual(0)
    }
    // Each rank is one named process row; the driver's checkpoint saves are another.
    const names = events.filter((e) => e.name === "process_name").map((e) => e.args?.name)
    expect(names).toEqual(expect.arrayContaining(["rank 0", "rank 1", "driver"]))
  })

  it("has, per rank and step, a step enclosing forward/backward, all-reduce and apply", () => {
    const steps = spans((e) => e.name === "step")
    for (const rank of [0, 1]) {
      const mine = steps.filter((s) => s.pid === rank)
      // 1437 training rows / 2 ranks / batch 64 = 12 steps per epoch, 2 epochs.
      expect(mine.map((s) => s.args?.step)).toEqual(Array.from({ length: 24 }, (_, i) => i))
    }
    for (const name of ["forward_backward", "allreduce", "apply"]) {
      const phases = spans((e) => e.name === name)
      expect(phases).toHaveLength(steps.length)
      for (const p of phases) {
        const parent = steps.find((s) => s.pid === p.pid && s.args?.step === p.args?.step)
        expect(parent, `${name} of rank ${p.pid} step ${p.args?.step}`).toBeDefined()
        expect(inside(p, parent!)).toBe(true)
      }
    }
  })

  it("nests every bucket inside its step's all-reduce, and its compression and exchange inside the bucket", () => {
    const allreduce = spans((e) => e.name === "allreduce")
    const buckets = spans((e) => /^bucket \d+$/.test(e.name))
    expect(buckets.length).toBeGreaterThanOrEqual(allreduce.length)
    for (const b of buckets) {
      const parent = allreduce.find((a) => a.pid === b.pid && a.args?.step === b.args?.step)
      expect(parent).toBeDefined()
      expect(inside(b, parent!)).toBe(true)
      expect(b.args?.bytes).toBeGreaterThan(0)
    }
    const exchanges = spans((e) => e.name.startsWith("all-reduce ("))
    expect(exchanges).toHaveLength(buckets.length)
    for (const x of exchanges) expect(buckets.some((b) => b.pid === x.pid && b.tid === x.tid && inside(x, b))).toBe(true)
  })

  it("records the waits outside steps and the checkpoint uploads and saves", () => {
    const waits = spans((e) => e.cat === "wait")
    const uploads = waits.filter((e) => e.name === "checkpoint upload")
    // Rank 0 hands a checkpoint over after each epoch; rank 1 only reports.
    expect(uploads.map((e) => e.pid)).toEqual([0, 0])
    for (const u of uploads) expect(u.args?.bytes).toBeGreaterThan(1000)
    expect(waits.filter((e) => e.name === "report" && e.pid === 1)).toHaveLength(2)
    expect(waits.filter((e) => e.name === "epoch metrics all-reduce")).toHaveLength(4)
    expect(waits.filter((e) => e.name === "broadcast weights from rank 0")).toHaveLength(2)
    // Waits never overlap the steps of their rank's thread: they are between steps.
    const saves = spans((e) => e.name === "checkpoint save" && e.pid === "driver")
    expect(saves).toHaveLength(2)
    // Wall-clock timestamps: the driver's save of a round starts after rank 0 began uploading it.
    // Each process maps its clock to wall time once (performance.timeOrigin), good to about a
    // millisecond, so the order is checked with that margin (microseconds); per-process clocks
    // would be seconds apart.
    const CLOCK_MARGIN_US = 5000
    expect(saves[0].ts).toBeGreaterThanOrEqual(uploads[0].ts - CLOCK_MARGIN_US)
  })
})

describe("run directory", () => {
  it("has the resolved config, metrics JSONL and CSV, per-rank logs, checkpoints and the report", async () => {
    const files = fs.readdirSync(result.path)
    expect(files).toEqual(
      expect.arrayContaining(["config.json", "metrics.jsonl", "metrics.csv", "metrics_per_rank.jsonl", "events.jsonl", "summary.json", "timeline.json", "report.html", "logs", "checkpoint_000001"])
    )
    const config = JSON.parse(fs.readFileSync(path.join(result.path, "config.json"), "utf8"))
    expect(config.scalingConfig.numWorkers).toBe(2)
    expect(config.collectiveConfig).toHaveProperty("algorithm")
    expect(fs.readFileSync(path.join(result.path, "metrics.jsonl"), "utf8").trim().split("\n")).toHaveLength(2)
    expect(fs.readFileSync(path.join(result.path, "metrics.csv"), "utf8").trim().split("\n")[0]).toContain("val_accuracy")
    const logs = fs.readdirSync(path.join(result.path, "logs")).sort()
    expect(logs).toEqual(["worker_rank=0.log", "worker_rank=1.log"])
    expect(fs.readFileSync(path.join(result.path, "logs", "worker_rank=0.log"), "utf8")).toMatch(/\S/)
    const dom = await dumpDom(path.join(result.path, "report.html"))
    // One chart per metric (loss with val_loss, accuracy with val_accuracy), the step split, the
    // straggler bars, and the throughput curve when the ranks sent progress far enough apart.
    expect(dom).toMatch(/<body[^>]*data-drawn="[45]"/)
    expect([...dom.matchAll(/data-metric="([^"]*)"/g)].map((m) => m[1])).toEqual(["loss", "accuracy"])
  })
})
