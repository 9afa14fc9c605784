// The GPU code path end to end on every machine: useGpu workers on the webgpu backend, run on a
// software adapter (the SwiftShader Vulkan driver of Debian's chromium package; support/
// swiftshader.ts) that GRADWIRE_WEBGPU_SOFTWARE=1 lets the embedded cluster's agent advertise as
// GPUs. Through the public API on 2 workers: the zoo's CNN on the all-reduce; the digits MLP with
// ZeRO-2, checkpointed and resumed (the optimizer state's hand-over, read asynchronously); local
// SGD, its two workers sharing one GPU; pipeline and tensor parallelism (each rank's part against
// the whole model trained on one worker, and a pipelined digits run whose merged checkpoint scores
// what it reported). Every data-parallel rank ends with the same weights; explain.txt says each rank
// ran webgpu. Without the opt-in, the same machine's agent refuses the software adapter and says how
// to accept it. And one job of a webgpu worker and a wasm worker (useGpu "auto") on two CLI-started
// agents, one of which has the (software) GPU.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { spawn, type ChildProcess } from "node:child_process"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset, type Result } from "../index.ts"
import { mergedAccuracy } from "./support/trainer-runs.ts"
import type { EquivalenceCase } from "./support/pipeline-loop.ts"
import { launchNatsServer, liveNatsServerPids } from "../core/nats-server.ts"
import { openNats } from "../core/connection.ts"
import { openClusterView } from "../scheduler/cluster-view.ts"
import { CLI } from "./support/actors-processes.ts"
import { probeWebGpu } from "../actors/node/node-probe.ts"
import { loadZooData } from "../examples/zoo/data.ts"
import { TASK_OF } from "../examples/zoo/models.ts"
import { swiftShaderEnv } from "./support/swiftshader.ts"

const ZOO = path.resolve("examples/zoo/train.ts") + "#zooLoop"
const DIGITS = path.resolve("examples/digits/train.ts") + "#trainLoop"
const PIPELINES = path.resolve("test/support/pipeline-loop.ts")
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

/** Every rank ran its backend (webgpu by default), and (data parallel: `sameWeights`) ended each epoch with rank 0's weights. */
const expectWebGpuRanks = async (r: Result, backends = ["webgpu", "webgpu"], sameWeights = true): Promise<void> => {
  if (sameWeights) for (const epoch of r.metricsPerRank) expect(new Set(epoch.map((m) => m.weights)).size).toBe(1)
  const explain = await fs.readFile(path.join(r.path, "explain.txt"), "utf8")
  backends.forEach((b, rank) => expect(explain).toContain(`rank ${rank}: backend ${b}`))
  // (Dawn's instance without zero-filled workgroup memory: core/webgpu.ts dawnFlags)
  if (backends.includes("webgpu")) expect(explain).toContain("Dawn does not zero-fill workgroup memory")
}

const digitsRun = (name: string, epochs: number, collectiveConfig: Record<string, unknown>, resourcesPerWorker?: { GPU: number }) =>
  new Trainer({
    trainLoopPerWorker: DIGITS,
    trainLoopConfig: { epochs, batchSize: 64 },
    scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu", ...(resourcesPerWorker ? { resourcesPerWorker } : {}) },
    collectiveConfig,
    runConfig: { name, storagePath: storage, progress: false },
    datasets: { train, test }
  }).fit()

describe("useGpu workers on the webgpu backend (SwiftShader)", { tags: ["webgpu"] }, () => {
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
      // Adam at 0.01 (the zoo's default for the CNN is 0.003): 12 steps then reach what 20 did,
      // and every step on the software adapter costs about half a second.
      trainLoopConfig: { model: "cnn", epochs: 2, maxStepsPerEpoch: 6, learningRate: 0.01 },
      scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu" },
      runConfig: { name: "webgpu-cnn", storagePath: storage, progress: false },
      datasets: { train: data.train, test: data.test }
    }).fit()
    expect(r.metricsHistory.length).toBe(2)
    const [first, last] = [r.metricsHistory[0]!, r.metricsHistory[1]!]
    expect(Number(last.loss)).toBeLessThan(Number(first.loss))
    // 12 steps of 2 x 32 digits: far above chance (10%).
    expect(Number(last.val_accuracy)).toBeGreaterThan(0.4)
    await expectWebGpuRanks(r)
  })

  it("ZeRO-2 trains, checkpoints and resumes on webgpu (the optimizer state read back asynchronously)", { timeout: 240_000 }, async () => {
    const first = await digitsRun("webgpu-zero", 1, { zeroStage: 2 })
    expect(first.metricsHistory.length).toBe(1)
    await expectWebGpuRanks(first)
    const resumed = await digitsRun("webgpu-zero", 2, { zeroStage: 2 })
    // The run picks up after the checkpoint's epoch: one more epoch, numbered 1, after the first fit()'s (0.92 after it,
    // as the all-reduce: the resumed Adam state is what gets it there).
    expect(resumed.metricsHistory.map((m) => Number(m.epoch))).toEqual([0, 1])
    expect(Number(resumed.metrics?.val_accuracy)).toBeGreaterThan(0.8)
    await expectWebGpuRanks(resumed)
  })

  it("local SGD trains on webgpu, its two workers sharing one GPU with resourcesPerWorker.GPU 0.5 (the embedded cluster's agent offers one)", { timeout: 240_000 }, async () => {
    const r = await digitsRun("webgpu-local-sgd", 2, { strategy: "local-sgd", localSgd: { syncEvery: 4 } }, { GPU: 0.5 })
    expect(r.metricsHistory.length).toBe(2)
    expect(Number(r.metrics?.val_accuracy)).toBeGreaterThan(0.8)
    await expectWebGpuRanks(r)
    // both ranks on GPU 0, which the node's agent had as its only GPU
    const explain = await fs.readFile(path.join(r.path, "explain.txt"), "utf8")
    expect(explain).toContain("rank 0: backend webgpu on GPU 0 (")
    expect(explain).toContain("rank 1: backend webgpu on GPU 0 (")
  })

  it("pipeline and tensor parallelism on webgpu: each rank's part trains as the whole model on one worker, and a pipelined run trains, checkpoints and merges", { timeout: 240_000 }, async () => {
    const cases: EquivalenceCase[] = [
      // cut by measured compute: the profile's timings read back asynchronously
      { name: "pp2", options: { stages: 2, schedule: "1f1b", microBatches: 3, balance: "compute" }, rows: 10, steps: 3 },
      { name: "tp2", options: { tensorParallel: 2 }, rows: 5, steps: 2 }
    ]
    const eq = await new Trainer({
      trainLoopPerWorker: `${PIPELINES}#equivalenceLoop`,
      trainLoopConfig: { cases },
      scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu" },
      runConfig: { name: "webgpu-pipeline-equivalence", storagePath: storage, progress: false }
    }).fit()
    const ranks = eq.metricsPerRank.at(-1)!
    for (const m of ranks) {
      for (const c of cases) {
        expect(m[`${c.name}/diff`], `${c.name} on rank ${String(m.rank)}`).toBeLessThan(2e-5)
        expect(m[`${c.name}/loss`] as number).toBeCloseTo(m[`${c.name}/ref_loss`] as number, 5)
      }
    }
    expect(ranks.map((m) => m["pp2/stage"])).toEqual([0, 1])
    await expectWebGpuRanks(eq, ["webgpu", "webgpu"], false)
    // The digits MLP as a 2-stage pipeline with pp.fit(), evaluated and checkpointed by both stages.
    const r = await new Trainer({
      trainLoopPerWorker: `${PIPELINES}#fitLoop`,
      trainLoopConfig: { epochs: 1, stages: 2 },
      scalingConfig: { numWorkers: 2, useGpu: true, backend: "webgpu" },
      runConfig: { name: "webgpu-pipeline", storagePath: storage, progress: false },
      datasets: { train, test }
    }).fit()
    const val = Number(r.metrics?.val_accuracy)
    expect(val).toBeGreaterThan(0.85)
    // the stage-sharded checkpoint merged into one model scores what the pipeline's evaluate reported
    expect(await mergedAccuracy(r.checkpoint!.path, test)).toBeCloseTo(val, 5)
    await expectWebGpuRanks(r, ["webgpu", "webgpu"], false)
  })

  it('useGpu "auto": one job of a webgpu worker (the agent with the GPU) and a wasm worker (the one without)', { timeout: 240_000 }, async () => {
    const server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
    const agents: ChildProcess[] = []
    const cluster = "mixed"
    const start = (node: string, args: string[], env: NodeJS.ProcessEnv): void => {
      const p = spawn(
        process.execPath,
        [CLI, "start", "--address", server.url, "--cluster", cluster, "--node-id", node, "--num-cpus", "2", "--block", "--state-dir", path.join(storage, node), ...args],
        { stdio: ["ignore", "ignore", "ignore"], env }
      )
      agents.push(p)
    }
    try {
      // "gpu" probes its backends and finds the software adapter (the opt-in is in its environment):
      // it advertises webgpu and one software GPU. "cpu" has wasm and cpu only, and no GPU.
      start("gpu", [], process.env)
      start("cpu", ["--backends", "wasm,cpu"], { ...process.env, GRADWIRE_WEBGPU_SOFTWARE: "0" })
      const conn = await openNats({ servers: server.url, name: "mixed test" })
      const view = await openClusterView({ nc: conn.nc, cluster })
      try {
        await view.waitFor((nodes) => nodes.filter((n) => n.state === "alive").length === 2 && view.resources().some((n) => n.backends.includes("webgpu")), 60_000)
        const gpuNode = view.resources().find((n) => n.nodeId === "gpu")!
        expect(gpuNode.gpus).toEqual([expect.objectContaining({ index: 0, software: true })])
        expect(view.resources().find((n) => n.nodeId === "cpu")!.gpus).toEqual([])
      } finally {
        view.close()
        await conn.close()
      }
      const r = await new Trainer({
        trainLoopPerWorker: DIGITS,
        trainLoopConfig: { epochs: 2, batchSize: 64 },
        scalingConfig: { numWorkers: 2, useGpu: "auto", placementStrategy: "SPREAD" },
        runConfig: { name: "webgpu-mixed", storagePath: storage, progress: false },
        cluster: { address: server.url, clusterName: cluster },
        datasets: { train, test }
      }).fit()
      expect(r.metricsHistory.length).toBe(2)
      expect(Number(r.metrics?.val_accuracy)).toBeGreaterThan(0.8)
      // Ranks in node order: "cpu" before "gpu".
      await expectWebGpuRanks(r, ["wasm", "webgpu"])
    } finally {
      for (const p of agents) if (p.exitCode === null && p.signalCode === null) p.kill("SIGKILL")
      await server.stop()
    }
  })
})
