// ZeRO through the Trainer: real embedded nats-server, real worker processes, the digits example
// unchanged (rank 0 checkpoints, every rank's optimizer shard rides on its report). A worker
// killed mid-epoch restarts the group from the checkpoint (no survivor holds the lost shard), and
// a run resumed with another number of workers re-shards the saved optimizer state.
import { describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { Trainer, type Result } from "../index.ts"
import { ConfigError } from "../core/errors.ts"
import { digitsTrainerRuns, sameWeights } from "./support/trainer-runs.ts"

const runs = digitsTrainerRuns("gw-zero-trainer-")

const fit = (name: string, workers: number, loopConfig: Record<string, unknown>, extra: { runConfig?: object; collectiveConfig?: object } = {}): Promise<Result> =>
  runs.fit(name, loopConfig, { zeroStage: 2, ...extra.collectiveConfig }, { workers, ...(extra.runConfig ? { runConfig: extra.runConfig } : {}) })

const shardsIn = async (dir: string): Promise<string[]> => (await fs.readdir(dir)).filter((f) => f.startsWith("optimizer.shard-")).sort()

describe("ZeRO in the Trainer", () => {
  it("survives a killed worker through the checkpoint and resumes at another world size, re-sharding the optimizer state", async () => {
    const first = await fit("zero", 3, { epochs: 3, fail: { how: "kill", rank: 1, epoch: 2, step: 3 } }, { runConfig: { failureConfig: { maxFailures: 1 } } })
    expect(first.restarts).toBe(1)
    expect(first.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(sameWeights(first)).toBe(true)
    expect(await shardsIn(first.checkpoint!.path)).toEqual([0, 1, 2].map((r) => `optimizer.shard-${r}-of-3.msgpack`))
    expect(await fs.readdir(first.checkpoint!.path)).not.toContain("optimizer.bin")

    const second = await fit("zero", 2, { epochs: 6 })
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([3, 4, 5])
    expect(sameWeights(second)).toBe(true)
    expect(await shardsIn(second.checkpoint!.path)).toEqual([0, 1].map((r) => `optimizer.shard-${r}-of-2.msgpack`))
    // Adam went on from the re-sharded moments: training keeps improving and ends accurate.
    const acc = second.metrics!.val_accuracy as number
    expect(acc).toBeGreaterThan(0.9)
    expect(second.metrics!.loss as number).toBeLessThan(first.metrics!.loss as number)
  })

  it("trains with heterogeneity-aware batches (unequal per-rank batches, weighted gradients) at stage 2", async () => {
    const r = await new Trainer({
      trainLoopPerWorker: path.resolve("test/support/hetero-loop.ts") + "#heteroLoop",
      trainLoopConfig: { epochs: 3, globalBatchSize: 96, slowdown: { "1": 1.5 } },
      scalingConfig: { numWorkers: 3 },
      runConfig: { name: "zero-hetero", storagePath: runs.storage, progress: false },
      datasets: { train: runs.train },
      collectiveConfig: { zeroStage: 2, adaptiveBatching: true }
    }).fit()
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(sameWeights(r)).toBe(true)
    const m = r.metrics!
    const batches = [0, 1, 2].map((i) => m[`batch/rank${i}`] as number)
    expect(batches.reduce((a, b) => a + b, 0)).toBe(96)
    // The slowed rank got the smallest share.
    expect(batches[1]).toBeLessThan(Math.min(batches[0]!, batches[2]!))
    expect(r.metricsHistory.at(-1)!.loss as number).toBeLessThan(r.metricsHistory[0]!.loss as number)
  })

  it("rejects what ZeRO cannot do, before starting anything, saying what to use instead", async () => {
    const err = async (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e)
    const e1 = await err(fit("bad1", 2, { epochs: 1 }, { collectiveConfig: { compression: { type: "topk", ratio: 0.01 } } }))
    expect(e1).toBeInstanceOf(ConfigError)
    expect(String(e1)).toMatch(/zeroStage 1 with compression/)
    const e2 = await err(fit("bad2", 2, { epochs: 1 }, { runConfig: { failureConfig: { recoverFrom: "peers" } } }))
    expect(e2).toBeInstanceOf(ConfigError)
    expect(String(e2)).toMatch(/recoverFrom/)
    const e3 = await err(fit("bad3", 2, { epochs: 1 }, { collectiveConfig: { zeroStage: 3 } }))
    expect(e3).toBeInstanceOf(ConfigError)
    expect(String(e3)).toMatch(/zeroStage/)
  })
})
