// Recovery from surviving peers with parameter servers (strategy "parameter-server", whose default
// recoverFrom is "peers"): a worker killed mid-epoch costs the step in flight. The servers keep the
// parameters and the optimizer state; the survivors go on short-handed at once (the servers serve
// the smaller group, pushes of the old one dropped), and a replacement started meanwhile joins them
// in place, taking the servers' parameters. A lost server is made again from the replica the next
// server keeps (ps-trainer.test.ts kills one). Real nats-server, agent, worker and server processes.
// @module-tag faults (kills on the parameter servers: `npm run test:faults`, not `npm test`)
import { describe, expect, it } from "vitest"
import * as path from "node:path"
import * as fs from "node:fs/promises"
import { Trainer, type Result } from "../index.ts"
import { digitsTrainerRuns, expectStaleConverged, readEvents as events, sameWeights } from "./support/trainer-runs.ts"
import { fitReleasingHold, makeHold } from "./support/hold.ts"

const CHAOS = path.resolve("test/support/chaos-loop.ts") + "#trainLoop"
const STEP_LOOP = path.resolve("test/support/step-loop.ts") + "#stepLoop"
const runs = digitsTrainerRuns("gw-ps-peers-")

/** 3 workers and 2 servers in `mode`; rank 1 is killed after step 5 of epoch 1. A short group's steps are slowed until it is whole again (hold.ts). */
const killedWorker = async (name: string, mode: "sync" | "async", epochs: number): Promise<Result> => {
  const { dir: pidDir, holdFile } = await makeHold(runs.storage, `${name}-`, 3)
  return new Trainer({
    trainLoopPerWorker: CHAOS,
    trainLoopConfig: { epochs, fail: { how: "kill", rank: 1, epoch: 1, step: 5 }, pidDir, holdFile },
    scalingConfig: { numWorkers: 3 },
    runConfig: { name, storagePath: runs.storage, progress: false, failureConfig: { maxFailures: 1 } },
    collectiveConfig: { strategy: "parameter-server", parameterServer: { numServers: 2, mode } },
    datasets: { train: runs.train, test: runs.test }
  }).fit()
}

describe("parameter servers: recovery from surviving peers", () => {
  it("sync servers: a worker killed mid-epoch costs the step in flight; the survivors go on with the servers' state and a replacement joins in place, with the same weights", { timeout: 150_000 }, async () => {
    const r = await killedWorker("ps-peers-sync", "sync", 6)
    expect(r.restarts).toBe(1)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4, 5])
    // Sync servers: every rank continues from the same parameters after each step.
    expect(sameWeights(r)).toBe(true)
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.9)
    const ev = await events(r.path)
    const restart = ev.find((e) => e.type === "restart")
    // The survivors were in the step after the dead rank's last (0-5 done) and went on as 2 at once.
    expect(restart).toMatchObject({ recovery: "peers", survivors: 2, joiners: 0, position: { inFit: true, fitLoop: true, epoch: 1, stepInEpoch: 6 } })
    expect(ev.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 1 })
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2], [2, 3]])
    // No restart from the checkpoint: the servers of the first generation served the run to its end.
    const ckpt = await fs.readdir(r.checkpoint!.path)
    expect(ckpt).toEqual(expect.arrayContaining(["ps.shard-0-of-2.msgpack", "ps.shard-1-of-2.msgpack"]))
    expect(ev.filter((e) => e.type === "restart" && e.recovery === "checkpoint")).toEqual([])
  })

  it("a hand-written trainStep loop with sync servers: the survivors go on from the step in flight, and a replacement joins at a report() call", { timeout: 150_000 }, async () => {
    // The short group is held until its replacement is ready, then trains at full speed: it joins at the next report() call.
    const { holdFile } = await makeHold(runs.storage, "ps-step-hold-", 3)
    const r = await fitReleasingHold(
      {
        trainLoopPerWorker: STEP_LOOP,
        trainLoopConfig: { epochs: 5, kill: { rank: 1, epoch: 1, step: 5 }, holdFile },
        scalingConfig: { numWorkers: 3 },
        runConfig: { name: "ps-peers-step", storagePath: runs.storage, progress: false, failureConfig: { maxFailures: 1 } },
        collectiveConfig: { strategy: "parameter-server", parameterServer: { numServers: 2, mode: "sync" } },
        datasets: { train: runs.train, test: runs.test }
      },
      holdFile
    )
    const ev = await events(r.path)
    // On a failure, the regroups' events say what else was taken for a failure (once seen in CI under load: 2 restarts).
    expect(r.restarts, JSON.stringify(ev.filter((e) => e.type === "restart" || e.type === "resize" || e.type === "failure"))).toBe(1)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4])
    expect(sameWeights(r)).toBe(true)
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.85)
    expect(ev.find((e) => e.type === "restart")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 0, position: { inFit: false, reports: 1, stepsSinceReport: 6 } })
    // A hand-written loop's position does not say dp.fit(): its joiners take their place at a report() call.
    expect(ev.find((e) => e.type === "restart")!.position).not.toHaveProperty("fitLoop")
    expect(ev.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", survivors: 2, joiners: 1, position: { inFit: false, stepsSinceReport: 0 } })
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2], [2, 3]])
  })

  it("async servers in a hand-written loop: dp.globalStep goes on at the group's pace through a shrink and a grow, neither jumping nor standing still", { timeout: 150_000 }, async () => {
    // Each version counts 1/p of a group step at the size p it was made at. Before, every version
    // was counted at the group's size of the moment: the shrunk group's globalStep jumped ahead by
    // a sixth of the versions made so far, and once it grew back stood still until the versions
    // caught up (a loop that ends on dp.globalStep, as TF's parameter-server loops do, ended early;
    // strategy auto's decision clock stopped, and a loop could end before its decision round).
    // Batches of 32: 15-16 steps an epoch per rank at 3 workers, 22-23 at 2; rank 1 dies at epoch 3.
    const { holdFile } = await makeHold(runs.storage, "ps-async-global-", 3)
    const r = await fitReleasingHold(
      {
        trainLoopPerWorker: STEP_LOOP,
        // (the others wait for the death before their epoch 4: not in lockstep, they had run to the
        // end on a loaded machine before it, seen once in CI, and the group had nothing left to grow into)
        trainLoopConfig: { epochs: 7, kill: { rank: 1, epoch: 3, step: 3, killedFile: path.join(path.dirname(holdFile), "killed") }, holdFile, globalStep: true, stepsFile: path.join(path.dirname(holdFile), "steps") },
        scalingConfig: { numWorkers: 3 },
        runConfig: { name: "ps-async-global", storagePath: runs.storage, progress: false, failureConfig: { maxFailures: 1 } },
        collectiveConfig: { strategy: "parameter-server", parameterServer: { numServers: 1, mode: "async" } },
        datasets: { train: runs.train, test: runs.test }
      },
      holdFile
    )
    const ev = await events(r.path)
    // (on a failure, every event in order: what was taken for a failure, the standbys and how each
    // regroup went; positions left out)
    const said = ev.map((e) => JSON.stringify({ ...e, position: undefined }).slice(0, 300)).join("\n")
    expect(ev.find((e) => e.type === "restart"), said).toMatchObject({ recovery: "peers", survivors: 2 })
    expect(ev.find((e) => e.type === "grow"), said).toMatchObject({ recovery: "peers", joiners: 1 })
    // Every rank's count at each of its reports against the group steps made by then (every
    // process's steps, each 1/p of a group step at group size p: step-loop.ts's stepsFile). A rank
    // hears of the others' updates with its next answer from the servers, so it lags by the steps
    // they made since its last one (up to 4 while it evaluated and checkpointed). Before, a regroup
    // set every rank's count to the furthest survivor's own steps: it ran ahead by what that
    // survivor was ahead of the others (up to 20 group steps), then stood still until the versions
    // caught up; a joiner fell 10 behind.
    const apart = r.metricsPerRank.flatMap((round, at) =>
      round.filter((m) => m?.global_step !== undefined).map((m) => ({ report: at, count: Number(m.global_step), made: Number(m.group_steps_made) }))
    )
    const off = apart.filter((x) => !(x.count - x.made <= 1.5 && x.made - x.count <= 6))
    expect(off, `reports whose count is off the group steps made: ${JSON.stringify(apart)}`).toEqual([])
    expect(apart.length).toBeGreaterThanOrEqual(15)
  })

  it("async servers: the survivors go on (the push in flight counts as applied), a replacement joins, and the run converges", { timeout: 150_000 }, async () => {
    const r = await killedWorker("ps-peers-async", "async", 5)
    // (what failed and how each was recovered, for a failure's message)
    const said = (await events(r.path)).filter((e) => e.type === "failure" || e.type === "restart" || e.type === "grow").map((e) => JSON.stringify({ ...e, position: undefined }).slice(0, 400))
    expect(r.restarts, said.join("\n")).toBe(1)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3, 4])
    // Async servers converge noisily (0.94 -> 0.79 from one epoch to the next in a CI run here; best
    // epoch after the recovery 0.93-0.94 alone): a replacement that joined with wrong parameters
    // would pull every epoch after it down.
    expectStaleConverged(r)
    expect(Number(r.metricsHistory.at(-1)!.loss)).toBeLessThan(Number(r.metricsHistory[0]!.loss))
    const ev = await events(r.path)
    expect(ev.find((e) => e.type === "restart")).toMatchObject({ recovery: "peers", survivors: 2 })
    expect(ev.find((e) => e.type === "grow")).toMatchObject({ recovery: "peers", joiners: 1 })
    expect(ev.filter((e) => e.type === "restart" && e.recovery === "checkpoint")).toEqual([])
  })
})
