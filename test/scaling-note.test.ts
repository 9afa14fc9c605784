// Whether a group's workers pay for their exchange: once per run, at its second report round, the
// driver says so when a step's exchange takes longer than the computation the other workers take
// off one worker (their samples a second then fall below one worker's). scalingNote is pure; the
// FitRecord case runs it on a RunRecorder over a temp directory, fed the ranks' step times as the
// workers' progress messages carry them.
import { afterAll, describe, expect, it } from "vitest"
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { FitRecord, scalingNote } from "../actors/train/driver/fit-record.ts"
import type { Resolved } from "../actors/train/driver/options.ts"
import { readJsonLines } from "../actors/train/driver/result-files.ts"
import { RunRecorder } from "../actors/train/common/observe/run-recorder.ts"
import { ProgressPrinter } from "../actors/train/common/observe/progress.ts"

const dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-scaling-"))
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

/** `steps` steps of every one of `p` ranks, each `compute` ms computing and `comm` ms exchanging. */
const window = (p: number, steps: number, compute: number, comm: number) => ({ compute: p * steps * compute, comm: p * steps * comm, wait: 0, n: p * steps })

describe("scalingNote", () => {
  it("speaks when a step's exchange outweighs the computation the other workers take off one worker", () => {
    // 2 workers, 1 ms computing and 3 ms exchanging: 2 x 1 / (1 + 3) = half of one worker's pace
    const note = scalingNote(2, window(2, 50, 1, 3))
    expect(note?.text).toMatch(/^the 2 workers spend 3\.0 ms a step exchanging gradients \(with the wait for the slowest rank\) against 1\.0 ms computing: they train about 50% of one worker's samples a second here \(a step.s computation is short for the gradients it exchanges\)/)
    expect(note?.text).toMatch(/a larger batch per worker, fewer workers or gradient compression \(collectiveConfig\.compression\) would pay$/)
    expect(note?.figures).toEqual({ workers: 2, computeMs: 1, exchangeMs: 3, ofOneWorker: 0.5 })
    // 4 workers: an exchange up to 3 x the compute still pays (4 x 1 / (1 + 3) = 1)
    expect(scalingNote(4, window(4, 50, 1, 3))).toBeUndefined()
    expect(scalingNote(4, window(4, 50, 1, 3.5))?.figures.ofOneWorker).toBe(0.89)
  })

  it("says nothing for one worker, too few steps, or no computation measured", () => {
    expect(scalingNote(1, window(1, 50, 1, 3))).toBeUndefined()
    expect(scalingNote(2, window(2, 19, 1, 3))).toBeUndefined()
    expect(scalingNote(2, window(2, 50, 0, 3))).toBeUndefined()
    expect(scalingNote(2, { compute: 0, comm: 0, wait: 0, n: 0 })).toBeUndefined()
  })
})

describe("FitRecord", () => {
  const open = async (name: string) => {
    const runDir = path.join(dir, name)
    const recorder = await RunRecorder.open(runDir, { name }, false)
    const cfg = { name, runDir, callbacks: [], minWorkers: 2, maxWorkers: 2 } as unknown as Resolved
    const record = new FitRecord(cfg, recorder, new ProgressPrinter(false, 2))
    record.startsAt(0)
    return { runDir, record }
  }
  const round = (attempt: number, index: number) => ({ attempt, index, metrics: [0, 1].map((rank) => ({ epoch: index, rank })), checkpoint: undefined, aux: {} })
  /** 30 steps of both ranks: [step, forward-backward, exchange, apply, wait] ms. */
  const steps = (record: FitRecord, attempt: number, fb: number, comm: number) => {
    for (const rank of [0, 1]) record.recorder.stepTimes(attempt, rank, Array.from({ length: 30 }, (_, step) => [step, fb, comm, 0.5, 0]))
  }
  const said = async (runDir: string, record: FitRecord) => {
    await record.recorder.close()
    return (await readJsonLines(path.join(runDir, "events.jsonl"))).filter((e) => e.type === "scaling")
  }

  it("says it once, at the second report round, from that round's steps (the first holds the warm-up and the tuning)", async () => {
    const { runDir, record } = await open("slow-exchange")
    steps(record, 0, 1, 10) // warm-up: left out
    record.round(round(0, 0))
    steps(record, 0, 1.5, 4.5)
    record.round(round(0, 1))
    steps(record, 0, 1.5, 4.5)
    record.round(round(0, 2))
    expect(await said(runDir, record)).toEqual([expect.objectContaining({ round: 1, workers: 2, computeMs: 2, exchangeMs: 4.5, ofOneWorker: 0.62 })])
  })

  it("says nothing where the exchange pays, nor after a restart (its steps may hold the regroup)", async () => {
    const fast = await open("fast-exchange")
    for (let i = 0; i < 3; i++) {
      steps(fast.record, 0, 3, 1)
      fast.record.round(round(0, i))
    }
    expect(await said(fast.runDir, fast.record)).toEqual([])
    const restarted = await open("restarted")
    steps(restarted.record, 0, 1, 10)
    restarted.record.round(round(0, 0))
    for (let i = 0; i < 3; i++) {
      steps(restarted.record, 1, 1, 10)
      restarted.record.round(round(1, i))
    }
    expect(await said(restarted.runDir, restarted.record)).toEqual([])
  })
})
