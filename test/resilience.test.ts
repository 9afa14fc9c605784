// Training survives its infrastructure: the embedded nats-server killed with SIGKILL mid-run is
// restarted and the run finishes; a bus that does not come back fails fit() with NatsUnavailable
// after failureConfig.natsOutageTimeoutMs, carrying the partial Result; a checkpoint that cannot be
// written (a full JetStream store) is retried, recorded in Result.checkpointErrors and
// events.jsonl, and training goes on; a callback that throws is recorded, not fatal. Real
// nats-server processes, real agents and worker processes.
// @module-tag faults (a killed nats-server and outages: `npm run test:faults`, not `npm test`)
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { NatsUnavailable } from "../core/errors.ts"
import { readEvents as events, sameWeights } from "./support/trainer-runs.ts"
import { launchNatsServer, liveNatsServerPids, type NatsServerProcess } from "../core/nats-server.ts"
import { startHeadAgent } from "./support/head-agent.ts"
import { natsKillAtReport } from "./support/chaos.ts"
import { resultOf } from "../actors/train/driver/result.ts"

const LOOP = path.resolve("examples/digits/train.ts") + "#trainLoop"
let storage: string
let train: ArrayDataset
let test: ArrayDataset

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-resilience-"))
  ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})


/** A cluster of one in-process agent on a server the test owns (not supervised by gradwire). */
const withAgent = async <A>(server: NatsServerProcess, cluster: string, fn: () => Promise<A>): Promise<A> => {
  const agent = await startHeadAgent(server.url, cluster, "resilience test agent", { maxReconnectAttempts: -1 })
  try {
    return await fn()
  } finally {
    await agent.stop()
  }
}

describe("a supervised bus", () => {
  it("finishes every epoch when the embedded nats-server is killed with SIGKILL mid-run, without counting a failure", async () => {
    const kill = natsKillAtReport(1)
    const r = await new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs: 5 },
      scalingConfig: { numWorkers: 2 },
      runConfig: {
        name: "nats-killed",
        storagePath: storage,
        progress: false,
        // maxFailures 0: the restart must not be counted as a failure of the job.
        failureConfig: { maxFailures: 0 },
        callbacks: [kill.callback]
      },
      datasets: { train, test }
    }).fit()
    expect(kill.killed()).toBeGreaterThan(0)
    expect(r.natsServerRestarts).toBe(1)
    expect(r.busOutages.length).toBeGreaterThanOrEqual(1)
    expect(r.busOutages[0].serverRestarted).toBe(true)
    expect(r.restarts).toBe(1)
    expect(r.countedFailures).toBe(0)
    // Every epoch reported once after the resume point; the last round has the same weights everywhere.
    const epochs = r.metricsHistory.map((m) => m.epoch as number)
    expect(new Set(epochs)).toEqual(new Set([0, 1, 2, 3, 4]))
    expect(epochs.at(-1)).toBe(4)
    expect(sameWeights(r)).toBe(true)
    const ev = await events(r.path)
    expect(ev.some((e) => e.type === "nats-server-exit" && e.pid === kill.killed())).toBe(true)
    expect(ev.some((e) => e.type === "nats-server-restart")).toBe(true)
    expect(ev.some((e) => e.type === "bus-down")).toBe(true)
    // Both workers waited out the outage: they are regrouped where they were, not restarted.
    expect(ev.find((e) => e.type === "restart")).toMatchObject({ kind: "bus", counted: false, recovery: "peers", survivors: 2, joiners: 0 })
    const report = await fs.readFile(path.join(r.path, "report.html"), "utf8")
    expect(report).toContain("embedded nats-server")
  })

  it("fails with NatsUnavailable carrying the partial Result when the bus stays away past natsOutageTimeoutMs", async () => {
    const server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
    try {
      const started = Date.now()
      let stoppedAt = 0
      const err = await withAgent(server, "gone", () =>
        new Trainer({
          trainLoopPerWorker: LOOP,
          trainLoopConfig: { epochs: 30 },
          scalingConfig: { numWorkers: 2 },
          runConfig: {
            name: "nats-gone",
            storagePath: storage,
            progress: false,
            failureConfig: { natsOutageTimeoutMs: 3_000 },
            callbacks: [
              {
                onReport: ({ index }) => {
                  if (index === 1 && !stoppedAt) {
                    stoppedAt = Date.now()
                    server.kill("SIGKILL")
                  }
                }
              }
            ]
          },
          datasets: { train, test },
          cluster: { address: server.url, clusterName: "gone" }
        })
          .fit()
          .then(() => new Error("fit() resolved although its NATS server was gone"), (e: unknown) => e)
      )
      expect(err).toBeInstanceOf(NatsUnavailable)
      const e = err as NatsUnavailable
      expect(e.timeoutMs).toBe(3_000)
      expect(e.outageMs).toBeGreaterThanOrEqual(3_000)
      expect(e.message).toMatch(/natsOutageTimeoutMs/)
      expect(e.message).toContain(server.url)
      // One channel: the rejection carries what was achieved (two report rounds, a checkpoint).
      const partial = resultOf(err)
      expect(partial?.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
      expect(partial?.checkpoint?.path).toMatch(/checkpoint_000001$/)
      expect(partial?.busOutages).toHaveLength(1)
      expect(stoppedAt).toBeGreaterThan(started)
      const ev = await events(partial!.path)
      expect(ev.some((x) => x.type === "bus-expired")).toBe(true)
    } finally {
      await server.stop()
    }
  })
})

describe("failures of our own side surface", () => {
  it("a checkpoint the object store cannot hold is retried, recorded in the Result and events.jsonl, and training goes on", async () => {
    // A real full store: JetStream limited to a few KiB, smaller than any checkpoint of the model.
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-fullstore-"))
    const server = await launchNatsServer({
      maxPayload: 8 * 1024 * 1024,
      jetstream: false,
      extraConfig: `jetstream { store_dir: "${dir}", max_file_store: 16384, max_memory_store: 16384 }`
    })
    try {
      const onCheckpoint: string[] = []
      const r = await withAgent(server, "full", () =>
        new Trainer({
          trainLoopPerWorker: LOOP,
          trainLoopConfig: { epochs: 2 },
          scalingConfig: { numWorkers: 2 },
          runConfig: {
            name: "store-full",
            storagePath: storage,
            progress: false,
            checkpointConfig: { objectStore: "tiny" },
            callbacks: [
              { onCheckpoint: ({ path: p }) => void onCheckpoint.push(p) },
              {
                onReport: () => {
                  throw new Error("a user callback that throws")
                }
              }
            ]
          },
          datasets: { train, test },
          cluster: { address: server.url, clusterName: "full" }
        }).fit()
      )
      expect(r.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
      expect(r.checkpoint).toBeUndefined()
      expect(onCheckpoint).toEqual([])
      expect(r.checkpointErrors.map((c) => c.round)).toEqual([0, 1])
      expect(r.checkpointErrors.every((c) => c.attempts === 3 && c.message.length > 0)).toBe(true)
      const ev = await events(r.path)
      expect(ev.filter((e) => e.type === "checkpoint-error")).toHaveLength(2)
      // The throwing callback is logged with its message each round, not dropped, not fatal.
      const cb = ev.filter((e) => e.type === "callback-error")
      expect(cb).toHaveLength(2)
      expect(cb[0]).toMatchObject({ callback: "onReport", message: "a user callback that throws" })
    } finally {
      await server.stop()
      await fs.rm(dir, { recursive: true, force: true })
    }
  })
})
