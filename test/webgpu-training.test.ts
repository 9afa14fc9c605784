// The GPU code path end to end on every machine: useGpu workers on the webgpu backend, run on a
// software adapter (the SwiftShader Vulkan driver of Debian's chromium package; support/
// swiftshader.ts) that GRADWIRE_WEBGPU_SOFTWARE=1 lets the embedded cluster's agent advertise as
// GPUs. Through the public API on 2 workers: the zoo's CNN on the all-reduce; the digits MLP with
// ZeRO-2, checkpointed and resumed (the optimizer state's hand-over, read asynchronously); local
// SGD. Every rank ends with the same weights; explain.txt says each rank ran webgpu. Without the
// opt-in, the same machine's agent refuses the software adapter and says how to accept it.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset, type Result } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { probeWebGpu } from "../actors/node/node-probe.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { TASK_OF } from "../examples/zoo/models.ts"
import { swiftShaderEnv } from "./support/swiftshader.ts"

const ZOO = path.resolve("examples/zoo/train.ts") + "#zooLoop"
const DIGITS = path.resolve("examples/digits/train.ts") + "#trainLoop"
let storage = ""
let train: ArrayDataset
let test: ArrayDataset

beforeAll(async () => {
  // Workers and the probe's children inherit this process's environment.
  Object.assign(process.env, swiftShaderEnv())
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-webgpu-"))
  ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

/** Every rank ran webgpu, and ended each epoch with rank 0's weights. */
const expectWebGpuRanks = async (r: Result): Promise<void> => {
  for (const epoch of r.metricsPerRank) expect(new Set(epoch.map((m) => m.weights)).size).toBe(1)
  const explain = await fs.readFile(path.join(r.path, "explain.txt"), "utf8")
  for (const rank of [0, 1]) expect(explain).toContain(`rank ${rank}: backend webgpu`)
}

const digitsRun = (name: string, epochs: number, collectiveConfig: Record<string, unknown>) =>
  new Trainer({
    trainLoopPerWorker: DIGITS,
    trainLoopConfig: { epochs, batchSize: 64 },
    scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu" },
    collectiveConfig,
    runConfig: { name, storagePath: storage, progress: false },
    datasets: { train, test }
  }).fit()

describe("useGpu workers on the webgpu backend (SwiftShader)", () => {
  it("the probe refuses the software adapter without GRADWIRE_WEBGPU_SOFTWARE=1 and takes it with", async () => {
    process.env.GRADWIRE_WEBGPU_SOFTWARE = "0"
    try {
      const refused = await probeWebGpu()
      expect(refused.ok).toBe(false)
      expect(refused.adapter?.software).toBe(true)
      expect(refused.error).toMatch(/software rasterizer, not a GPU .*GRADWIRE_WEBGPU_SOFTWARE=1/)
    } finally {
      process.env.GRADWIRE_WEBGPU_SOFTWARE = "1"
    }
    const taken = await probeWebGpu()
    expect(taken.ok, taken.error).toBe(true)
    expect(taken.adapter?.software).toBe(true)
  })

  it("the zoo's CNN trains on 2 webgpu workers (all-reduce)", { timeout: 240_000 }, async () => {
    const data = await loadZooData(TASK_OF.cnn)
    const r = await new Trainer({
      trainLoopPerWorker: ZOO,
      trainLoopConfig: { model: "cnn", epochs: 2, maxStepsPerEpoch: 10 },
      scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu" },
      runConfig: { name: "webgpu-cnn", storagePath: storage, progress: false },
      datasets: { train: data.train, test: data.test }
    }).fit()
    expect(r.metricsHistory.length).toBe(2)
    const [first, last] = [r.metricsHistory[0]!, r.metricsHistory[1]!]
    expect(Number(last.loss)).toBeLessThan(Number(first.loss))
    // 20 steps of 2 x 32 digits: far above chance (10%).
    expect(Number(last.val_accuracy)).toBeGreaterThan(0.4)
    await expectWebGpuRanks(r)
  })

  it("ZeRO-2 trains, checkpoints and resumes on webgpu (the optimizer state read back asynchronously)", { timeout: 240_000 }, async () => {
    const first = await digitsRun("webgpu-zero", 2, { zeroStage: 2 })
    expect(first.metricsHistory.length).toBe(2)
    await expectWebGpuRanks(first)
    const resumed = await digitsRun("webgpu-zero", 3, { zeroStage: 2 })
    // The run picks up after the checkpoint's epoch: one more epoch, numbered 2.
    expect(resumed.metricsHistory.map((m) => Number(m.epoch))).toEqual([2])
    expect(Number(resumed.metrics?.val_accuracy)).toBeGreaterThan(0.8)
    await expectWebGpuRanks(resumed)
  })

  it("local SGD trains on webgpu", { timeout: 240_000 }, async () => {
    const r = await digitsRun("webgpu-local-sgd", 2, { strategy: "local-sgd", localSgd: { syncEvery: 4 } })
    expect(r.metricsHistory.length).toBe(2)
    expect(Number(r.metrics?.val_accuracy)).toBeGreaterThan(0.8)
    await expectWebGpuRanks(r)
  })
})
