// The group step (dp.globalStep) a parameter-server worker counts across a regroup: a version of
// the servers is perUpdate / p of a group step at the group's size p when it was made. A survivor
// goes on from its last answer (the versions since then were the old group's); a joiner goes on
// from the count in the survivor's state it took (the versions since then are the new group's).
// Before, both took the furthest survivor's own step counter (DataParallelModel.adopt), which ran
// ahead of the group by what that survivor was ahead of the others, or, for a joiner, behind it by
// the versions made while it caught up. A restart from a checkpoint goes on from the checkpoint's
// count at the servers' version (counted from version 0, it stood still). The exchange runs
// against a stand-in for the servers whose version the test sets (the servers' side is ps-shard's).
import * as tf from "@tensorflow/tfjs"
import { describe, expect, it } from "vitest"
import { ParameterServerWorker } from "../actors/train/worker/strategies/parameter-server.ts"
import type { StrategyHost } from "../actors/train/worker/strategies/strategy.ts"

const N = 4

/** A worker on stand-in async servers: `servers.version` is what the next answer or pull says. */
const workerOn = (worldSize: number, mode: "async" | "sync" = "async") => {
  const servers = { version: 0 }
  let seen = 0
  const ps = {
    numServers: 1,
    mode,
    backupWorkers: 0,
    get version() {
      return seen
    },
    pushPull: async () => {
      seen = servers.version
      return { params: new Float32Array(N), staleness: 0, dropped: false, version: seen, serverMs: undefined }
    },
    pull: async () => {
      seen = servers.version
      return new Float32Array(N)
    }
  }
  const rank = 1
  const host = {
    // (rank 1: rank 0 would set the servers up in a restore)
    sync: { zeroStage: 0, ps, worldSize, rank, sum: async () => {} },
    optimizer: tf.train.sgd(0.1),
    learningRate: 0.1,
    parameterCount: N,
    inFit: false,
    step: 0,
    global: 0,
    assignFlat: () => {}
  }
  const worker = new ParameterServerWorker(host as unknown as StrategyHost)
  /** One step's push, answered at the servers' version `v`. */
  const stepAt = async (v: number): Promise<void> => {
    servers.version = v
    await worker.exchange(new Float32Array(N), { step: host.step++, samples: 1, recompute: async () => new Float32Array(N) })
  }
  /** A regroup to `size`: the taken state's step counter as DataParallelModel.adopt sets it, then the worker's adopted() at the servers' version `v`. */
  const regroup = async (size: number, v: number, stepCounter: number, files: Record<string, Uint8Array> = {}): Promise<void> => {
    host.sync.worldSize = size
    host.global = stepCounter
    servers.version = v
    await worker.adopted(files)
  }
  return { worker, host, servers, stepAt, regroup }
}

describe("the group step a parameter-server worker counts across a regroup", () => {
  it("a survivor counts the versions since its last answer at the old group's size, and the new ones at the new size", async () => {
    const a = workerOn(3)
    await a.stepAt(3)
    await a.stepAt(9)
    expect(a.host.global).toBe(3)
    // The others pushed 6 more at 3 before the regroup; the furthest survivor's own step counter says 10.
    await a.regroup(2, 15, 10)
    expect(a.host.global).toBeCloseTo(5, 9)
    await a.stepAt(17)
    expect(a.host.global).toBeCloseTo(6, 9)
  })

  it("a joiner counts from the survivor's count in the state it took: the versions made since at the new size", async () => {
    const a = workerOn(2)
    await a.stepAt(4)
    expect(a.host.global).toBe(2)
    const files = a.worker.snapshotFiles()
    expect(Object.keys(files)).toHaveLength(1)
    // A grow to 3: the joiner catches up while the group makes 6 more versions, then takes its place.
    const j = workerOn(3)
    await j.regroup(3, 10, 40, files)
    expect(j.host.global).toBeCloseTo(4, 9)
    await j.stepAt(13)
    expect(j.host.global).toBeCloseTo(5, 9)
    // The survivor, at the grow (version 4), and after: the same count as the joiner's.
    await a.regroup(3, 4, 40)
    await a.stepAt(13)
    expect(a.host.global).toBeCloseTo(5, 9)
  })

  it("sync servers: a version is a whole group step at any size", async () => {
    const a = workerOn(3, "sync")
    await a.stepAt(5)
    await a.regroup(2, 7, 30)
    expect(a.host.global).toBe(7)
    await a.stepAt(8)
    expect(a.host.global).toBe(8)
  })

  it("a restart from a checkpoint goes on from its group step at the servers' version, whatever that version is", async () => {
    // Servers set up fresh from the weights (a checkpoint without their state): version 0.
    const fresh = workerOn(3)
    fresh.host.global = 100
    await fresh.worker.restore({})
    await fresh.stepAt(3)
    expect(fresh.host.global).toBeCloseTo(101, 9)
    // Servers restored at version 240, made at another size: the count goes on from the checkpoint's.
    const restored = workerOn(3)
    restored.host.global = 100
    restored.servers.version = 240
    await restored.worker.restore({})
    await restored.stepAt(246)
    expect(restored.host.global).toBeCloseTo(102, 9)
  })

  it("a joiner without a survivor's count (a state from before any answer) goes on from the step counter it took, counting from its first answer", async () => {
    const j = workerOn(3)
    await j.regroup(3, 10, 12, {})
    expect(j.host.global).toBe(12)
    await j.stepAt(13)
    expect(j.host.global).toBe(12)
    await j.stepAt(16)
    expect(j.host.global).toBeCloseTo(13, 9)
  })
})
