// tfjs code as it is written, model.fit on the whole dataset, trains data-parallel once the model
// is prepared (actors/train/worker/keras-fit.ts): the same weights on every rank, no parity repair,
// the group's metrics; a rank that passes other data fails the run with a ConfigError that says
// so. Before, model.fit trained each rank alone and the report round's parity check overwrote
// rank 1's weights with rank 0's. Real nats-server and worker processes.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, TrainingFailed, loadDigits, type ArrayDataset } from "../index.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"
import { makeHold } from "./support/hold.ts"

const LOOP = path.resolve("test/support/keras-fit-loop.ts") + "#kerasFitLoop"
let storage: string
let train: ArrayDataset

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-keras-fit-"))
  train = await loadDigits()
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

const fit = (name: string, differ: boolean, more: { epochs?: number; unprepared?: boolean } = {}) =>
  new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: 6, differ, ...more },
    scalingConfig: { numWorkers: 2 },
    runConfig: { name, storagePath: storage, progress: false },
    datasets: { train }
  }).fit()

describe("model.fit on a prepared model", () => {
  it("trains the group: the same weights on every rank, the group's metrics, no parity repair", { timeout: 90_000 }, async () => {
    const r = await fit("keras-fit", false)
    const [m0, m1] = r.metricsPerRank.at(-1)!
    expect(m0!.weights).toBe(m1!.weights)
    expect(m0!["gradwire/parity_repaired"]).toBeUndefined()
    expect(m0!["gradwire/unprepared_updates"]).toBeUndefined()
    expect(m1!.loss).toBe(m0!.loss)
    expect(m0!.epochsSeen).toBe("0,1,2,3,4,5")
    expect(m0!.loss as number).toBeLessThan((m0!.firstLoss as number) / 2)
    expect(m0!.valAcc as number).toBeGreaterThan(0.8)
    // the global batch of 64 split over the two ranks
    expect(m0!["batch/rank0"]).toBe(32)
    expect(m0!["batch/rank1"]).toBe(32)
  })

  it("on a model never prepared, each rank trains alone, and the run says so once: the ranks' metric, events.jsonl, summary.json", { timeout: 90_000 }, async () => {
    const r = await fit("keras-fit-unprepared", false, { epochs: 2, unprepared: true })
    const [m0, m1] = r.metricsPerRank.at(-1)!
    // 2 epochs of the 1797 rows but validationSplit's fifth (1438), in batches of 64: 23 a epoch
    for (const m of [m0!, m1!]) expect(m["gradwire/unprepared_updates"]).toBe(46)
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).split("\n").filter(Boolean).map((l) => JSON.parse(l) as Record<string, unknown>)
    const said = events.filter((e) => e.type === "unprepared-training")
    expect(said).toHaveLength(1)
    expect(said[0]).toMatchObject({ ranks: [0, 1], updates: 92 })
    const summary = JSON.parse(await fs.readFile(path.join(r.path, "summary.json"), "utf8")) as { incidents: Array<{ kind: string; text: string }> }
    expect(summary.incidents.find((i) => i.kind === "unprepared")?.text).toMatch(/not passed to ctx\.prepareModel\(\).*each rank trained that model alone/)
  })

  it("recovers from the surviving peers when a rank dies in the middle of model.fit: a replacement replays to them and joins", { tags: ["faults"], timeout: 90_000 }, async () => {
    // 22 epochs of 0.4 s at least: 8 s after the kill for the replacement to start (a standby
    // prepares lowered, and on a loaded machine up to 3 s later) and join; and the survivor alone
    // is held back at every step until it has (a CI run's standby was not ready in 7.5 s).
    const { holdFile } = await makeHold(storage, "hold-", 2)
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 22, kill: { rank: 1, epoch: 2 }, epochMs: 400, holdFile },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "keras-fit-kill", storagePath: storage, progress: false, failureConfig: { maxFailures: 1 } },
      datasets: { train }
    }).fit()
    const events = (await fs.readFile(path.join(r.path, "events.jsonl"), "utf8")).trim().split("\n").map((l) => JSON.parse(l) as Record<string, unknown>)
    const restarts = events.filter((e) => e.type === "restart" || e.type === "grow")
    // The survivor goes on short-handed, then the replacement joins it; neither from the checkpoint
    // (before, the replacement's model.fit compared the data with the survivor, which was past that
    // call: "a group operation other than a training step", and the group restarted from scratch).
    expect(restarts.map((e) => [e.type, e.recovery, e.survivors, e.joiners]), JSON.stringify(events.filter((e) => e.type !== "report"))).toEqual([
      ["restart", "peers", 1, 0],
      ["grow", "peers", 1, 1]
    ])
    const [m0, m1] = r.metricsPerRank.at(-1)!
    expect(m1!.weights).toBe(m0!.weights)
    expect(m0!.epochsSeen).toBe(Array.from({ length: 22 }, (_, i) => i).join(","))
    expect(m0!.valAcc as number).toBeGreaterThan(0.8)
  })

  it("refuses other data on another rank with a ConfigError, not retried", { timeout: 90_000 }, async () => {
    const e = await fit("keras-fit-differ", true).then(
      () => new Error("fit() resolved"),
      (err: unknown) => err
    )
    expect(e).toBeInstanceOf(TrainingFailed)
    expect((e as TrainingFailed).kind).toBe("config")
    expect((e as TrainingFailed).message).toMatch(/same whole dataset on every rank.*rank\(s\) 1 passed other data than rank 0/)
  })
})
