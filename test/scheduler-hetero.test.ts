// The scheduler inside a real Trainer run: heterogeneity-aware batching with one rank slowed by a
// simulated per-sample delay, and the automatic algorithm / compression choice written to the run
// directory. Real nats-server, agent and worker processes.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { allReduceAlgorithmNames } from "../collectives/algorithms/index.ts"

const LOOP = path.resolve("test/support/hetero-loop.ts") + "#heteroLoop"
let storage: string
let train: ArrayDataset

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-hetero-"))
  ;({ train } = trainTestSplit(await loadDigits(), 0.2, 7))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

describe("heterogeneity-aware batching and automatic choice in a Trainer run", () => {
  it("gives the slowed rank a smaller batch, keeps weights identical, reports it as a straggler and explains the plan", async () => {
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 3, globalBatchSize: 96, slowdown: { "1": 1.0 } },
      scalingConfig: { numWorkers: 3 },
      runConfig: { name: "hetero", storagePath: storage, progress: false },
      datasets: { train },
      collectiveConfig: { adaptiveBatching: true, compression: "auto" }
    }).fit()
    const last = r.metricsPerRank.at(-1)!
    expect(new Set(last.map((m) => m.weights)).size).toBe(1)
    const m = r.metrics!
    const batches = [0, 1, 2].map((i) => m[`batch/rank${i}`] as number)
    expect(batches.reduce((a, b) => a + b, 0)).toBe(96)
    // The slowed rank: less than an equal share, and no more than either other rank (a fast rank
    // measured slow under load beside this file can be tried at 0 rows too, hetero-batching.ts).
    expect(batches[1]).toBeLessThan(96 / 3)
    expect(batches[1]).toBeLessThanOrEqual(Math.min(batches[0], batches[2]))
    expect(m["batch/rebalances"] as number).toBeGreaterThanOrEqual(1)
    expect(m["straggler/rank1"] as number).toBeGreaterThan(1.5)
    expect(m["straggler/rank0"]).toBeUndefined()
    // Every rank ran the same number of steps: floor(N / B) per epoch.
    expect(new Set(last.map((x) => x.steps)).size).toBe(1)
    expect(last[0].steps).toBe(3 * Math.floor(train.size / 96))
    // The automatic choice is logged with its predicted times.
    const text = await fs.readFile(path.join(r.path, "explain.txt"), "utf8")
    expect(text).toMatch(/all-reduce plan: 3 rank\(s\)/)
    expect(text).toMatch(/compression: /)
    const json = JSON.parse(await fs.readFile(path.join(r.path, "explain.json"), "utf8"))
    expect(json.computeMs).toBeGreaterThan(0)
    // every registered all-reduce algorithm is predicted (the list is the registry's)
    expect(allReduceAlgorithmNames()).toContain(json.buckets[0].chosen)
    expect(Object.keys(json.buckets[0].predictedMs)).toEqual(allReduceAlgorithmNames())
    // The transport (collectiveConfig.transport "auto" by default): the workers of one machine
    // talk over Unix sockets, and the sizes measured decide which calls take them.
    expect(text).toMatch(/transport: auto - /)
    expect(text).toMatch(/measured \(median all-reduce ms, NATS vs direct\): 4 KiB /)
    expect(text).toMatch(/this rank sends to: rank 1 unix; rank 2 unix/)
    expect(json.transport.links.map((l: { via: string }) => l.via)).toEqual(["unix", "unix"])
    expect(json.transport.measured.rows).toHaveLength(3)
  }, 180_000)

  it.each([
    { slow: 1, fast: 0, zeroStage: 0 as const, accumulationSteps: 1, strategy: "allreduce" as const },
    { slow: 0, fast: 1, zeroStage: 2 as const, accumulationSteps: 1, strategy: "allreduce" as const },
    { slow: 1, fast: 0, zeroStage: 1 as const, accumulationSteps: 2, strategy: "allreduce" as const },
    { slow: 1, fast: 0, zeroStage: 0 as const, accumulationSteps: 1, strategy: "auto" as const },
    { slow: 0, fast: 1, zeroStage: 0 as const, accumulationSteps: 1, strategy: "local-sgd" as const }
  ])("leaves rank $slow without rows where its one row still holds every step back, and the group trains on with the same weights everywhere (ZeRO stage $zeroStage, $accumulationSteps micro-batch(es) a step, strategy $strategy)", async ({ slow, fast, zeroStage, accumulationSteps, strategy }) => {
    // The slow rank takes 40 ms more for any step with rows (a device's fixed cost per step): at
    // one row it still doubles the group's step, without rows it only takes part in the exchange.
    const epochs = 6 * accumulationSteps
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs, globalBatchSize: 64, accumulationSteps, stepDelay: { [String(slow)]: 40 } },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: `hetero-zero-${zeroStage}-${accumulationSteps}-${strategy}`, storagePath: storage, progress: false },
      datasets: { train },
      // (Local SGD: a round every 2 steps; the last step of the run ends one, so the ranks' weights meet there.)
      collectiveConfig: { adaptiveBatching: true, zeroStage, strategy, ...(strategy === "local-sgd" ? { localSgd: { syncEvery: 2 } } : {}) }
    }).fit()
    const last = r.metricsPerRank.at(-1)!
    expect(new Set(last.map((m) => m.weights)).size).toBe(1)
    // Alike by construction: the report rounds' state-parity checks (on the all-reduce, ZeRO's and
    // auto's) found nothing to repair.
    for (const h of r.metricsHistory) expect(h["gradwire/parity_repaired"]).toBeUndefined()
    const m = r.metrics!
    expect(m[`batch/rank${fast}`]).toBe(64)
    expect(m[`batch/rank${slow}`]).toBe(0)
    // Still named a straggler, at the throughput it had with rows.
    expect(m[`straggler/rank${slow}`] as number).toBeGreaterThan(1.5)
    expect(m[`straggler/rank${fast}`]).toBeUndefined()
    // Every rank ran every step (the one without rows in the exchange with nothing), and training went on.
    expect(new Set(last.map((x) => x.steps)).size).toBe(1)
    expect(last[0].steps).toBe(epochs * Math.floor(train.size / (64 * accumulationSteps)))
    expect(Number.isFinite(last[0].loss as number)).toBe(true)
    expect(last[0].loss as number).toBeLessThan(r.metricsPerRank[0]![0]!.loss as number)
    if (strategy === "auto") {
      // Strategy "auto" stays on the all-reduce while a rank has no rows, and says why.
      expect(m.strategy).toBe("allreduce")
      expect(m["strategy/switches"]).toBe(0)
      expect(await fs.readFile(path.join(r.path, "explain.txt"), "utf8")).toMatch(/strategy: allreduce \(kept\); adaptive batching gives rank 1 no rows/)
    }
  }, 180_000)
})
