// Ranks whose loops make different collective calls (one rank takes a step more than the others
// before a report, as with shards of unequal size cut without care) fail the run at once with a
// "call-mismatch" that says where each rank's loop was, and no restart, also with maxFailures -1:
// a restart would meet the same mismatch. Before, the rank the first mismatch named was taken for
// dead, the group went on without it, and the next regroup met the same loop again.
// Real nats-server, real agent and worker processes.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, TrainingFailed, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { readEvents } from "./support/trainer-runs.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"

const STEP_LOOP = path.resolve("test/support/step-loop.ts") + "#stepLoop"
let storage: string
let train: ArrayDataset
let test: ArrayDataset

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-mismatch-"))
  ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

/** The step loop run with `loopConfig` on `workers` workers under maxFailures -1, which must fail: its TrainingFailed. */
const failsWithNoLimit = async (name: string, loopConfig: Record<string, unknown>, workers: number): Promise<TrainingFailed> => {
  const e = await new Trainer({
    trainLoopPerWorker: STEP_LOOP,
    trainLoopConfig: loopConfig,
    scalingConfig: { numWorkers: workers },
    runConfig: { name, storagePath: storage, progress: false, failureConfig: { maxFailures: -1 } },
    datasets: { train, test }
  })
    .fit()
    .then(
      () => new Error(`fit() resolved, but run "${name}" was to fail`),
      (err: unknown) => err
    )
  expect(e).toBeInstanceOf(TrainingFailed)
  return e as TrainingFailed
}

describe("ranks whose loops call different collectives", () => {
  it("fail the run as a call-mismatch naming each rank's place, with no restart under maxFailures -1", { timeout: 120_000 }, async () => {
    const failed = await failsWithNoLimit("mismatch", { epochs: 3, batchSize: 64, extraStep: { rank: 1, epoch: 1 } }, 2)
    expect(failed.kind, failed.message).toBe("call-mismatch")
    expect(failed.message).toMatch(/not retryable/)
    // rank 1 in its extra step, one past the epoch's steps; rank 0 in the next report, after those steps
    const inStep = /rank 1 in training step (\d+) since report\(\) call 1/.exec(failed.message)
    const inReport = /rank 0 in report\(\) call 2, after (\d+) training step\(s\) since report\(\) call 1/.exec(failed.message)
    expect(inStep, failed.message).not.toBeNull()
    expect(inReport, failed.message).not.toBeNull()
    expect(Number(inStep![1])).toBe(Number(inReport![1]) + 1)
    expect(Number(inReport![1])).toBeGreaterThan(0)
    expect(failed.message).toMatch(/the same number of dp\.trainStep\(\) calls between two report\(\) calls/)
    // epoch 0 completed, then the run ended without a restart or a regroup
    expect(failed.result.metricsHistory.map((m) => m.epoch)).toEqual([0])
    expect(failed.result.restarts).toBe(0)
    expect(failed.result.resizes).toEqual([])
    const events = await readEvents(failed.result.path)
    expect(events.filter((x) => x.type === "restart" || x.type === "resize")).toEqual([])
    expect(events.filter((x) => x.type === "failure").map((x) => [(x.failure as { kind: string }).kind, (x.decision as { action: string }).action])).toEqual([["call-mismatch", "fail"]])
  })

  it("a rank whose loop returns before the others' fails the run as a call-mismatch, not as a death, with no restart under maxFailures -1", { timeout: 120_000 }, async () => {
    const failed = await failsWithNoLimit("returns-early", { epochs: 4, batchSize: 64, returnEarly: { rank: 1, epochs: 2 } }, 3)
    // Before: "rank 1 stopped taking part in collectives" (died), and the group went on without it.
    expect(failed.kind, failed.message).toBe("call-mismatch")
    expect(failed.message).toMatch(/rank 1's loop returned \(after 2 report\(\) call\(s\)\) while rank [02]'s went on making collective calls \(rank [02] in training step 1 since report\(\) call 2\)/)
    expect(failed.result.restarts).toBe(0)
    expect(failed.result.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    const events = await readEvents(failed.result.path)
    expect(events.filter((x) => x.type === "restart" || x.type === "resize")).toEqual([])
  })
})
