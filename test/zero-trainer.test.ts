// ZeRO through the Trainer: real embedded nats-server, real worker processes, the digits example
// unchanged (rank 0 checkpoints, every rank's optimizer shard rides on its report). With
// recoverFrom "checkpoint" a worker killed mid-epoch restarts the group from the checkpoint, and a
// run resumed with another number of workers re-shards the saved optimizer state. By default (at
// stage 1 and 2) the survivors regroup from their shards and the replicas of their predecessors'.
import { describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, type Result } from "../index.ts"
import { ConfigError } from "../core/errors.ts"
import { digitsTrainerRuns, readEvents, sameWeights } from "./support/trainer-runs.ts"
import { makeHold } from "./support/hold.ts"

const runs = digitsTrainerRuns("gw-zero-trainer-")
// The digits example's loop; with `holdFile` a short group's steps are slowed until it is whole again.
const CHAOS = path.resolve("test/support/chaos-loop.ts") + "#trainLoop"

const fit = (name: string, workers: number, loopConfig: Record<string, unknown>, extra: { runConfig?: object; collectiveConfig?: object } = {}): Promise<Result> =>
  runs.fit(name, loopConfig, { zeroStage: 2, ...extra.collectiveConfig }, { workers, ...(extra.runConfig ? { runConfig: extra.runConfig } : {}) })

const shardsIn = async (dir: string): Promise<string[]> => (await fs.readdir(dir)).filter((f) => f.startsWith("optimizer.shard-")).sort()

describe("ZeRO in the Trainer", () => {
  it("survives a killed worker through the checkpoint (recoverFrom \"checkpoint\") and resumes at another world size, re-sharding the optimizer state", { tags: ["faults"] }, async () => {
    const first = await fit("zero", 3, { epochs: 3, fail: { how: "kill", rank: 1, epoch: 2, step: 3 } }, { runConfig: { failureConfig: { maxFailures: 1, recoverFrom: "checkpoint" } } })
    expect(first.restarts).toBe(1)
    expect((await readEvents(first.path)).find((e) => e.type === "restart")).toMatchObject({ recovery: "checkpoint" })
    expect(first.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(sameWeights(first)).toBe(true)
    expect(await shardsIn(first.checkpoint!.path)).toEqual([0, 1, 2].map((r) => `optimizer.shard-${r}-of-3.msgpack`))
    expect(await fs.readdir(first.checkpoint!.path)).not.toContain("optimizer.bin")

    const second = await fit("zero", 2, { epochs: 6 })
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4, 5])
    expect(sameWeights(second)).toBe(true)
    expect(await shardsIn(second.checkpoint!.path)).toEqual([0, 1].map((r) => `optimizer.shard-${r}-of-2.msgpack`))
    // Adam went on from the re-sharded moments: training keeps improving and ends accurate.
    const acc = second.metrics!.val_accuracy as number
    expect(acc).toBeGreaterThan(0.9)
    expect(second.metrics!.loss as number).toBeLessThan(first.metrics!.loss as number)
  })

  for (const stage of [1, 2] as const) {
    it(`stage ${stage} regroups from the survivors: the lost rank's optimizer shard comes from its successor's replica${stage === 2 ? " (stepped from the reduced segment its predecessor sends it)" : ""}, the replacement re-shards it as it joins, and the checkpoints it then writes resume`, { tags: ["faults"] }, async () => {
      // A short group's steps are slowed while the hold file says 3 (hold.ts), so that the
      // replacement joins before the run ends: the kill in epoch 2 of 6 leaves 56 held steps
      // (14 s) for it to start, where another test file's workers load the cores (4 epochs left
      // 7.6 s, which a standby beside the parameter-server suite's workers did not make).
      const { dir: pidDir, holdFile } = await makeHold(os.tmpdir(), `gw-zero${stage}-`, 3)
      const first = await new Trainer({
        trainLoopPerWorker: CHAOS,
        trainLoopConfig: { epochs: 6, fail: { how: "kill", rank: 1, epoch: 2, step: 3 }, pidDir, holdFile },
        scalingConfig: { numWorkers: 3 },
        collectiveConfig: { zeroStage: stage },
        runConfig: { name: `zero${stage}-peers`, storagePath: runs.storage, progress: false, failureConfig: { maxFailures: 1 } },
        datasets: { train: runs.train, test: runs.test }
      }).fit()
      await fs.rm(pidDir, { recursive: true, force: true })
      expect(first.restarts).toBe(1)
      expect(first.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4, 5])
      expect(sameWeights(first)).toBe(true)
      const events = await readEvents(first.path)
      // (On a failure, the message carries every restart, resize and grow event with its reason.)
      const regroups = JSON.stringify(events.filter((e) => ["restart", "grow", "resize", "resize-requested", "resize-from-checkpoint"].includes(String(e.type))))
      expect(events.find((e) => e.type === "restart"), regroups).toMatchObject({ recovery: "peers", survivors: 2, joiners: 0 })
      expect(events.find((e) => e.type === "grow"), regroups).toMatchObject({ recovery: "peers", survivors: 2, joiners: 1 })
      expect(first.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2], [2, 3]])
      expect(await shardsIn(first.checkpoint!.path)).toEqual([0, 1, 2].map((r) => `optimizer.shard-${r}-of-3.msgpack`))

      const second = await fit(`zero${stage}-peers`, 2, { epochs: 8 }, { collectiveConfig: { zeroStage: stage } })
      expect(second.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4, 5, 6, 7])
      expect(sameWeights(second)).toBe(true)
      expect(second.metrics!.val_accuracy as number).toBeGreaterThan(0.9)
    })
  }

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
    // The slowed rank got less than an equal share, and less than the faster of the other two. On a
    // loaded machine a rank that the load slowed can end at the floor beside it, one row or none
    // (94/1/1 and 95/1/0 in CI runs), so the other two are not compared one by one.
    expect(batches[1]).toBeLessThan(96 / 3)
    expect(batches[1]).toBeLessThan(Math.max(batches[0]!, batches[2]!))
    expect(r.metricsHistory.at(-1)!.loss as number).toBeLessThan(r.metricsHistory[0]!.loss as number)
  })

  it("rejects what ZeRO cannot do, before starting anything, saying what to use instead", async () => {
    const err = async (p: Promise<unknown>) => p.then(() => undefined, (e: unknown) => e)
    const e1 = await err(fit("bad1", 2, { epochs: 1 }, { collectiveConfig: { compression: { type: "topk", ratio: 0.01 } } }))
    expect(e1).toBeInstanceOf(ConfigError)
    expect(String(e1)).toMatch(/zeroStage 1 with compression/)
    const e3 = await err(fit("bad3", 2, { epochs: 1 }, { collectiveConfig: { zeroStage: 3 } }))
    expect(e3).toBeInstanceOf(ConfigError)
    expect(String(e3)).toMatch(/zeroStage/)
  })
})
