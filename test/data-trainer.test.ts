// File-backed datasets end to end: real nats-servers, real worker processes, real files and a real
// JetStream object store. Each worker streams only its own rows; the test logs which rows every
// step trained (test/support/data-loop.ts) and checks them against the plan computed here from the
// same files and seed: a kill -9 in the middle of an epoch resumes from the mid-epoch checkpoint
// with no row repeated or skipped, a resume with another number of workers re-plans the rest of the
// epoch, and a run on a joined cluster trains from an object store bucket and a worker-side
// factory's tf.data pipeline.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, TrainingFailed, datasetFactory, fromFiles, putFiles, type FromFilesOptions, type Result } from "../index.ts"
import { resolveFileDataset, type ResolvedDataset } from "../core/data/resolve.ts"
import { FileStream } from "../core/data/stream.ts"
import { launchNatsServer, liveNatsServerPids, type NatsServerProcess } from "../core/nats-server.ts"
import { startHeadAgent, type HeadAgent } from "./support/head-agent.ts"
import { fitReleasingHold } from "./support/hold.ts"
import type { DataLoopConfig } from "./support/data-loop.ts"
import type { NatsConnection } from "@nats-io/nats-core"

const LOOP = path.resolve("test/support/data-loop.ts") + "#dataLoop"
const ROWS = 600
const BATCH = 10
const OPTS: FromFilesOptions = { label: "target", labelType: "float", shuffleBuffer: 64, chunkRows: 16 }

let work: string
let dataDir: string

beforeAll(async () => {
  work = await fs.mkdtemp(path.join(os.tmpdir(), "gw-data-trainer-"))
  dataDir = path.join(work, "data")
  await fs.mkdir(dataDir)
  // Three files of 200 rows: x0 = id / ROWS (the loop recovers the id), a regression target.
  for (let f = 0; f < 3; f++) {
    const lines = ["x0,x1,x2,target"]
    for (let i = f * 200; i < (f + 1) * 200; i++) lines.push(`${i / ROWS},${Math.sin(i)},${Math.cos(i)},${2 * Math.sin(i) - Math.cos(i)}`)
    await fs.writeFile(path.join(dataDir, `rows-${f}.csv`), lines.join("\n") + "\n")
  }
})
afterAll(async () => {
  await fs.rm(work, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

/** The rows each rank trains in `epoch` at world size p (seed 0, batch BATCH), as the plan says. */
const planned = async (d: ResolvedDataset, p: number, epoch: number, nats?: () => Promise<NatsConnection>): Promise<number[][]> => {
  const streams = Array.from({ length: p }, (_, r) => new FileStream("train", d, 0, () => ({ rank: r, worldSize: p }), nats))
  const left = streams.map((s, r) => s.openEpoch(epoch, r, p))[0]!
  const out: number[][] = streams.map(() => [])
  for (let from = 0; from < left; from += BATCH) {
    const batches = await Promise.all(streams.map((s) => s.take(from, Math.min(BATCH, left - from))))
    batches.forEach((b, r) => {
      for (let k = 0; k < b.n; k++) out[r]!.push(Math.round(b.x[k * 3]! * ROWS))
    })
  }
  await Promise.all(streams.map((s) => s.close()))
  return out
}

type Step = { epoch: number; index: number; ids: number[] }

/** Every step each (attempt, rank, size) logged. */
const readLogs = async (dir: string): Promise<Map<string, Step[]>> => {
  const out = new Map<string, Step[]>()
  for (const f of await fs.readdir(dir)) {
    const text = await fs.readFile(path.join(dir, f), "utf8")
    out.set(f.replace(/\.jsonl$/, ""), text.trim().split("\n").map((l) => JSON.parse(l) as Step))
  }
  return out
}

const idsOf = (steps: Step[] | undefined, epoch: number): number[] => (steps ?? []).filter((s) => s.epoch === epoch).flatMap((s) => s.ids)

const sameWeights = (r: Result): boolean => new Set(r.metricsPerRank.at(-1)!.map((m) => m.weights)).size === 1

/**
 * Three workers train the data loop (a checkpointed report after every step) over the CSV files,
 * rank 1 killed after step 5 of epoch 1 (attempt 0), one failure allowed; a short group's steps
 * slowed while the group is below three (`loop` may set other checkpoint, report and evaluation
 * intervals and another failure). The result, its events, where the steps were logged.
 */
const killRun = async (
  name: string,
  loop: { readonly epochs: number; readonly handWritten?: boolean } & Partial<Pick<DataLoopConfig, "checkpointEvery" | "reportEvery" | "evaluateEvery" | "fail">>
) => {
  const logDir = path.join(work, `logs-${name}`)
  await fs.mkdir(logDir)
  const holdFile = path.join(work, `hold-${name}`)
  await fs.writeFile(holdFile, "3")
  const spec = fromFiles(path.join(dataDir, "*.csv"), OPTS)
  // A hand-written loop's replacement joins at a report() call: its group is held only until the
  // replacement is ready (then it goes on at full speed to the next one).
  const r = await fitReleasingHold(
    {
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { batchSize: BATCH, rows: ROWS, logDir, checkpointEvery: 1, holdFile, fail: { how: "kill", rank: 1, epoch: 1, step: 5 }, ...loop },
      scalingConfig: { numWorkers: 3 },
      runConfig: { name, storagePath: work, progress: false, failureConfig: { maxFailures: 1 } },
      datasets: { train: spec }
    },
    loop.handWritten ? holdFile : undefined
  )
  const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
  return { r, events, logDir, spec }
}

describe("Trainer with file datasets", () => {
  it("trains from CSV files; kill -9 of a rank mid-epoch: the survivor plans the epoch's rest again and goes on, its replacement joins, no row twice, none skipped", { tags: ["faults"], timeout: 120_000 }, async () => {
    // While the group is short, its steps are slowed (hold.ts), so the replacement joins mid-epoch
    // (at a step's exchange: a group of three, so the two survivors still exchange every step).
    // 20 steps an epoch per rank; a report with a checkpoint after every step (so the replacement
    // joins at a step the others report at); rank 1 dies after step 5 of epoch 1. recoverFrom
    // "peers" is the default for file datasets too.
    const { r, events, logDir, spec } = await killRun("files-kill", { epochs: 3 })
    expect(r.countedFailures).toBe(1)
    // The survivors went on at once, and the replacement joined them: no restart from the checkpoint.
    // (On a failure, the message carries every restart and resize event with its reason.)
    const regroups = JSON.stringify(events.filter((e) => e.type === "restart" || e.type === "resize" || e.type === "resize-requested"))
    expect(events.filter((e) => e.type === "restart").map((e) => [e.recovery, e.counted]), regroups).toEqual([["peers", true]])
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([
      [3, 2],
      [2, 3]
    ])
    expect(sameWeights(r)).toBe(true)
    expect(r.metricsPerRank.at(-1)).toHaveLength(3)
    expect(Number(r.metrics!.loss)).toBeLessThan(0.5)
    // The checkpoints hold the data position.
    const ckpt = await fs.readFile(path.join(r.checkpoint!.path, "gradwire", "data-position.json"), "utf8")
    expect(JSON.parse(ckpt).train).toMatchObject({ epoch: 2, worldSize: 3 })

    const d = await resolveFileDataset("train", spec)
    const logs = await readLogs(logDir)
    // Epoch 0 as planned for three.
    const first = await planned(d, 3, 0)
    for (let rank = 0; rank < 3; rank++) expect(idsOf(logs.get(`a0-r${rank}-p3`), 0)).toEqual(first[rank])
    // Epoch 1, over every process's log: the killed rank's first 6 steps, the survivors', the
    // replacement's. The killed rank's last step may not have reached the survivors (they redid
    // theirs without it): then those rows were planned again and come twice in the logs; nothing else may.
    const killed = logs.get("a0-r1-p3")!.filter((s) => s.epoch === 1)
    expect(killed.map((s) => s.index)).toEqual(Array.from({ length: 6 }, (_, i) => i))
    const mayRepeat = new Set(killed.at(-1)!.ids)
    // The survivors' step numbers go on through the regroup (the rest of the epoch planned again
    // counts on from the steps before it), where they had started again at 0
    for (const k of ["a0-r0-p3", "a0-r2-p3"]) {
      const indices = logs.get(k)!.filter((s) => s.epoch === 1).map((s) => s.index)
      expect(indices.every((x, i) => i === 0 || x >= indices[i - 1]!), `${k}: ${indices.join(",")}`).toBe(true)
      expect(Math.max(...indices), k).toBeGreaterThanOrEqual(12)
    }
    const grew = events.find((e) => e.type === "grow") as { position: { epoch: number; stepInEpoch: number; stepsPerEpoch: number } } | undefined
    expect(grew).toBeDefined()
    const steps = (k: string, epoch: number): number => (logs.get(k) ?? []).filter((s) => s.epoch === epoch).length
    console.log(`files-kill: joined at epoch ${grew!.position.epoch} step ${grew!.position.stepInEpoch}/${grew!.position.stepsPerEpoch}; epoch 1 steps per log: ${[...logs.keys()].map((k) => `${k} ${steps(k, 1)}`).join(", ")}`)
    for (let epoch = 1; epoch <= grew!.position.epoch; epoch++) {
      const seen = new Map<number, number>()
      for (const steps of logs.values()) for (const id of idsOf(steps, epoch)) seen.set(id, (seen.get(id) ?? 0) + 1)
      for (const [id, n] of seen) expect(n === 1 || (epoch === 1 && n === 2 && mayRepeat.has(id)), `row ${id} trained ${n} times in epoch ${epoch}`).toBe(true)
      // Left out: fewer rows than the last plan's ranks could split evenly.
      expect(ROWS - seen.size).toBeLessThan(3)
    }
    // An epoch after the join is the plan for three, on whichever processes ran it.
    for (let epoch = grew!.position.epoch + 1; epoch < 3; epoch++) {
      const want = await planned(d, 3, epoch)
      const got = [...logs.values()].flatMap((steps) => idsOf(steps, epoch)).sort((a, b) => a - b)
      expect(got).toEqual([...want.flat()].sort((a, b) => a - b))
    }
  })

  it("a hand-written trainStep loop over the stream, kill -9 of a rank mid-epoch: the survivors finish the epoch on the plan they opened, the replacement joins between epochs, no row twice", { tags: ["faults"], timeout: 120_000 }, async () => {
    // The short group's steps are slowed until the replacement is ready, so it is ready before the
    // epoch in flight ends; 20 steps an epoch per rank at three; rank 1 dies after step 5 of epoch 1.
    const { r, events, logDir, spec } = await killRun("files-hand", { epochs: 4, handWritten: true })
    // From peers, with no joiner in the middle of the epoch (before, a hand-written loop over a file
    // dataset always went back to the checkpoint).
    expect(events.filter((e) => e.type === "restart").map((e) => [e.recovery, e.survivors, e.joiners])).toEqual([["peers", 2, 0]])
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([
      [3, 2],
      [2, 3]
    ])
    // The replacement joined at a report() between epochs.
    const grew = events.find((e) => e.type === "grow") as { position: { reports: number; stepsSinceReport: number } } | undefined
    expect(grew?.position.stepsSinceReport).toBe(0)
    expect(sameWeights(r)).toBe(true)
    expect(r.metricsPerRank.at(-1)).toHaveLength(3)
    expect(Number(r.metrics!.loss)).toBeLessThan(0.5)
    const d = await resolveFileDataset("train", spec)
    const logs = await readLogs(logDir)
    const first = await planned(d, 3, 0)
    const second = await planned(d, 3, 1)
    for (let rank = 0; rank < 3; rank++) expect(idsOf(logs.get(`a0-r${rank}-p3`), 0)).toEqual(first[rank])
    // Epoch 1: the survivors trained their whole parts of the plan for three, after the regroup
    // too; the lost rank its first 6 steps, the rest of its part went untrained.
    for (const rank of [0, 2]) expect(idsOf(logs.get(`a0-r${rank}-p3`), 1)).toEqual(second[rank])
    expect(idsOf(logs.get("a0-r1-p3"), 1)).toEqual(second[1]!.slice(0, 6 * BATCH))
    // Every epoch: no row twice; from epoch 2 on, the whole epoch (planned for the group that read it).
    for (let epoch = 0; epoch < 4; epoch++) {
      const seen = new Map<number, number>()
      for (const steps of logs.values()) for (const id of idsOf(steps, epoch)) seen.set(id, (seen.get(id) ?? 0) + 1)
      for (const [id, n] of seen) expect(n, `row ${id} trained ${n} times in epoch ${epoch}`).toBe(1)
      if (epoch !== 1) expect(ROWS - seen.size, `rows left out of epoch ${epoch}`).toBeLessThan(3)
    }
  })

  // A loader is made by its factory for the rank's place (data-factory.ts#makeRows: rank r's 100 rows
  // are ids 100r..100r+99); after a regroup the survivors' loaders would still be split for the old
  // ranks. A hand-written loop killed mid-epoch, and dp.fit() killed at the epoch's last step (the
  // survivors park at the epoch's end, where the loader has no rows left): both go back to the
  // checkpoint, where every rank makes its loader again.
  for (const [loop, step] of [["hand-written", 5], ["dp.fit()", 9]] as const) {
    it(`a ${loop} loop over a worker-side factory's loader, kill -9 at step ${step} of 10: back to the checkpoint, saying why, and every later epoch trains each row once`, { tags: ["faults"], timeout: 120_000 }, async () => {
      const logDir = path.join(work, `logs-loader-${step}`)
      const handWritten = loop === "hand-written"
      await fs.mkdir(logDir)
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        // 10 steps an epoch per rank (100 rows each, batch 10); rank 1 dies after this step of epoch 1.
        trainLoopConfig: { epochs: 3, batchSize: BATCH, rows: ROWS, logDir, checkpointEvery: handWritten ? 1 : 100, handWritten, trainOn: "rows", fail: { how: "kill", rank: 1, epoch: 1, step } },
        scalingConfig: { numWorkers: 3 },
        runConfig: { name: `loader-hand-${step}`, storagePath: work, progress: false, failureConfig: { maxFailures: 1 } },
        datasets: { train: fromFiles(path.join(dataDir, "*.csv"), OPTS), rows: datasetFactory(path.resolve("test/support/data-factory.ts") + "#makeRows", { rowsPerRank: 100 }) }
      }).fit()
      const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
      // Before, dp.fit()'s regroup at the epoch's end went on from peers: in epoch 2 the survivors
      // read the rows of old ranks 0 and 2, and rows 100-199 went untrained.
      const restarts = events.filter((e) => e.type === "restart")
      expect(restarts.map((e) => e.recovery)).toEqual(["checkpoint"])
      expect(String(restarts[0]!.reason)).toMatch(/the loader "rows", which its factory made for rank \d of 3/)
      expect(sameWeights(r)).toBe(true)
      expect(r.metricsPerRank.at(-1)).toHaveLength(3)
      const logs = await readLogs(logDir)
      const last = [...logs.keys()].filter((k) => k.startsWith("a1-"))
      expect(last).toHaveLength(3)
      const epoch2 = last.flatMap((k) => idsOf(logs.get(k), 2)).sort((x, y) => x - y)
      expect(epoch2).toEqual(Array.from({ length: 300 }, (_, i) => i))
    })
  }

  it("a replacement replaying the loop from an older checkpoint gets the group's figures of the distributed evaluations and dp.fit() epochs it passes, not its own on the checkpoint's weights", { tags: ["faults"], timeout: 120_000 }, async () => {
    // A checkpoint every 4 epochs (a report every epoch), an evaluation after each; rank 1 dies near
    // the end of epoch 4, so its replacement replays from the end of epoch 3 and evaluates after
    // epoch 4 on the way. Before, that evaluation was its own part of the rows on epoch 3's weights: a loop
    // deciding on it (an early-stopping counter) then went apart from the survivors'.
    const { r, logDir } = await killRun("files-replay-eval", { epochs: 8, checkpointEvery: 1000, evaluateEvery: 4, fail: { how: "kill", rank: 1, epoch: 4, step: 18 } })
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2], [2, 3]])
    const evals = new Map<string, Map<number, [number, number]>>()
    for (const f of await fs.readdir(logDir)) {
      const lines = (await fs.readFile(path.join(logDir, f), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as { epoch: number; eval?: number; fit?: number })
      evals.set(f, new Map(lines.filter((l) => l.eval !== undefined).map((l) => [l.epoch, [l.eval!, l.fit!]])))
    }
    const survivor = evals.get("a0-r0-p3.jsonl")!
    const joiners = [...evals.entries()].filter(([f]) => !f.startsWith("a0-"))
    expect(joiners.map(([f]) => f), [...evals.keys()].join(", ")).toHaveLength(1)
    const joined = joiners[0]![1]
    // it replayed from the end of epoch 3: its first evaluation is epoch 4's, passed on the way
    expect([...joined.keys()][0]).toBe(4)
    // (an epoch it skipped returned the group's dp.fit() loss too, where it had been NaN)
    for (const [epoch, figures] of joined) expect(figures, `epoch ${epoch}`).toEqual(survivor.get(epoch))
  })

  it("a dp.fit() loop that reports every step and checkpoints every 8: its replacement joins from peers, counting the reports the replay's skipped steps made on the survivors", { tags: ["faults"], timeout: 120_000 }, async () => {
    // (Ray's pattern: metrics every step, a checkpoint now and then.) The replay does not call
    // onStep for the steps it skips, so the joiner met the survivors short of their report() calls
    // and the group went back to the checkpoint ("this rank had made 59 report() calls, the survivors 60").
    const { r, events } = await killRun("files-report-every", { epochs: 3, checkpointEvery: 8, reportEvery: 1, fail: { how: "kill", rank: 1, epoch: 1, step: 13 } })
    expect(events.filter((e) => e.type === "restart").map((e) => [e.recovery, e.reason ?? ""])).toEqual([["peers", ""]])
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2], [2, 3]])
    // every rank made the same report() calls to the end (a rank short of them fails the run), on the same weights
    expect(sameWeights(r)).toBe(true)
    expect(r.metricsPerRank.at(-1)).toHaveLength(3)
  })

  it("a kill -9 at the last step of the run: the survivors finish it, and the run says it ended short-handed", { tags: ["faults"], timeout: 120_000 }, async () => {
    const logDir = path.join(work, "logs-short")
    await fs.mkdir(logDir)
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 1, batchSize: BATCH, rows: ROWS, logDir, checkpointEvery: 5, fail: { how: "kill", rank: 1, epoch: 0, step: 19 } },
      scalingConfig: { numWorkers: 3 },
      runConfig: { name: "files-short", storagePath: work, progress: false, failureConfig: { maxFailures: 1 } },
      datasets: { train: fromFiles(dataDir, OPTS) }
    }).fit()
    expect(r.resizes.map((z) => [z.from, z.to])).toEqual([[3, 2]])
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
    expect(events.filter((e) => e.type === "finished-short-handed")).toEqual([expect.objectContaining({ workers: 2, of: 3 })])
    const summary = JSON.parse(await fs.readFile(path.join(r.path, "summary.json"), "utf8")) as { incidents: Array<{ text: string }> }
    expect(summary.incidents.map((i) => i.text)).toContainEqual(expect.stringMatching(/^the run finished short-handed, with 2 of its 3 workers since .*: the replacement was not ready before the training ended/))
  })

  it("resumes a mid-epoch checkpoint with another number of workers: the epoch's rest is re-planned, no row twice, none skipped", { timeout: 120_000 }, async () => {
    const spec = fromFiles(dataDir, OPTS)
    const fit = (workers: number, logDir: string, fail?: object) =>
      new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { epochs: 2, batchSize: BATCH, rows: ROWS, logDir, checkpointEvery: 4, ...(fail ? { fail } : {}) },
        scalingConfig: { numWorkers: workers },
        runConfig: { name: "files-resize", storagePath: work, progress: false },
        datasets: { train: spec }
      }).fit()
    const logs2 = path.join(work, "logs-p2")
    const logs3 = path.join(work, "logs-p3")
    await fs.mkdir(logs2)
    await fs.mkdir(logs3)
    // Two workers stop (a thrown error, no restarts) after step 9 of epoch 0; the checkpoint after step 7 is the latest.
    const e = await fit(2, logs2, { how: "throw", rank: 0, epoch: 0, step: 9 }).catch((err: unknown) => err)
    expect(e).toBeInstanceOf(TrainingFailed)
    // Three workers go on from it.
    const r = await fit(3, logs3)
    expect(sameWeights(r)).toBe(true)
    expect(r.metricsPerRank.at(-1)).toHaveLength(3)

    const d = await resolveFileDataset("train", spec)
    const before = await readLogs(logs2)
    const after = await readLogs(logs3)
    const want2 = await planned(d, 2, 0)
    const seen: number[] = []
    for (let rank = 0; rank < 2; rank++) {
      const first = idsOf(before.get(`a0-r${rank}-p2`), 0).slice(0, 8 * BATCH)
      expect(first).toEqual(want2[rank]!.slice(0, 8 * BATCH))
      seen.push(...first)
    }
    for (let rank = 0; rank < 3; rank++) seen.push(...idsOf(after.get(`a0-r${rank}-p3`), 0))
    // The resumed epoch's step numbers count on from the 8 steps of two before it (16 batches: 5
    // steps of three, rounded), not again from 0
    for (let rank = 0; rank < 3; rank++) {
      const indices = after.get(`a0-r${rank}-p3`)!.filter((s) => s.epoch === 0).map((s) => s.index)
      expect(indices).toEqual(Array.from({ length: indices.length }, (_, i) => Math.round((8 * 2) / 3) + i))
    }
    expect(new Set(seen).size).toBe(seen.length)
    // Left out: what two workers could not split evenly of the whole, and three of the rest.
    expect(ROWS - seen.length).toBeLessThan(3)
    // The next epoch is a fresh plan at three workers.
    const want3 = await planned(d, 3, 1)
    for (let rank = 0; rank < 3; rank++) expect(idsOf(after.get(`a0-r${rank}-p3`), 1)).toEqual(want3[rank])
  })
})

describe("Trainer on a joined cluster with data in its object store", () => {
  let server: NatsServerProcess
  let conn: HeadAgent["conn"]
  let agent: HeadAgent | undefined

  beforeAll(async () => {
    server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
    agent = await startHeadAgent(server.url, "datatest", "data object store test")
    conn = agent.conn
  })
  afterAll(async () => {
    await agent?.stop()
    await server?.stop()
  })

  it("trains from files uploaded to nats-obj://, and from a worker-side factory's tf.data rows", { timeout: 120_000 }, async () => {
    const files = (await fs.readdir(dataDir)).map((f) => path.join(dataDir, f))
    await putFiles(conn.nc, files, "nats-obj://datasets/regression", { partBytes: 4096 })
    const logDir = path.join(work, "logs-obj")
    await fs.mkdir(logDir)
    const spec = fromFiles("nats-obj://datasets/regression", OPTS)
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 1, batchSize: BATCH, rows: ROWS, logDir, checkpointEvery: 100, aux: true },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "files-obj", storagePath: work, progress: false },
      datasets: { train: spec, aux: datasetFactory(path.resolve("test/support/data-factory.ts") + "#makeRows", { rowsPerRank: 20 }) },
      cluster: { address: server.url, clusterName: "datatest" }
    }).fit()
    expect(sameWeights(r)).toBe(true)
    // The factory's epoch: 20 rows on each of 2 ranks.
    expect(r.metrics).toMatchObject({ aux_samples: 40 })
    const nats = async () => conn.nc
    const d = await resolveFileDataset("train", spec, nats)
    const want = await planned(d, 2, 0, nats)
    const logs = await readLogs(logDir)
    for (let rank = 0; rank < 2; rank++) expect(idsOf(logs.get(`a0-r${rank}-p2`), 0)).toEqual(want[rank])
  })
})
