// Pipeline and tensor parallelism through the Trainer: real embedded nats-server, real worker
// processes, activations and gradients between them over NATS. Each rank compares its stage with
// the same model trained whole on one worker (4 stages cut by measured compute, data x pipeline,
// tensor x pipeline, tensor-only); a pipelined digits run checkpoints every rank's stage, survives
// a stage killed mid-epoch by restarting from the checkpoint at the same layout (one replica), and
// its checkpoint merges into one model that scores what the pipeline scored; with two replicas (of
// two stages, or of a tensor-parallel pair) the survivors are regrouped in place and the
// replacement takes its part from the other replica, also after three kills in a row (one of a
// replacement) and after a killed nats-server.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import { readFileSync, readdirSync } from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, TrainingFailed, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import type { EquivalenceCase } from "./support/pipeline-loop.ts"
import { natsKillAtReport } from "./support/chaos.ts"
import { mergedAccuracy, readEvents } from "./support/trainer-runs.ts"

const LOOPS = path.resolve("test/support/pipeline-loop.ts")
let storage: string
let train: ArrayDataset
let test: ArrayDataset

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-pipeline-"))
  ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 5))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

describe("model parallelism in the Trainer", () => {
  it("pipelined and tensor-parallel models train as the single-worker model does", async () => {
    const cases: EquivalenceCase[] = [
      { name: "pp4", options: { stages: 4, schedule: "1f1b", microBatches: 3, balance: "compute" }, rows: 10, steps: 3 },
      { name: "dp2pp2", options: { stages: 2, schedule: "gpipe", microBatches: 3, balance: [2, 3] }, rows: 7, steps: 3 },
      { name: "tp2pp2", options: { stages: 2, tensorParallel: 2, microBatches: 2, balance: [3, 2] }, rows: 6, steps: 2 },
      { name: "tp4", options: { tensorParallel: 4 }, rows: 5, steps: 2 }
    ]
    const r = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#equivalenceLoop`,
      trainLoopConfig: { cases },
      scalingConfig: { numWorkers: 4 },
      runConfig: { name: "equivalence", storagePath: storage, progress: false }
    }).fit()
    const ranks = r.metricsPerRank.at(-1)!
    expect(ranks.length).toBe(4)
    for (const m of ranks) {
      for (const c of cases) {
        expect(m[`${c.name}/diff`], `${c.name} on rank ${String(m.rank)}`).toBeLessThan(2e-5)
        expect(m[`${c.name}/bounds`]).toBe(ranks[0][`${c.name}/bounds`])
      }
      // one replica: its batch is the global batch
      for (const c of ["pp4", "tp2pp2", "tp4"]) expect(m[`${c}/loss`] as number).toBeCloseTo(m[`${c}/ref_loss`] as number, 5)
    }
    // two replicas of 7 rows: the mean of their losses is the 14-row batch's
    expect(((ranks[0]["dp2pp2/loss"] as number) + (ranks[2]["dp2pp2/loss"] as number)) / 2).toBeCloseTo(ranks[0]["dp2pp2/ref_loss"] as number, 5)
    expect(ranks.map((m) => m["pp4/stage"])).toEqual([0, 1, 2, 3])
    expect(ranks.map((m) => m["pp4/in_flight"])).toEqual([3, 3, 2, 1])
    // tensor parallel: each rank holds a quarter of the split pairs' weights (129 of the model's 357)
    for (const m of ranks) expect(m["tp4/params"]).toBe(129)
  }, 90_000)

  it("checkpoints every stage, restarts a pipeline from it after a stage is killed, and merges it into one model", { tags: ["faults"], timeout: 90_000 }, async () => {
    const r = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#fitLoop`,
      trainLoopConfig: { epochs: 3, stages: 2, kill: { rank: 1, epoch: 1, step: 5 } },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "pipeline-fit", storagePath: storage, progress: false, failureConfig: { maxFailures: 1 } },
      datasets: { train, test }
    }).fit()
    expect(r.restarts).toBe(1)
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    // The restart says why it went to the checkpoint and not to the surviving stage: one replica.
    const events = await readEvents(r.path)
    expect(events.find((e) => e.type === "restart")).toMatchObject({ recovery: "checkpoint", reason: expect.stringMatching(/^stage 1 of the pipelined model was held only by the lost rank\(s\): with one data-parallel replica/) })
    // epoch 1 ran again, from epoch 0's checkpoint, in the second attempt; each rank fetched only its own stage's shard of it
    expect(r.metricsHistory[1].attempt).toBe(1)
    expect(r.metricsPerRank.at(-1)!.map((m) => m.resumed_shards)).toEqual(["pipeline/stage-0-of-2.tp-0-of-1.msgpack", "pipeline/stage-1-of-2.tp-0-of-1.msgpack"])
    // loaded into the whole model, that checkpoint says what it lacks and where the whole one is
    for (const m of r.metricsPerRank.at(-1)!) expect(m.whole_restore).toMatch(/fetched after ctx\.preparePipeline\(\), so it holds only this rank's stage, not pipeline\/stage-.*loadPipelineCheckpoint\(tf, ".*checkpoint_/)
    const last = r.metrics!
    expect(last.val_accuracy as number).toBeGreaterThan(0.85)
    const files = await fs.readdir(path.join(r.checkpoint!.path, "pipeline"))
    expect(files.sort()).toEqual(["layout.json", "stage-0-of-2.tp-0-of-1.msgpack", "stage-1-of-2.tp-0-of-1.msgpack"])
    // the merged model scores on the held-out set what the pipeline's evaluate reported
    expect(await mergedAccuracy(r.checkpoint!.path, test)).toBeCloseTo(last.val_accuracy as number, 5)
  })

  it.each([
    // rank = (replica x stages + stage) x tp + tpRank: rank 1 is replica 0's stage 1 (the writer of its checkpoint shard), rank 3 its replica
    { grid: "2 stages x 2 replicas", kill: 1, stages: 2, tp: 1, stage: [0, 1, 0, 1], tpRank: [0, 0, 0, 0], shards: ["stage-0-of-2.tp-0-of-1.msgpack", "stage-1-of-2.tp-0-of-1.msgpack"] },
    // rank 0: replica 0's first stage, the writer of the layout and the rank whose metrics make the history; rank 2 its replica
    { grid: "2 stages x 2 replicas", kill: 0, stages: 2, tp: 1, stage: [0, 1, 0, 1], tpRank: [0, 0, 0, 0], shards: ["stage-0-of-2.tp-0-of-1.msgpack", "stage-1-of-2.tp-0-of-1.msgpack"] },
    // rank 1 is replica 0's second tensor slice, rank 3 its replica
    { grid: "tensor parallel 2 x 2 replicas", kill: 1, stages: 1, tp: 2, stage: [0, 0, 0, 0], tpRank: [0, 1, 0, 1], shards: ["stage-0-of-1.tp-0-of-2.msgpack", "stage-0-of-1.tp-1-of-2.msgpack"] }
  ])("regroups a $grid grid from its survivors after rank $kill is killed: its replacement takes its part from the other replica", { tags: ["faults"], timeout: 120_000 }, async (c) => {
    const progress: Array<{ attempt: number; rank: number; epoch: number; stepsPerEpoch: number }> = []
    const r = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#fitLoop`,
      trainLoopConfig: { epochs: 3, stages: c.stages, tensorParallel: c.tp, kill: { rank: c.kill, epoch: 1, step: 5 } },
      scalingConfig: { numWorkers: 4 },
      runConfig: {
        name: `pipeline-peers-${c.stages}x${c.tp}-${c.kill}`,
        storagePath: storage,
        progress: false,
        failureConfig: { maxFailures: 1 },
        callbacks: [{ onProgress: (p) => progress.push(p) }]
      },
      datasets: { train, test }
    }).fit()
    // every rank's steps come as progress messages (epochs and their steps), the replacement's in the regrouped generation
    for (let rank = 0; rank < 4; rank++) expect(progress.some((p) => p.rank === rank && p.attempt === 1 && p.epoch === 2 && p.stepsPerEpoch > 0)).toBe(true)
    const events = await readEvents(r.path)
    const restarts = events.filter((e) => e.type === "restart")
    expect(restarts).toHaveLength(1)
    expect(restarts[0]).toMatchObject({ recovery: "peers", survivors: 3, joiners: 1 })
    expect(events.some((e) => e.type === "resize-from-checkpoint")).toBe(false)
    // each part's shard came from one survivor that holds it (the lost part's from its other replica), not from every survivor
    const from = restarts[0]!.stagesFrom as Record<string, number>
    expect(Object.keys(from).sort()).toEqual(c.shards.map((f) => `pipeline/${f}`))
    for (const [f, rank] of Object.entries(from)) expect(`pipeline/${c.shards[c.stage[rank]! * c.tp + c.tpRank[rank]!]}`).toBe(f)
    expect(Object.values(from)).not.toContain(c.kill)
    // every epoch reported once, epoch 1 not run again from epoch 0's checkpoint
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.85)
    // The replacement (at the killed rank) took its part from that rank's replica: the two
    // replicas of each part hold the same weights and optimizer steps.
    const ranks = r.metricsPerRank.at(-1)!
    expect(ranks.map((m) => m.stage)).toEqual(c.stage)
    expect(ranks.map((m) => m.tp_rank)).toEqual(c.tpRank)
    expect(ranks[1].weights).toBe(ranks[3].weights)
    expect(ranks[0].weights).toBe(ranks[2].weights)
    expect(ranks[1].steps).toBe(ranks[3].steps)
    expect(ranks[0].steps).toBe(ranks[2].steps)
    expect(ranks[1].weights).not.toBe(ranks[0].weights)
    // The replacement replayed its loop from the checkpoint and fetched only its own part's shard of it; the survivors fetched none.
    expect(ranks.map((m) => m.resumed_shards)).toEqual(ranks.map((_, rank) => (rank === c.kill ? `pipeline/${c.shards[c.stage[rank] * c.tp + c.tpRank[rank]]}` : "")))
    // it writes its part's shard from then on: the last checkpoint is whole and loads
    const files = await fs.readdir(path.join(r.checkpoint!.path, "pipeline"))
    expect(files.sort()).toEqual(["layout.json", ...c.shards])
    expect(await mergedAccuracy(r.checkpoint!.path, test)).toBeCloseTo(r.metrics!.val_accuracy as number, 5)
  })

  it("three kills in a row, one of them of a replacement: every one regrouped from the replicas, at most a step lost per stage and death", { tags: ["faults"], timeout: 150_000 }, async () => {
    const pidDir = await fs.mkdtemp(path.join(storage, "pids-"))
    // The newest pid of a rank: its replacement's once it has one (the file of the latest attempt).
    const pidOf = (rank: number): number => {
      const mine = readdirSync(pidDir).map((f) => /^(\d+)-(\d+)\.pid$/.exec(f)).filter((m): m is RegExpExecArray => m !== null && Number(m[2]) === rank)
      const newest = mine.sort((a, b) => Number(b[1]) - Number(a[1]))[0]!
      return Number(readFileSync(path.join(pidDir, newest[0]), "utf8"))
    }
    // After report rounds 2, 6 and 10 (each after the last replacement has joined and reported), a
    // little into the next epoch: rank 1, rank 1 again (its replacement), rank 2.
    const kills = new Map([[2, 1], [6, 1], [10, 2]])
    const killed: number[] = []
    const r = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#fitLoop`,
      trainLoopConfig: { epochs: 14, stages: 2, pidDir },
      scalingConfig: { numWorkers: 4 },
      runConfig: {
        name: "pipeline-three-kills",
        storagePath: storage,
        progress: false,
        failureConfig: { maxFailures: 3 },
        callbacks: [
          {
            onReport: ({ index }) => {
              const rank = kills.get(index)
              if (rank === undefined) return
              const pid = pidOf(rank)
              killed.push(pid)
              setTimeout(() => process.kill(pid, "SIGKILL"), 100)
            }
          }
        ]
      },
      datasets: { train, test }
    }).fit()
    expect(new Set(killed).size).toBe(3)
    const events = await readEvents(r.path)
    expect(events.filter((e) => e.type === "restart")).toEqual(Array.from({ length: 3 }, () => expect.objectContaining({ recovery: "peers", survivors: 3, joiners: 1 })))
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual(Array.from({ length: 14 }, (_, e) => e))
    const ranks = r.metricsPerRank.at(-1)!
    expect(ranks[0].weights).toBe(ranks[2].weights)
    expect(ranks[1].weights).toBe(ranks[3].weights)
    // A stage none of whose replicas had applied the step in flight skips it: at most one per death.
    expect(Math.abs((ranks[0].steps as number) - (ranks[1].steps as number))).toBeLessThanOrEqual(3)
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.85)
  })

  it("a killed nats-server: every rank of a one-replica pipeline survives it and the group is regrouped in place, without the checkpoint", { tags: ["faults"], timeout: 120_000 }, async () => {
    const kill = natsKillAtReport(1)
    const r = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#fitLoop`,
      trainLoopConfig: { epochs: 4, stages: 2 },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "pipeline-nats-killed", storagePath: storage, progress: false, failureConfig: { maxFailures: 0 }, callbacks: [kill.callback] },
      datasets: { train, test }
    }).fit()
    expect(kill.killed()).toBeGreaterThan(0)
    expect(r.natsServerRestarts).toBe(1)
    expect(r.countedFailures).toBe(0)
    const events = await readEvents(r.path)
    expect(events.filter((e) => e.type === "restart")).toEqual([expect.objectContaining({ recovery: "peers", survivors: 2, joiners: 0 })])
    expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2, 3])
    expect(r.metrics!.val_accuracy as number).toBeGreaterThan(0.85)
  })

  it("fails fast, naming the stage and rank it waited for, when a stage hangs", { tags: ["faults"], timeout: 60_000 }, async () => {
    const started = Date.now()
    const err = await new Trainer({
      trainLoopPerWorker: `${LOOPS}#fitLoop`,
      trainLoopConfig: { epochs: 1, stages: 2, hang: { rank: 1, step: 2 } },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "pipeline-hang", storagePath: storage, progress: false },
      collectiveConfig: { timeoutMs: 2_000 },
      datasets: { train, test }
    })
      .fit()
      .then(() => undefined, (e: unknown) => e)
    expect(err).toBeInstanceOf(TrainingFailed)
    const msg = (err as Error).message
    expect(msg).toMatch(/rank 0's group broke: rank 0 failed receiving gradients from stage 1 \(rank 1\)/)
    expect(msg).toMatch(/rank\(s\) 1 answered a liveness probe but had not started this transfer/)
    // the deadline, not the hung rank's 60 s sleep, ended the run
    expect(Date.now() - started).toBeLessThan(45_000)
  })
})
