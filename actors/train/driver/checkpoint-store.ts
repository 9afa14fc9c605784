// Checkpoints on disk under a run directory: written atomically (a temp directory, fsynced, then
// renamed into place, so a crash mid-write never leaves a checkpoint that looks complete), indexed
// in checkpoints.json, pruned to the best numToKeep by score (the latest is always kept, because a
// restart resumes from it).
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { randomBytes } from "node:crypto"
import { ConfigError } from "../../../core/errors.ts"
import { writeFileAtomic, writeFileSynced } from "../../../core/atomic-file.ts"
import type { ObjectStoreLocation } from "./result.ts"

export interface CheckpointEntry {
  /** Directory name under the run directory, e.g. checkpoint_000003. */
  readonly name: string
  readonly path: string
  readonly index: number
  readonly metrics: Record<string, unknown>
  readonly createdAt: number
}

export interface CheckpointData {
  readonly files: Record<string, Uint8Array>
  readonly metadata: Record<string, unknown>
}

export interface CheckpointPolicy {
  readonly numToKeep?: number
  readonly scoreAttribute?: string
  readonly scoreOrder?: "max" | "min"
}

/**
 * What the trainer needs of a checkpoint store: this file's CheckpointStore (a directory under
 * storagePath) and ObjectCheckpointStore (a JetStream object store bucket) both provide it.
 */
export interface CheckpointStorage {
  readonly policy: CheckpointPolicy
  /** Where an object store's checkpoints can be read back from (the Result's checkpoints carry it). */
  readonly location?: ObjectStoreLocation
  list(): ReadonlyArray<CheckpointEntry>
  latest(): CheckpointEntry | undefined
  best(): ReadonlyArray<CheckpointEntry>
  save(data: CheckpointData, metrics: Record<string, unknown>): Promise<CheckpointEntry>
  /** Reads a checkpoint back by its CheckpointEntry.path. */
  read(path: string): Promise<CheckpointData & { metrics: Record<string, unknown> }>
  /** A checkpoint's metadata alone (its files unread); {} when it has none. */
  metadataOf(path: string): Promise<Record<string, unknown>>
}

/**
 * One checkpoint saved in up to `attempts` tries, 0.5 s, 1 s, ... apart (a full disk or a
 * restarting object store may get better; a ConfigError, such as a bad file name, will not and
 * ends it at once): the entry, or the last error with the tries it took.
 */
export const saveWithRetries = async (
  store: CheckpointStorage,
  data: CheckpointData,
  metrics: Record<string, unknown>,
  attempts: number
): Promise<{ readonly entry: CheckpointEntry } | { readonly error: unknown; readonly tries: number }> => {
  let lastError: unknown
  for (let attempt = 1; attempt <= attempts; attempt++) {
    try {
      return { entry: await store.save(data, metrics) }
    } catch (e) {
      lastError = e
      if (e instanceof ConfigError) return { error: e, tries: attempt }
      if (attempt < attempts) await new Promise((r) => setTimeout(r, 500 * 2 ** (attempt - 1)))
    }
  }
  return { error: lastError, tries: attempts }
}

export const checkpointName = (index: number): string => `checkpoint_${String(index).padStart(6, "0")}`

/** The entry with the highest index (the newest), if any. */
export const latestOf = (entries: ReadonlyArray<CheckpointEntry>): CheckpointEntry | undefined =>
  entries.reduce<CheckpointEntry | undefined>((a, e) => (!a || e.index > a.index ? e : a), undefined)

/** Entries ordered best first by the score attribute (or newest first without one). */
export const bestOf = (entries: ReadonlyArray<CheckpointEntry>, policy: CheckpointPolicy): CheckpointEntry[] => {
  const attr = policy.scoreAttribute
  const sign = policy.scoreOrder === "min" ? 1 : -1
  const sorted = [...entries]
  if (!attr) return sorted.sort((a, b) => b.index - a.index)
  const score = (e: CheckpointEntry): number => {
    const v = e.metrics[attr]
    return typeof v === "number" && Number.isFinite(v) ? v : sign > 0 ? Infinity : -Infinity
  }
  return sorted.sort((a, b) => sign * (score(a) - score(b)) || b.index - a.index)
}

/** The entries numToKeep keeps: the best numToKeep by score, plus the latest (a restart resumes from it). */
export const keptBy = (entries: ReadonlyArray<CheckpointEntry>, policy: CheckpointPolicy): Set<string> => {
  const keep = policy.numToKeep
  if (!keep || entries.length <= keep) return new Set(entries.map((e) => e.name))
  const kept = new Set(bestOf(entries, policy).slice(0, keep).map((e) => e.name))
  const latest = latestOf(entries)
  if (latest) kept.add(latest.name)
  return kept
}

const INDEX = "checkpoints.json"
const META = "gradwire_checkpoint.json"

export const CHECKPOINT_META = META

export const safeFileName = (name: string): string => {
  const norm = path.posix.normalize(name)
  if (name.length === 0 || norm.startsWith("..") || path.isAbsolute(norm) || norm.includes("\0") || norm === META) {
    throw new ConfigError({ field: "checkpoint.files", reason: `"${name}" is not an allowed file name inside a checkpoint` })
  }
  return norm
}

/**
 * A run directory's kept checkpoints, as its index lists them, without changing anything: only those
 * whose directory exists (the index is rewritten after each rename, so a crash between the two can
 * leave one extra directory but never a ghost). None when there is no index yet.
 */
export const readCheckpointIndex = async (dir: string): Promise<CheckpointEntry[]> => {
  let index: { entries?: ReadonlyArray<Omit<CheckpointEntry, "path">> }
  try {
    index = JSON.parse(await fs.readFile(path.join(dir, INDEX), "utf8")) as typeof index
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT" || e instanceof SyntaxError) return []
    throw e
  }
  const entries: CheckpointEntry[] = []
  for (const e of index.entries ?? []) {
    const p = path.join(dir, e.name)
    if (await fs.stat(p).then(() => true, () => false)) entries.push({ ...e, path: p })
  }
  return entries
}

/** Each kept checkpoint's line of the index, made once: an entry does not change after its save. */
const indexLines = new WeakMap<CheckpointEntry, string>()

/**
 * The index file's text: `{ "entries": [...] }`, one entry (without its path) per line. A run that
 * keeps every checkpoint rewrites the index after each save, and serialising it whole each time
 * made a save's CPU grow with the checkpoints kept; each entry's line is now made once (3000 saves of
 * a keep-all store: 2.2-2.8 s of user CPU against 4.8-5.7 s, docs/benchmarks.md).
 */
export const indexJson = (entries: ReadonlyArray<CheckpointEntry>): string => {
  const lines = entries.map((e) => {
    let line = indexLines.get(e)
    if (line === undefined) {
      const { path: _p, ...rest } = e
      line = JSON.stringify(rest)
      indexLines.set(e, line)
    }
    return line
  })
  return lines.length === 0 ? `{\n  "entries": []\n}\n` : `{\n  "entries": [\n    ${lines.join(",\n    ")}\n  ]\n}\n`
}

export class CheckpointStore implements CheckpointStorage {
  readonly dir: string
  readonly policy: CheckpointPolicy
  private entries: CheckpointEntry[] = []
  private nextIndex = 0

  private constructor(dir: string, policy: CheckpointPolicy) {
    this.dir = dir
    this.policy = policy
  }

  /** Opens (creating if needed) the store of a run directory, dropping leftovers of interrupted writes. */
  static async open(dir: string, policy: CheckpointPolicy = {}): Promise<CheckpointStore> {
    const store = new CheckpointStore(dir, policy)
    await fs.mkdir(dir, { recursive: true })
    for (const name of await fs.readdir(dir)) {
      if (name.startsWith(".tmp-checkpoint")) await fs.rm(path.join(dir, name), { recursive: true, force: true })
    }
    // No index yet (or one unreadable): a fresh run.
    store.entries = await readCheckpointIndex(dir).catch(() => [])
    store.nextIndex = store.entries.reduce((m, e) => Math.max(m, e.index + 1), 0)
    return store
  }

  list(): ReadonlyArray<CheckpointEntry> {
    return this.entries
  }

  latest(): CheckpointEntry | undefined {
    return latestOf(this.entries)
  }

  /** Checkpoints ordered best first by the score attribute (or newest first without one). */
  best(): ReadonlyArray<CheckpointEntry> {
    return bestOf(this.entries, this.policy)
  }

  read(dir: string): Promise<CheckpointData & { metrics: Record<string, unknown> }> {
    return readCheckpoint(dir)
  }

  async metadataOf(dir: string): Promise<Record<string, unknown>> {
    const meta = JSON.parse(await fs.readFile(path.join(dir, META), "utf8")) as { metadata?: Record<string, unknown> }
    return meta.metadata ?? {}
  }

  /** Persists a checkpoint atomically and prunes to numToKeep; returns its entry. */
  async save(data: CheckpointData, metrics: Record<string, unknown>): Promise<CheckpointEntry> {
    // The number is taken only once the checkpoint is in place: a failed write (full disk) that is
    // retried gets the same one, so checkpoint numbers stay consecutive.
    const index = this.nextIndex
    const name = checkpointName(index)
    const tmp = path.join(this.dir, `.tmp-${name}-${randomBytes(4).toString("hex")}`)
    await fs.mkdir(tmp, { recursive: true })
    try {
      for (const [file, bytes] of Object.entries(data.files)) {
        const rel = safeFileName(file)
        await fs.mkdir(path.dirname(path.join(tmp, rel)), { recursive: true })
        await writeFileSynced(path.join(tmp, rel), bytes)
      }
      await writeFileSynced(path.join(tmp, META), JSON.stringify({ metadata: data.metadata, metrics, index }, null, 2))
      const final = path.join(this.dir, name)
      await fs.rm(final, { recursive: true, force: true })
      await fs.rename(tmp, final)
      this.nextIndex = index + 1
    } catch (e) {
      await fs.rm(tmp, { recursive: true, force: true })
      throw e
    }
    const entry: CheckpointEntry = { name, path: path.join(this.dir, name), index, metrics, createdAt: Date.now() }
    this.entries.push(entry)
    try {
      await this.prune()
      await this.writeIndex()
    } catch (e) {
      // Not in the index, so it does not count: a retry writes it again under the same number.
      this.entries = this.entries.filter((x) => x !== entry)
      this.nextIndex = index
      throw e
    }
    return entry
  }

  private async prune(): Promise<void> {
    const keep = this.policy.numToKeep
    if (!keep || this.entries.length <= keep) return
    const kept = keptBy(this.entries, this.policy)
    const drop = this.entries.filter((e) => !kept.has(e.name))
    this.entries = this.entries.filter((e) => kept.has(e.name))
    await this.writeIndex()
    for (const e of drop) await fs.rm(e.path, { recursive: true, force: true })
  }

  private writeIndex(): Promise<void> {
    return writeFileAtomic(path.join(this.dir, INDEX), indexJson(this.entries))
  }
}

/** Reads every file of a checkpoint directory back, with its metadata. */
export const readCheckpoint = async (dir: string): Promise<CheckpointData & { metrics: Record<string, unknown> }> => {
  const files: Record<string, Uint8Array> = {}
  const walk = async (sub: string): Promise<void> => {
    for (const d of await fs.readdir(path.join(dir, sub), { withFileTypes: true })) {
      const rel = sub ? `${sub}/${d.name}` : d.name
      if (d.isDirectory()) await walk(rel)
      else if (rel !== META) files[rel] = new Uint8Array(await fs.readFile(path.join(dir, rel)))
    }
  }
  let meta: { metadata?: Record<string, unknown>; metrics?: Record<string, unknown> }
  try {
    meta = JSON.parse(await fs.readFile(path.join(dir, META), "utf8"))
  } catch {
    const exists = await fs.stat(dir).then(() => true, () => false)
    throw new ConfigError({
      field: "checkpoint",
      reason: exists
        ? `${dir} is not a gradwire checkpoint (no ${META}); pass a checkpoint_NNNNNN directory of a run`
        : `${dir} does not exist; pass a checkpoint_NNNNNN directory of a run (result.checkpoint, or one of loadResult(runDir)'s)`
    })
  }
  await walk("")
  return { files, metadata: meta.metadata ?? {}, metrics: meta.metrics ?? {} }
}
