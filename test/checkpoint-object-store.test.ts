// Checkpoints in a JetStream object store (runConfig.checkpointConfig.objectStore) against a real
// nats-server with JetStream: the store's round trips, pruning and crash safety, a server without
// JetStream refused before training, a Trainer run on a joined cluster that checkpoints into
// the bucket and resumes from it, and reading such checkpoints back: loadCheckpointModel and
// fetchCheckpoint (over NATS with the caller's credentials, or from the embedded cluster's data in
// the run directory), loadResult(dir) listing them, and the errors that say what to pass.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { randomBytes } from "node:crypto"
import { Objm } from "@nats-io/obj"
import { Trainer, fetchCheckpoint, loadCheckpointModel, loadDigits, loadEngine, loadResult, trainTestSplit, type ArrayDataset, type CheckpointInfo, type Result } from "../index.ts"
import { ConfigError } from "../core/errors.ts"
import { freePort, launchNatsServer, liveNatsServerPids, type NatsServerProcess } from "../core/nats-server.ts"
import { openNats } from "../core/connection.ts"
import { startHeadAgent, type HeadAgent } from "./support/head-agent.ts"
import { OBJECT_CHECKPOINTS_FILE, ObjectCheckpointStore, parseObjectCheckpointUrl, readObjectCheckpoint } from "../actors/train/driver/object-checkpoint-store.ts"
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

/** A ConfigError's message, or a failure of the test when the promise resolved or rejected with another error. */
const configError = async (p: Promise<unknown>): Promise<string> => {
  const e = await p.then(() => undefined, (err: unknown) => err)
  expect(e).toBeInstanceOf(ConfigError)
  return (e as ConfigError).message
}

describe("fetchCheckpoint from a cluster whose NATS server takes credentials", () => {
  it("needs the credentials the run used, passed by the caller, and never records them", async () => {
    const authed = await launchNatsServer({ auth: { user: "gw", password: "s3cret-pw" } })
    const runDir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-objckpt-auth-"))
    const c = await openNats({ servers: authed.url, name: "object store auth test", user: "gw", pass: "s3cret-pw" })
    try {
      const location = { servers: [authed.url], credentials: 'user "gw" with a password' }
      const store = await ObjectCheckpointStore.open(c.nc, "authckpts", "authrun", {}, undefined, { runDir, location })
      const saved = await store.save({ files: { "w.bin": new Uint8Array([1, 2, 3]), "sub/x.json": bytes("{}") }, metadata: {} }, { loss: 0.5 })
      const info: CheckpointInfo = { path: saved.path, metrics: saved.metrics, objectStore: location }
      // The run directory's record names the checkpoint and where it is, without the password.
      const record = await fs.readFile(path.join(runDir, OBJECT_CHECKPOINTS_FILE), "utf8")
      expect(JSON.parse(record).entries.map((e: { path: string }) => e.path)).toEqual([saved.path])
      expect(record).not.toContain("s3cret-pw")

      expect(await configError(fetchCheckpoint(info))).toMatch(/reached with user "gw" with a password; gradwire never keeps credentials[\s\S]*fetchCheckpoint\(checkpoint, \{ user, password \}\)/)
      expect(await configError(loadCheckpointModel(info))).toMatch(/"loadCheckpointModel"[\s\S]*loadCheckpointModel\(checkpoint, \{ user, password \}\)/)
      const wrong = await configError(fetchCheckpoint(info, { user: "gw", password: "nope" }))
      expect(wrong).toMatch(/cannot reach the NATS server at .*user "gw" with a password.*pass the credentials/)
      expect(wrong).not.toContain("nope")
      const files = await fetchCheckpoint(info, { user: "gw", password: "s3cret-pw" })
      expect(Object.keys(files).sort()).toEqual(["sub/x.json", "w.bin"])
      expect([...files["w.bin"]]).toEqual([1, 2, 3])
      // The same through a bare path and the address, credentials in the URL.
      const u = new URL(authed.url)
      expect([...(await fetchCheckpoint(saved.path, { address: `nats://gw:s3cret-pw@${u.host}` }))["w.bin"]]).toEqual([1, 2, 3])
    } finally {
      await c.close()
      await authed.stop()
      await fs.rm(runDir, { recursive: true, force: true })
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

  /** The model's accuracy on the test rows, computed here. */
  const accuracyOf = async (model: Awaited<ReturnType<typeof loadCheckpointModel>>): Promise<number> => {
    const { tf } = await loadEngine("cpu")
    const pred = tf.tidy(() => (model.predict(tf.tensor2d(test.x, [test.size, 64])) as import("@tensorflow/tfjs").Tensor).argMax(-1))
    const p = (await pred.data()) as Int32Array
    pred.dispose()
    return p.filter((c, i) => c === test.y[i]).length / test.size
  }

  let joined: Result | undefined

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
    // (the rerun's history goes on from the first fit()'s rounds, its report number read from the bucket's checkpoint)
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(second.checkpoint?.path).toBe("nats-obj://ckpts/objrun/checkpoint_000002")
    expect(second.metrics!.val_accuracy as number).toBeGreaterThan(0.5)
    joined = second
  })

  it("loads the Result's checkpoint from the bucket with loadCheckpointModel, as accurate as the run reported", async () => {
    const r = joined!
    // The checkpoint says where its bucket is: the servers the run used, no credentials needed here.
    expect(r.checkpoint?.objectStore).toEqual({ servers: [server.url] })
    const { tf } = await loadEngine("cpu")
    const model = await loadCheckpointModel(tf, r.checkpoint!)
    expect(await accuracyOf(model)).toBeCloseTo(r.metrics!.val_accuracy as number, 2)
    // Without tf, on gradwire's engine: the same weights.
    const again = await loadCheckpointModel(r.checkpoint!)
    const flat = (m: typeof model): number[] => m.getWeights().flatMap((w) => [...(w.dataSync() as Float32Array)])
    expect(flat(again)).toEqual(flat(model))
    // fetchCheckpoint gives the files the checkpoint holds, as the store reads them.
    const files = await fetchCheckpoint(r.checkpoint!)
    expect(Object.keys(files)).toEqual(expect.arrayContaining(["model.json", "weights.bin"]))
    expect(Buffer.from(files["weights.bin"]).equals(Buffer.from((await readObjectCheckpoint(conn.nc, r.checkpoint!.path)).files["weights.bin"]))).toBe(true)
  })

  it("loadResult(dir) lists the run's checkpoints in the bucket, and they load", async () => {
    const r = joined!
    expect(await fs.readdir(r.path)).toContain(OBJECT_CHECKPOINTS_FILE)
    const back = await loadResult(r.path)
    expect(back.checkpoint).toEqual({ path: "nats-obj://ckpts/objrun/checkpoint_000002", metrics: r.checkpoint!.metrics, objectStore: { servers: [server.url] } })
    expect(back.bestCheckpoints.map((c) => c.path)).toEqual(r.bestCheckpoints.map((c) => c.path))
    expect(back.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    const model = await loadCheckpointModel(back.bestCheckpoints[0])
    expect(await accuracyOf(model)).toBeCloseTo(r.metrics!.val_accuracy as number, 2)
  })

  it("says what to pass for a bare nats-obj:// path, an unreachable server, a missing bucket and bad arguments", async () => {
    const url = joined!.checkpoint!.path
    expect(await configError(loadCheckpointModel(url))).toMatch(/nats-obj:\/\/ckpts\/objrun\/checkpoint_000002 is in an object store, and a bare path does not say on which NATS server: pass its address, loadCheckpointModel\(checkpoint, \{ address: /)
    expect(Object.keys(await fetchCheckpoint(url, { address: server.url }))).toContain("model.json")
    const closed = `nats://127.0.0.1:${await freePort()}`
    expect(await configError(fetchCheckpoint(url, { address: closed }))).toMatch(/cannot reach the NATS server at nats:\/\/127\.0\.0\.1:\d+, whose object store holds .*start that cluster again/)
    // A Result's checkpoint whose cluster is gone says so too, and that { address } may point elsewhere.
    const gone: CheckpointInfo = { ...joined!.checkpoint!, objectStore: { servers: [closed] } }
    expect(await configError(loadCheckpointModel(gone))).toMatch(/cannot reach[\s\S]*or pass \{ address \} of a server of it/)
    expect(await configError(fetchCheckpoint("nats-obj://nobucket/objrun/checkpoint_000002", { address: server.url }))).toMatch(/cannot open object store bucket "nobucket"/)
    expect(await configError(loadCheckpointModel(joined!.checkpoint!, { adress: server.url } as never))).toMatch(/unknown option\(s\) adress/)
    expect(await configError(loadCheckpointModel({} as never, joined!.checkpoint! as never))).toMatch(/first argument is not tfjs/)
    expect(await configError(fetchCheckpoint(undefined as never))).toMatch(/got undefined for the checkpoint: pass result\.checkpoint/)
  })

  it("on the embedded cluster keeps the bucket's data in the run directory, so a rerun resumes", async () => {
    const fitEmbedded = (epochs: number, name = "embrun", resumeFromCheckpoint?: CheckpointInfo) =>
      new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { epochs },
        scalingConfig: { numWorkers: 2 },
        runConfig: { name, storagePath: storage, progress: false, checkpointConfig: { objectStore: "ckpts" } },
        datasets: { train, test },
        ...(resumeFromCheckpoint ? { resumeFromCheckpoint } : {})
      }).fit()
    const first = await fitEmbedded(1)
    expect(first.checkpoint?.path).toBe("nats-obj://ckpts/embrun/checkpoint_000000")
    expect(await fs.readdir(first.path)).toContain("jetstream")
    const second = await fitEmbedded(2)
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([0, 1])
    expect(second.checkpoint?.path).toBe("nats-obj://ckpts/embrun/checkpoint_000001")
    expect(second.bestCheckpoints).toHaveLength(2)

    // The run's server stopped with fit(): the checkpoint is read from its data in the run
    // directory, through a server started for the read and stopped after it.
    const jetstreamDir = path.join(second.path, "jetstream")
    expect(second.checkpoint?.objectStore).toEqual({ jetstreamDir })
    const servers = liveNatsServerPids().length
    const model = await loadCheckpointModel(second.checkpoint!)
    expect(await accuracyOf(model)).toBeCloseTo(second.metrics!.val_accuracy as number, 2)
    expect(liveNatsServerPids()).toHaveLength(servers)
    expect(await fs.readdir(second.path)).not.toContain(".fit-lock")
    const back = await loadResult(second.path)
    expect(back.bestCheckpoints.map((c) => c.path).sort()).toEqual(["nats-obj://ckpts/embrun/checkpoint_000000", "nats-obj://ckpts/embrun/checkpoint_000001"])
    expect(back.checkpoint).toEqual({ path: second.checkpoint!.path, metrics: second.checkpoint!.metrics, objectStore: { jetstreamDir } })
    const oldest = back.bestCheckpoints.find((c) => c.path.endsWith("000000"))!
    expect(Object.keys(await fetchCheckpoint(oldest))).toContain("weights.bin")

    // Another run resumes from it, Ray's resume_from_checkpoint: read from the first run's data,
    // where this run's own embedded cluster has no such bucket (before, it was looked for there)
    const other = await fitEmbedded(3, "embrun-next", second.checkpoint!)
    expect(other.metricsHistory.map((m) => m.epoch)).toEqual([2])
    expect(other.checkpoint?.path).toBe("nats-obj://ckpts/embrun-next/checkpoint_000000")
    expect(liveNatsServerPids()).toHaveLength(servers)

    // While a fit() of the run holds its directory (and its server the data), it says to wait.
    const lock = path.join(second.path, ".fit-lock")
    await fs.writeFile(lock, JSON.stringify({ pid: process.ppid, host: os.hostname(), since: new Date().toISOString() }))
    try {
      expect(await configError(loadCheckpointModel(back.checkpoint!))).toMatch(/which the embedded nats-server of a fit\(\) in process \d+ .*has open: read it once that fit\(\) has returned/)
    } finally {
      await fs.rm(lock, { force: true })
    }
    expect(liveNatsServerPids()).toHaveLength(servers)
    // Data deleted or moved: said so, with what to do.
    const moved: CheckpointInfo = { ...back.checkpoint!, objectStore: { jetstreamDir: path.join(storage, "gone", "jetstream") } }
    expect(await configError(loadCheckpointModel(moved))).toMatch(/whose nats-server stopped with fit\(\)[\s\S]*which is not there[\s\S]*loadResult\(<its new path>\)/)
  })
})
