// A run's history across restarts from a checkpoint and reruns that resume one: the report numbers
// count on from the checkpoint's, a round made again replaces the rows from it on in the Result,
// metrics.csv and report.html (metrics.jsonl keeps every row), and loadResult reads the same
// history back. FitRecord and RunRecorder on a temp directory, no cluster.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { FitRecord } from "../actors/train/driver/fit-record.ts"
import type { Resolved } from "../actors/train/driver/options.ts"
import { loadResult, readJsonLines } from "../actors/train/driver/result-files.ts"
import { currentLineage, RunRecorder } from "../actors/train/common/observe/run-recorder.ts"
import { ProgressPrinter } from "../actors/train/common/observe/progress.ts"
import { loopMetadata, runFactsOf, RUN_FACTS_KEY } from "../actors/train/common/train-protocol.ts"
import { decodeEvent, readTfRecords, type DecodedEvent } from "../actors/train/common/observe/tensorboard.ts"

let dir: string
beforeAll(() => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-history-"))
})
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

const open = async (runDir: string) => {
  const recorder = await RunRecorder.open(runDir, { name: "h" }, false)
  const cfg = { name: "h", runDir, callbacks: [], minWorkers: 2, maxWorkers: 2 } as unknown as Resolved
  return new FitRecord(cfg, recorder, new ProgressPrinter(false, 2))
}

/** A completed round of generation `attempt`: two ranks reporting `epoch`, tagged with the attempt. */
const round = (attempt: number, index: number, epoch: number) => ({
  attempt,
  index,
  metrics: [0, 1].map((rank) => ({ epoch, loss: 1 / (epoch + 1), made: `a${attempt}`, rank })),
  checkpoint: undefined,
  aux: {}
})

/** The loss steps TensorBoard shows: its reader drops the points at a SessionLog START's step and later (purge_orphaned_data). */
const tensorBoardSees = (events: ReadonlyArray<DecodedEvent>): number[] => {
  let kept: number[] = []
  for (const e of events) {
    if (e.sessionStatus === 1) kept = kept.filter((step) => step < e.step)
    else if (e.scalars.some((s) => s.tag === "loss")) kept.push(e.step)
  }
  return kept
}

const csvRows = (runDir: string) =>
  fs
    .readFileSync(path.join(runDir, "metrics.csv"), "utf8")
    .trim()
    .split("\n")
    .slice(1)
    .map((l) => l.split(","))

describe("a run's history", () => {
  it("keeps the rows the final weights descend from: a restart's rounds replace the first attempt's from the checkpoint on", async () => {
    const runDir = path.join(dir, "restarted")
    const record = await open(runDir)
    record.startsAt(0)
    for (let i = 0; i < 4; i++) record.round(round(0, i, i))
    // The restart resumes the checkpoint of report 1: its round 0 is report 2.
    record.startsAt(2)
    for (let i = 0; i < 3; i++) record.round(round(1, i, i + 2))
    expect(record.history.map((m) => [m.epoch, m.made])).toEqual([
      [0, "a0"],
      [1, "a0"],
      [2, "a1"],
      [3, "a1"],
      [4, "a1"]
    ])
    const result = await record.result({ location: undefined, latest: () => undefined, best: () => [] } as never, "finished", undefined, 0)
    expect(result.metricsPerRank.map((ranks) => ranks.map((m) => m.made))).toEqual([["a0", "a0"], ["a0", "a0"], ["a1", "a1"], ["a1", "a1"], ["a1", "a1"]])
    await record.recorder.close()
    // metrics.jsonl keeps every row, numbered by the run's report; metrics.csv the lineage.
    const rows = await readJsonLines(path.join(runDir, "metrics.jsonl"))
    expect(rows.map((r) => [r.report, r.made])).toEqual([
      [0, "a0"],
      [1, "a0"],
      [2, "a0"],
      [3, "a0"],
      [2, "a1"],
      [3, "a1"],
      [4, "a1"]
    ])
    const csv = csvRows(runDir)
    expect(csv.map((c) => c[0])).toEqual(["0", "1", "2", "3", "4"])
    expect(csv.slice(2).every((c) => c.includes("a1"))).toBe(true)
    // TensorBoard's steps are the report numbers (the restart's rounds write steps 2-4 again),
    // after a SessionLog START at step 2, so TensorBoard drops the first attempt's points 2 and 3.
    const tb = fs.readdirSync(runDir).find((f) => f.startsWith("events.out.tfevents."))!
    const events = readTfRecords(new Uint8Array(fs.readFileSync(path.join(runDir, tb)))).map(decodeEvent)
    const losses = events.filter((e) => e.scalars.some((s) => s.tag === "loss"))
    expect(losses.map((e) => e.step)).toEqual([0, 1, 2, 3, 2, 3, 4])
    expect(events.filter((e) => e.sessionStatus === 1).map((e) => e.step)).toEqual([0, 2])
    expect(tensorBoardSees(events)).toEqual([0, 1, 2, 3, 4])
    const back = await loadResult(runDir)
    expect(back.metricsHistory).toEqual(result.metricsHistory)
    expect(back.metricsPerRank).toEqual(result.metricsPerRank)
  })

  it("a rerun resuming its checkpoint of report 2 shows the earlier fit()'s rounds 0-2, then counts on from 3", async () => {
    const runDir = path.join(dir, "rerun")
    const first = await open(runDir)
    for (let i = 0; i < 5; i++) first.round(round(0, i, i))
    await first.result({ location: undefined, latest: () => undefined, best: () => [] } as never, "interrupted", undefined, 0)
    await first.recorder.close()

    const second = await open(runDir)
    const perRank = (await readJsonLines(path.join(runDir, "metrics_per_rank.jsonl"))).map((r) => ({ report: Number(r.report), ranks: r.ranks as Array<Record<string, unknown>> }))
    second.seed(await readJsonLines(path.join(runDir, "metrics.jsonl")), perRank, 3)
    second.startsAt(3)
    for (let i = 0; i < 3; i++) second.round({ ...round(0, i, i + 3), metrics: round(0, i, i + 3).metrics.map((m) => ({ ...m, made: "rerun" })) })
    const result = await second.result({ location: undefined, latest: () => undefined, best: () => [] } as never, "finished", undefined, 0)
    await second.recorder.close()
    expect(result.metricsHistory.map((m) => [m.epoch, m.made])).toEqual([
      [0, "a0"],
      [1, "a0"],
      [2, "a0"],
      [3, "rerun"],
      [4, "rerun"],
      [5, "rerun"]
    ])
    expect(result.metricsPerRank).toHaveLength(6)
    expect(result.metricsPerRank[0]!.map((m) => m.rank)).toEqual([0, 1])
    const reports = (await readJsonLines(path.join(runDir, "metrics.jsonl"))).map((r) => r.report)
    expect(reports).toEqual([0, 1, 2, 3, 4, 3, 4, 5])
    expect(csvRows(runDir).map((c) => c[0])).toEqual(["0", "1", "2", "3", "4", "5"])
    // TensorBoard reads the run directory's event files in name order: the rerun's START at 3 drops the first fit()'s 3 and 4.
    const events = fs
      .readdirSync(runDir)
      .filter((f) => f.startsWith("events.out.tfevents."))
      .sort()
      .flatMap((f) => readTfRecords(new Uint8Array(fs.readFileSync(path.join(runDir, f)))).map(decodeEvent))
    expect(tensorBoardSees(events)).toEqual([0, 1, 2, 3, 4, 5])
    // report.html marks where this fit() resumed.
    expect(fs.readFileSync(path.join(runDir, "report.html"), "utf8")).toContain('"label":"resumed"')
    expect((await loadResult(runDir)).metricsHistory).toEqual(result.metricsHistory)
  })

  it("currentLineage: a row supersedes every earlier row of its report number or later", () => {
    const n = (rows: number[]) => currentLineage(rows, (r) => r)
    expect(n([0, 1, 2, 3, 2, 3, 4])).toEqual([0, 1, 2, 3, 4])
    expect(n([0, 1, 2, 0, 1])).toEqual([0, 1])
    expect(n([0, 1, 2, 3, 4, 1, 2, 3, 2])).toEqual([0, 1, 2])
    expect(n([])).toEqual([])
  })

  it("keeps the driver's facts of a checkpoint apart from the loop's metadata", () => {
    const saved = { epoch: 3, round: "mine", worldSize: "the loop's", [RUN_FACTS_KEY]: { attempt: 1, round: 0, report: 4, worldSize: 3 } }
    expect(runFactsOf(saved)).toEqual({ attempt: 1, round: 0, report: 4, worldSize: 3 })
    expect(loopMetadata(saved)).toEqual({ epoch: 3, round: "mine", worldSize: "the loop's" })
    // A checkpoint saved before the facts moved under their key: its top-level worldSize.
    expect(runFactsOf({ epoch: 1, worldSize: 2 })).toEqual({ worldSize: 2 })
    expect(runFactsOf({ [RUN_FACTS_KEY]: "junk" })).toEqual({})
  })
})
