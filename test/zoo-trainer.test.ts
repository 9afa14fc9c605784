// The model zoo (examples/zoo) through the public API on 2 workers of the embedded cluster, on the
// default backend (wasm, with gradwire's kernels): the CNN, the residual CNN with batch norm, the
// embedding model, the transformer and the LSTM each train (held-out accuracy well above chance
// after a short run), every rank ends with the same trainable weights, and explain.txt names each rank's
// backend and that no kernel ran on the cpu fallback.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { TASK_OF, type ZooModel } from "../examples/zoo/models.ts"
import { loadEngine } from "../core/engine.ts"
import { fallbackKernelsUsed } from "../core/kernels/fallback.ts"
import { patchStats, winogradStats } from "../core/kernels/conv2d.ts"
import { plainZooStep } from "../bench/zoo-step.ts"

const LOOP = path.resolve("examples/zoo/train.ts") + "#zooLoop"
let storage = ""

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-zoo-"))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

/**
 * Chance level is 10% for the digits; the tagging task's most frequent tag is about 15% of the words.
 * The models start from unseeded initial weights, except the LSTM's: unseeded, its accuracy after
 * 300 steps ranged 0.23-0.42 over CI runs (one failed at 0.228); seeded, three runs here ended at
 * 0.413. It is held to 0.25, still 10 points over the most frequent tag. MobileNet's start is seeded
 * too (the zoo loop's `seed`): unseeded, it ended 3 epochs at 0.80-0.82 in two CI runs and at 0.496
 * in a third; seeds 1-3 gave 0.805, 0.877 and 0.755, and seed 2 gave 0.877 again (a seeded run repeats).
 */
const cases: ReadonlyArray<{ model: ZooModel; epochs: number; steps?: number; above: number; seed?: number }> = [
  { model: "cnn", epochs: 3, above: 0.6 },
  { model: "resnet", epochs: 3, above: 0.5 },
  { model: "resnet28", epochs: 3, above: 0.5 },
  { model: "mobilenet", epochs: 3, above: 0.5, seed: 2 },
  { model: "embedding", epochs: 3, above: 0.25 },
  { model: "transformer", epochs: 1, steps: 60, above: 0.4 },
  { model: "lstm", epochs: 1, steps: 300, above: 0.25 },
  { model: "gru", epochs: 1, steps: 150, above: 0.3 }
]

describe("the model zoo trains on 2 workers on the default backend", () => {
  for (const c of cases) {
    it(c.model, { timeout: 180_000 }, async () => {
      const data = await loadZooData(TASK_OF[c.model], { files: 60 })
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { model: c.model, epochs: c.epochs, ...(c.steps ? { maxStepsPerEpoch: c.steps } : {}), ...(data.text ? { text: data.text } : {}), ...(c.seed !== undefined ? { seed: c.seed } : {}) },
        scalingConfig: { numWorkers: 2 },
        runConfig: { name: `zoo-${c.model}`, storagePath: storage, progress: false },
        datasets: { train: data.train, test: data.test }
      }).fit()
      expect(r.metricsHistory.length).toBe(c.epochs)
      console.log(`zoo ${c.model}: val_accuracy ${String(r.metrics?.val_accuracy)}`)
      expect(Number(r.metrics?.val_accuracy)).toBeGreaterThan(c.above)
      expect(new Set(r.metricsPerRank.at(-1)!.map((m) => m.weights)).size).toBe(1)
      const explain = await fs.readFile(path.join(r.path, "explain.txt"), "utf8")
      for (const rank of [0, 1]) expect(explain).toContain(`rank ${rank}: backend wasm`)
      expect(explain).toContain("ran on the cpu-backend fallback (slow path): none")
    })
  }
})

// resnet18 (11.2 M parameters, about a second a step on a core) in this process rather than on 2
// workers, for CI's time (a worker whose event loop a long computation holds is covered by
// test/busy-worker.test.ts). Two plain training steps: its 512-channel 3x3 convolutions as
// Winograd's, its strided and 1x1 shortcut convolutions as patch matrices, no kernel on the cpu
// fallback.
describe("resnet18 on the default backend", () => {
  it("trains a step on the fast paths (Winograd at 512 channels, strided convolutions as patch matrices), none on the cpu fallback", { timeout: 120_000 }, async () => {
    const { tf } = await loadEngine("wasm")
    const before = { winograd: winogradStats.calls + winogradStats.filterGrads, patches: patchStats.calls + patchStats.filterGrads, fallback: fallbackKernelsUsed().length }
    const zoo = await plainZooStep(tf, "resnet18", 8)
    try {
      await zoo.step()
      await zoo.step()
    } finally {
      zoo.dispose()
    }
    expect(winogradStats.calls + winogradStats.filterGrads - before.winograd).toBeGreaterThanOrEqual(2 * 3 * 12)
    expect(patchStats.calls + patchStats.filterGrads - before.patches).toBeGreaterThanOrEqual(2 * 2 * 6)
    expect(fallbackKernelsUsed().length).toBe(before.fallback)
  })
})
