// Checkpoints in a JetStream object store (runConfig.checkpointConfig.objectStore) against a real
// nats-server with JetStream: the store's round trips, pruning and crash safety, a server without
// JetStream refused before training, and a Trainer run on a joined cluster that checkpoints into
// the bucket and resumes from it.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { randomBytes } from "node:crypto"
import { Objm } from "@nats-io/obj"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"
import { ConfigError } from "../core/errors.ts"
import { launchNatsServer, liveNatsServerPids, type NatsServerProcess } from "../core/nats-server.ts"
import { openNats } from "../core/connection.ts"
import { startHeadAgent, type HeadAgent } from "./support/head-agent.ts"
import { ObjectCheckpointStore, parseObjectCheckpointUrl, readObjectCheckpoint } from "../actors/train/driver/object-checkpoint-store.ts"
import { resolveTrainerOptions } from "../actors/train/driver/trainer.ts"

const LOOP = path.resolve("examples/digits/train.ts") + "#trainLoop"
const bytes = (s: string) => new TextEncoder().encode(s)

let server: NatsServerProcess
let conn: Awaited<ReturnType<typeof openNats>>
let storage: string

beforeAll(async () => {
  server = await launchNatsServer({ maxPayload: 8 * 1024 * 1024 })
  conn = await openNats({ servers: server.url, name: "object store test" })
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-objckpt-"))
})
afterAll(async () => {
  await conn?.close()
  await server?.stop()
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

const objectNames = async (bucket: string, prefix: string): Promise<string[]> => {
  const store = await new Objm(conn.nc).open(bucket)
  return (await store.list()).filter((i) => !i.deleted && i.name.startsWith(prefix)).map((i) => i.name).sort()
}

describe("ObjectCheckpointStore", () => {
  it("saves, reads back, ranks and prunes checkpoints, and reopens where it left off", async () => {
    const policy = { numToKeep: 2, scoreAttribute: "acc", scoreOrder: "max" } as const
    const store = await ObjectCheckpointStore.open(conn.nc, "unit", "run-a", policy)
    const big = new Uint8Array(randomBytes(3 * 1024 * 1024 + 17)) // several chunks
    const first = await store.save({ files: { "model.json": bytes("{}"), "sub/w.bin": big }, metadata: { epoch: 0 } }, { acc: 0.5 })
    expect(first.path).toBe("nats-obj://unit/run-a/checkpoint_000000")
    const back = await store.read(first.path)
    expect(Buffer.from(back.files["sub/w.bin"]).equals(Buffer.from(big))).toBe(true)
    expect(new TextDecoder().decode(back.files["model.json"])).toBe("{}")
    expect(back.metadata).toEqual({ epoch: 0 })
    expect(back.metrics).toEqual({ acc: 0.5 })
    // Readable without the store too (what a restore from a path does).
    expect((await readObjectCheckpoint(conn.nc, first.path)).metrics).toEqual({ acc: 0.5 })

    for (const acc of [0.9, 0.7, 0.6]) await store.save({ files: { "w.bin": new Uint8Array([Math.round(acc * 10)]) }, metadata: {} }, { acc })
    // Best two by acc (0.9, 0.7) plus the latest (0.6); 0.5 pruned, objects and all.
    expect(store.list().map((e) => e.name).sort()).toEqual(["checkpoint_000001", "checkpoint_000002", "checkpoint_000003"])
    expect(store.best().map((e) => e.metrics.acc)).toEqual([0.9, 0.7, 0.6])
    expect(store.latest()?.name).toBe("checkpoint_000003")
    expect(await objectNames("unit", "run-a/checkpoint_000000/")).toEqual([])
    expect(await objectNames("unit", "run-a/checkpoint_000001/")).toEqual(["run-a/checkpoint_000001/gradwire_checkpoint.json", "run-a/checkpoint_000001/w.bin"])
    await expect(store.read(first.path)).rejects.toBeInstanceOf(ConfigError)

    const reopened = await ObjectCheckpointStore.open(conn.nc, "unit", "run-a", policy)
    expect(reopened.list().map((e) => e.name)).toEqual(store.list().map((e) => e.name))
    expect(reopened.latest()?.path).toBe("nats-obj://unit/run-a/checkpoint_000003")
    expect([...(await reopened.read(reopened.latest()!.path)).files["w.bin"]]).toEqual([6])
    const next = await reopened.save({ files: {}, metadata: {} }, { acc: 0.1 })
    expect(next.index).toBe(4)
    // Another run in the same bucket is a separate index.
    expect((await ObjectCheckpointStore.open(conn.nc, "unit", "run-b")).list()).toEqual([])
  })

  it("ignores and deletes the objects of a save interrupted before its index entry", async () => {
    const store = await ObjectCheckpointStore.open(conn.nc, "unit", "run-c")
    await store.save({ files: { "w.bin": new Uint8Array([1]) }, metadata: { epoch: 0 } }, { loss: 1 })
    // A crash mid-upload: checkpoint 1's files (and even its metadata object) are there, the index
    // was never rewritten.
    await store.os.putBlob({ name: "run-c/checkpoint_000001/w.bin" }, new Uint8Array(300_000))
    await store.os.putBlob({ name: "run-c/checkpoint_000001/gradwire_checkpoint.json" }, bytes('{"files":["w.bin"]}'))
    await store.os.putBlob({ name: "run-c/checkpoint_000002/model.json" }, bytes("{}"))
    const reopened = await ObjectCheckpointStore.open(conn.nc, "unit", "run-c")
    expect(reopened.list().map((e) => e.name)).toEqual(["checkpoint_000000"])
    expect(reopened.latest()?.path).toBe("nats-obj://unit/run-c/checkpoint_000000")
    expect(await objectNames("unit", "run-c/")).toEqual([
      "run-c/checkpoint_000000/gradwire_checkpoint.json",
      "run-c/checkpoint_000000/w.bin",
      "run-c/checkpoints.json"
    ])
    expect((await reopened.save({ files: {}, metadata: {} }, {})).name).toBe("checkpoint_000001")
  })

  it("parses checkpoint URLs and refuses what is not a checkpoint", async () => {
    expect(parseObjectCheckpointUrl("nats-obj://ckpts/run/checkpoint_000003")).toEqual({ bucket: "ckpts", prefix: "run/checkpoint_000003" })
    expect(() => parseObjectCheckpointUrl("nats-obj://bad.bucket/x")).toThrow(ConfigError)
    await expect(readObjectCheckpoint(conn.nc, "nats-obj://unit/nope/checkpoint_000000")).rejects.toThrow(/not a gradwire checkpoint/)
  })

  it("validates the bucket name in checkpointConfig.objectStore", () => {
    const opts = (objectStore: unknown) => ({ trainLoopPerWorker: LOOP, scalingConfig: { numWorkers: 1 }, runConfig: { checkpointConfig: { objectStore } } }) as never
    expect(resolveTrainerOptions(opts("ckpts_1-a")).run.checkpointConfig?.objectStore).toBe("ckpts_1-a")
    for (const bad of ["a.b", "a b", "a/b", "", 3]) {
      let err: unknown
      try {
        resolveTrainerOptions(opts(bad))
      } catch (e) {
        err = e
      }
      expect(err).toBeInstanceOf(ConfigError)
      expect((err as ConfigError).field).toMatch(/checkpointConfig\.objectStore/)
    }
  })

  it("refuses a cluster whose NATS server has no JetStream, before training starts", async () => {
    const plain = await launchNatsServer({ jetstream: false })
    try {
      const t0 = Date.now()
      const err = await new Trainer({
        trainLoopPerWorker: LOOP,
        scalingConfig: { numWorkers: 1 },
        runConfig: { name: "nojs", storagePath: storage, progress: false, checkpointConfig: { objectStore: "ckpts" } },
        cluster: { address: plain.url }
      } as never)
        .fit()
        .then(() => undefined, (e: unknown) => e)
      expect(err).toBeInstanceOf(ConfigError)
      expect((err as ConfigError).field).toBe("runConfig.checkpointConfig.objectStore")
      expect((err as ConfigError).message).toMatch(/no JetStream[\s\S]*-js[\s\S]*gradwire start --head/)
      expect(Date.now() - t0).toBeLessThan(10_000)
    } finally {
      await plain.stop()
    }
  })
})

describe("Trainer with checkpointConfig.objectStore", () => {
  let agent: HeadAgent | undefined
  let train: ArrayDataset
  let test: ArrayDataset

  beforeAll(async () => {
    ;({ train, test } = trainTestSplit(await loadDigits(), 0.2, 7))
    agent = await startHeadAgent(server.url, "objtest", "object store test agent")
  })
  afterAll(async () => {
    await agent?.stop()
  })

  const fit = (epochs: number) =>
    new Trainer({
      trainLoopPerWorker: LOOP,
      trainLoopConfig: { epochs },
      scalingConfig: { numWorkers: 2 },
      runConfig: { name: "objrun", storagePath: storage, progress: false, checkpointConfig: { objectStore: "ckpts", numToKeep: 1 } },
      datasets: { train, test },
      cluster: { address: server.url, clusterName: "objtest" }
    }).fit()

  it("checkpoints into the bucket and resumes from it in a run with the same name", async () => {
    const first = await fit(2)
    expect(first.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    expect(first.checkpoint?.path).toBe("nats-obj://ckpts/objrun/checkpoint_000001")
    expect(first.bestCheckpoints.map((c) => c.path)).toEqual(["nats-obj://ckpts/objrun/checkpoint_000001"])
    // numToKeep 1: checkpoint 0 is gone from the bucket; nothing went to the run directory.
    expect(await objectNames("ckpts", "objrun/checkpoint_000000/")).toEqual([])
    const names = await objectNames("ckpts", "objrun/")
    expect(names).toContain("objrun/checkpoints.json")
    expect(names).toContain("objrun/checkpoint_000001/gradwire_checkpoint.json")
    expect(names.length).toBeGreaterThan(3)
    const dir = await fs.readdir(first.path)
    expect(dir).toContain("metrics.jsonl")
    expect(dir.filter((f) => f.startsWith("checkpoint"))).toEqual([])

    const second = await fit(3)
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([2])
    expect(second.checkpoint?.path).toBe("nats-obj://ckpts/objrun/checkpoint_000002")
    expect(second.metrics!.val_accuracy as number).toBeGreaterThan(0.5)
  })

  it("on the embedded cluster keeps the bucket's data in the run directory, so a rerun resumes", async () => {
    const fitEmbedded = (epochs: number) =>
      new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { epochs },
        scalingConfig: { numWorkers: 2 },
        runConfig: { name: "embrun", storagePath: storage, progress: false, checkpointConfig: { objectStore: "ckpts" } },
        datasets: { train, test }
      }).fit()
    const first = await fitEmbedded(1)
    expect(first.checkpoint?.path).toBe("nats-obj://ckpts/embrun/checkpoint_000000")
    expect(await fs.readdir(first.path)).toContain("jetstream")
    const second = await fitEmbedded(2)
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([1])
    expect(second.checkpoint?.path).toBe("nats-obj://ckpts/embrun/checkpoint_000001")
    expect(second.bestCheckpoints).toHaveLength(2)
  })
})
