// Checkpoints in a JetStream object store bucket, for clusters whose machines share no filesystem
// (runConfig.checkpointConfig.objectStore). Same contract as the directory store: a checkpoint's
// files are the objects `<run>/checkpoint_NNNNNN/<file>` plus `<run>/checkpoint_NNNNNN/gradwire_checkpoint.json`,
// and the index object `<run>/checkpoints.json` is written LAST, so a checkpoint counts only once
// every object of it is complete. Objects of a checkpoint the index does not name (an upload cut
// short by a crash) are deleted on open. Pruning rewrites the index first, then deletes objects.
// A checkpoint's path is `nats-obj://<bucket>/<run>/checkpoint_NNNNNN`. The driver also records the
// index in the run directory (`object_checkpoints.json`: the paths, their metrics, and where the
// bucket is, never a secret), so loadResult(dir) lists the run's checkpoints without NATS.
import * as path from "node:path"
import type { NatsConnection } from "@nats-io/nats-core"
import { Objm, setSha256Backend, type ObjectStore } from "@nats-io/obj"
import { ConfigError } from "../../../core/errors.ts"
import { writeFileAtomic } from "../../../core/atomic-file.ts"
import type { ObjectStoreLocation } from "./result.ts"
import {
  CHECKPOINT_META,
  bestOf,
  checkpointName,
  keptBy,
  latestOf,
  readCheckpoint,
  safeFileName,
  type CheckpointData,
  type CheckpointEntry,
  type CheckpointPolicy,
  type CheckpointStorage
} from "./checkpoint-store.ts"

// The object store hashes every chunk with SHA-256 on put and get; node:crypto's hash is about 4x
// faster than the default pure-JS one, and it is fed chunk by chunk (each update a fraction of a
// millisecond), so the event loop is never held for a whole checkpoint.
setSha256Backend("native")

export const OBJECT_URL_PREFIX = "nats-obj://"
const INDEX = "checkpoints.json"
/** Chunk size of checkpoint objects (the client clamps it to the server's max_payload). */
const CHUNK = 1024 * 1024

export const isObjectCheckpointUrl = (p: string): boolean => p.startsWith(OBJECT_URL_PREFIX)

export const objectCheckpointUrl = (bucket: string, prefix: string): string => `${OBJECT_URL_PREFIX}${bucket}/${prefix}`

/** Splits `nats-obj://<bucket>/<run>/checkpoint_NNNNNN` into the bucket and the object prefix. */
export const parseObjectCheckpointUrl = (url: string): { bucket: string; prefix: string } => {
  const m = /^nats-obj:\/\/([-\w]+)\/(.+?)\/*$/.exec(url)
  if (!m) {
    throw new ConfigError({
      field: "checkpoint",
      reason: `${url} is not an object store checkpoint; expected nats-obj://<bucket>/<run name>/checkpoint_NNNNNN`
    })
  }
  return { bucket: m[1], prefix: m[2] }
}

/** The run directory's record of an object store run's checkpoints (loadResult reads it). */
export const OBJECT_CHECKPOINTS_FILE = "object_checkpoints.json"

/** What `object_checkpoints.json` holds: the bucket's index as of the last save, with each checkpoint's path. */
export interface ObjectCheckpointsRecord {
  readonly bucket: string
  /** The servers, credentials (in words) and TLS files of a joined cluster; `embedded` for the embedded one, whose data is `<run directory>/jetstream`. */
  readonly location: Omit<ObjectStoreLocation, "jetstreamDir"> & { readonly embedded?: boolean }
  readonly entries: ReadonlyArray<CheckpointEntry>
}

/** Where the run directory records an object store run's checkpoints, and where the bucket is. */
export interface ObjectCheckpointsRecordOptions {
  readonly runDir: string
  readonly location: ObjectStoreLocation
}

const isNoJetStream = (e: unknown): boolean =>
  /jetstream not enabled|no responders|503|jetstream.*not.*(enabled|available)|JetStreamNotEnabled/i.test(String((e as Error)?.message ?? e))

/**
 * Opens (creating if needed) a bucket. A server without JetStream is a ConfigError saying how to
 * fix it, raised before any training starts.
 */
export const openCheckpointBucket = async (nc: NatsConnection, bucket: string, where = "the NATS server"): Promise<ObjectStore> => {
  try {
    return await new Objm(nc).create(bucket)
  } catch (e) {
    if (isNoJetStream(e)) {
      throw new ConfigError({
        field: "runConfig.checkpointConfig.objectStore",
        reason:
          `${where} has no JetStream, which the object store "${bucket}" needs: start nats-server with -js ` +
          "(or a jetstream {} block in its config; `gradwire start --head` starts one with JetStream on), or drop objectStore " +
          `to keep checkpoints under storagePath (${String((e as Error)?.message ?? e)})`
      })
    }
    throw e
  }
}

const utf8 = new TextEncoder()
const fromUtf8 = new TextDecoder()

interface IndexEntry {
  readonly name: string
  readonly index: number
  readonly metrics: Record<string, unknown>
  readonly createdAt: number
  readonly files: ReadonlyArray<string>
}

interface MetaObject {
  readonly metadata?: Record<string, unknown>
  readonly metrics?: Record<string, unknown>
  readonly index?: number
  readonly files?: ReadonlyArray<string>
}

const readJson = async <T>(os: ObjectStore, name: string): Promise<T | undefined> => {
  const bytes = await os.getBlob(name)
  return bytes === null ? undefined : (JSON.parse(fromUtf8.decode(bytes)) as T)
}

const deleteQuietly = async (os: ObjectStore, name: string): Promise<void> => {
  await os.delete(name).catch(() => undefined)
}

/** Reads every file of an object store checkpoint back, with its metadata. */
export const readObjectCheckpoint = async (
  nc: NatsConnection,
  url: string,
  bucketStore?: { readonly bucket: string; readonly os: ObjectStore }
): Promise<CheckpointData & { metrics: Record<string, unknown> }> => {
  const { bucket, prefix } = parseObjectCheckpointUrl(url)
  let os: ObjectStore
  if (bucketStore && bucketStore.bucket === bucket) os = bucketStore.os
  else {
    try {
      os = await new Objm(nc).open(bucket)
    } catch (e) {
      throw new ConfigError({ field: "checkpoint", reason: `cannot open object store bucket "${bucket}" of ${url}: ${String((e as Error)?.message ?? e)}` })
    }
  }
  const meta = await readJson<MetaObject>(os, `${prefix}/${CHECKPOINT_META}`)
  if (!meta) {
    throw new ConfigError({
      field: "checkpoint",
      reason: `${url} is not a gradwire checkpoint (no ${CHECKPOINT_META} object); pass the path of a checkpoint of a run`
    })
  }
  const files: Record<string, Uint8Array> = {}
  for (const f of meta.files ?? []) {
    const bytes = await os.getBlob(`${prefix}/${f}`)
    if (bytes === null) throw new ConfigError({ field: "checkpoint", reason: `${url} is incomplete: its object ${f} is missing` })
    files[f] = bytes
  }
  return { files, metadata: meta.metadata ?? {}, metrics: meta.metrics ?? {} }
}

export class ObjectCheckpointStore implements CheckpointStorage {
  readonly nc: NatsConnection
  readonly bucket: string
  readonly run: string
  readonly policy: CheckpointPolicy
  readonly os: ObjectStore
  readonly location: ObjectStoreLocation | undefined
  private readonly record: ObjectCheckpointsRecordOptions | undefined
  private entries: CheckpointEntry[] = []
  private readonly files = new Map<string, ReadonlyArray<string>>()
  private nextIndex = 0

  private constructor(nc: NatsConnection, os: ObjectStore, bucket: string, run: string, policy: CheckpointPolicy, record?: ObjectCheckpointsRecordOptions) {
    this.nc = nc
    this.os = os
    this.bucket = bucket
    this.run = run
    this.policy = policy
    this.record = record
    this.location = record?.location
  }

  /**
   * Opens (creating if needed) the bucket and the run's index in it, and deletes the objects of
   * checkpoints the index does not name (uploads interrupted before their index entry was written).
   */
  static async open(
    nc: NatsConnection,
    bucket: string,
    run: string,
    policy: CheckpointPolicy = {},
    where?: string,
    record?: ObjectCheckpointsRecordOptions
  ): Promise<ObjectCheckpointStore> {
    const os = await openCheckpointBucket(nc, bucket, where)
    const store = new ObjectCheckpointStore(nc, os, bucket, run, policy, record)
    const index = (await readJson<{ entries?: IndexEntry[] }>(os, `${run}/${INDEX}`)) ?? { entries: [] }
    const listed = new Set((index.entries ?? []).map((e) => e.name))
    const objects = new Map<string, string[]>()
    const present = new Set<string>()
    const runPrefix = `${run}/`
    for (const info of await os.list()) {
      if (info.deleted || !info.name.startsWith(runPrefix)) continue
      const rest = info.name.slice(runPrefix.length)
      const slash = rest.indexOf("/")
      if (slash < 0 || !rest.startsWith("checkpoint_")) continue
      const ckpt = rest.slice(0, slash)
      objects.set(ckpt, [...(objects.get(ckpt) ?? []), info.name])
      if (rest.slice(slash + 1) === CHECKPOINT_META) present.add(ckpt)
    }
    for (const [ckpt, names] of objects) {
      if (listed.has(ckpt) && present.has(ckpt)) continue
      for (const name of names) await deleteQuietly(os, name)
    }
    // Trust the index only for checkpoints whose metadata object exists (it is written after the
    // files and before the index, so its presence means the upload completed).
    for (const e of index.entries ?? []) {
      if (!present.has(e.name)) continue
      store.entries.push({ name: e.name, index: e.index, metrics: e.metrics, createdAt: e.createdAt, path: store.url(e.name) })
      store.files.set(e.name, e.files)
    }
    store.nextIndex = store.entries.reduce((m, e) => Math.max(m, e.index + 1), 0)
    await store.writeRecord()
    return store
  }

  /** The path (URL) of a checkpoint of this run. */
  url(name: string): string {
    return objectCheckpointUrl(this.bucket, `${this.run}/${name}`)
  }

  list(): ReadonlyArray<CheckpointEntry> {
    return this.entries
  }

  latest(): CheckpointEntry | undefined {
    return latestOf(this.entries)
  }

  best(): ReadonlyArray<CheckpointEntry> {
    return bestOf(this.entries, this.policy)
  }

  /** Reads a checkpoint back: a nats-obj:// URL (this bucket or another), or a local checkpoint directory. */
  read(p: string): Promise<CheckpointData & { metrics: Record<string, unknown> }> {
    return isObjectCheckpointUrl(p) ? readObjectCheckpoint(this.nc, p, { bucket: this.bucket, os: this.os }) : readCheckpoint(p)
  }

  async metadataOf(p: string): Promise<Record<string, unknown>> {
    if (!isObjectCheckpointUrl(p)) return this.read(p).then((c) => c.metadata)
    const { bucket, prefix } = parseObjectCheckpointUrl(p)
    if (bucket !== this.bucket) return this.read(p).then((c) => c.metadata)
    return (await readJson<MetaObject>(this.os, `${prefix}/${CHECKPOINT_META}`))?.metadata ?? {}
  }

  /** Uploads a checkpoint's objects, then its index entry (last), and prunes to numToKeep. */
  async save(data: CheckpointData, metrics: Record<string, unknown>): Promise<CheckpointEntry> {
    // The number is taken only once the checkpoint counts: a failed upload (object store full or
    // down) that is retried gets the same one.
    const index = this.nextIndex
    const name = checkpointName(index)
    const prefix = `${this.run}/${name}`
    const files = Object.keys(data.files).map((f) => [f, safeFileName(f)] as const)
    const written: string[] = []
    const entry: CheckpointEntry = { name, path: this.url(name), index, metrics, createdAt: Date.now() }
    const before = this.entries
    const all = [...this.entries, entry]
    const kept = keptBy(all, this.policy)
    const drop = all.filter((e) => !kept.has(e.name))
    try {
      for (const [file, rel] of files) {
        written.push(`${prefix}/${rel}`)
        await this.os.putBlob({ name: `${prefix}/${rel}`, options: { max_chunk_size: CHUNK } }, data.files[file])
      }
      const meta: MetaObject = { metadata: data.metadata, metrics, index, files: files.map(([, rel]) => rel) }
      written.push(`${prefix}/${CHECKPOINT_META}`)
      await this.os.putBlob({ name: `${prefix}/${CHECKPOINT_META}` }, utf8.encode(JSON.stringify(meta)))
      this.files.set(name, files.map(([, rel]) => rel))
      this.entries = all.filter((e) => kept.has(e.name))
      // The index goes last: only now does the new checkpoint count, and the pruned ones stop
      // counting before their objects go.
      await this.writeIndex()
    } catch (e) {
      this.entries = before
      this.files.delete(name)
      for (const n of written) await deleteQuietly(this.os, n)
      throw e
    }
    this.nextIndex = index + 1
    for (const e of drop) {
      for (const f of this.files.get(e.name) ?? []) await deleteQuietly(this.os, `${this.run}/${e.name}/${f}`)
      await deleteQuietly(this.os, `${this.run}/${e.name}/${CHECKPOINT_META}`)
      this.files.delete(e.name)
    }
    await this.writeRecord()
    return entry
  }

  /**
   * The run directory's copy of the index (object_checkpoints.json). It is a convenience for
   * loadResult: the bucket's index stays the truth, so a failed write costs no checkpoint.
   */
  private async writeRecord(): Promise<void> {
    if (!this.record) return
    const { jetstreamDir, ...where } = this.record.location
    const record: ObjectCheckpointsRecord = {
      bucket: this.bucket,
      location: { ...where, ...(jetstreamDir !== undefined ? { embedded: true } : {}) },
      entries: this.entries
    }
    await writeFileAtomic(path.join(this.record.runDir, OBJECT_CHECKPOINTS_FILE), `${JSON.stringify(record, null, 2)}\n`).catch(() => undefined)
  }

  private async writeIndex(): Promise<void> {
    const entries: IndexEntry[] = this.entries.map((e) => ({
      name: e.name,
      index: e.index,
      metrics: e.metrics,
      createdAt: e.createdAt,
      files: this.files.get(e.name) ?? []
    }))
    await this.os.putBlob({ name: `${this.run}/${INDEX}` }, utf8.encode(JSON.stringify({ entries }, null, 2)))
  }
}
