// What the Trainer's end-to-end tests share: runs of the digits example on the embedded cluster in a
// temp storage path (removed after the file, with no nats-server left running), and what they
// check of a run: every rank's last weights (the digits loop reports a hash of them), and the run
// directory's events.jsonl.
import { afterAll, beforeAll, expect } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, loadEngine, loadPipelineCheckpoint, trainTestSplit, type ArrayDataset, type Result } from "../../index.ts"
import { liveNatsServerPids } from "../../core/nats-server.ts"

const DIGITS_LOOP = path.resolve("examples/digits/train.ts") + "#trainLoop"

export interface DigitsRuns {
  /** The storage path of the file's runs, and the digits split (80/20, seed 7); set in beforeAll. */
  readonly storage: string
  readonly train: ArrayDataset
  readonly test: ArrayDataset
  /** Trainer.fit() of examples/digits/train.ts (3 workers unless given). */
  fit(name: string, loopConfig: Record<string, unknown>, collectiveConfig: Record<string, unknown>, extra?: { runConfig?: object; workers?: number }): Promise<Result>
}

/** Registers the file's beforeAll/afterAll (call it at the top level of a test file). */
export const digitsTrainerRuns = (prefix: string): DigitsRuns => {
  let storage = ""
  let train: ArrayDataset
  let test: ArrayDataset
  beforeAll(async () => {
    storage = await fs.mkdtemp(path.join(os.tmpdir(), prefix))
    ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
  })
  afterAll(async () => {
    await fs.rm(storage, { recursive: true, force: true })
    expect(liveNatsServerPids()).toEqual([])
  })
  return {
    get storage() {
      return storage
    },
    get train() {
      return train
    },
    get test() {
      return test
    },
    fit: (name, loopConfig, collectiveConfig, extra = {}) =>
      new Trainer({
        trainLoopPerWorker: DIGITS_LOOP,
        trainLoopConfig: loopConfig,
        scalingConfig: { numWorkers: extra.workers ?? 3 },
        runConfig: { name, storagePath: storage, progress: false, ...extra.runConfig },
        datasets: { train, test },
        collectiveConfig
      }).fit()
  }
}

/** Whether every rank reported the same weights in the last round. */
export const sameWeights = (r: Result): boolean => new Set(r.metricsPerRank.at(-1)!.map((m) => m.weights)).size === 1

/** The run's events.jsonl, one object per line. */
export const readEvents = async (dir: string): Promise<Array<Record<string, unknown>>> =>
  (await fs.readFile(path.join(dir, "events.jsonl"), "utf8"))
    .trim()
    .split("\n")
    .map((l) => JSON.parse(l) as Record<string, unknown>)

/**
 * A run with stale gradients (async or SSP parameter servers) converged: its best epoch from the
 * third on above 0.85 and its last above 0.7 (chance is 0.1). Its val_accuracy moves by up to 0.15
 * from one epoch to the next (0.94 -> 0.79 in a CI run under load), so one epoch's figure against
 * one threshold would fail by chance; parameters gone wrong pull every later epoch down.
 */
export const expectStaleConverged = (r: Result): void => {
  const acc = r.metricsHistory.map((m) => m.val_accuracy as number)
  expect(Math.max(...acc.slice(2))).toBeGreaterThan(0.85)
  expect(acc.at(-1)!).toBeGreaterThan(0.7)
}

/**
 * The held-out accuracy of a digits pipeline checkpoint merged into one model, scored in this
 * process (its engine: wasm), as the pipeline's evaluate scores it.
 */
export const mergedAccuracy = async (checkpointPath: string, test: ArrayDataset): Promise<number> => {
  const { tf } = await loadEngine("auto")
  const model = await loadPipelineCheckpoint(tf, checkpointPath)
  const pred = tf.tidy(() => (model.predict(tf.tensor2d(test.x, [test.size, 64])) as import("@tensorflow/tfjs").Tensor).argMax(-1).dataSync())
  let correct = 0
  for (let i = 0; i < test.size; i++) if (pred[i] === test.y[i]) correct++
  return correct / test.size
}
