// A run's Result read back from its directory after the fact, as Ray's Result.from_path: for an
// inference script or a notebook in another process than the one that called fit(). The run
// directory holds everything a Result says: metrics.jsonl (rank 0's rounds), metrics_per_rank.jsonl,
// checkpoints.json (the kept checkpoints and their metrics; config.json's checkpointConfig orders
// them; for a run with checkpointConfig.objectStore, object_checkpoints.json: the bucket's index
// as the driver last wrote it, and where the bucket is), events.jsonl (restarts, resizes, checkpoint errors, outages). A run resumed under the same
// name appends to the same files, so this is the whole run, every fit() of it: its metrics history is
// the current lineage of those files' rows (a round made again after a restart or a resume replaces
// the rows from it on), as fit()'s Result has it.
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { ConfigError } from "../../../core/errors.ts"
import { bestOf, latestOf, readCheckpointIndex, type CheckpointEntry } from "./checkpoint-store.ts"
import { OBJECT_CHECKPOINTS_FILE, type ObjectCheckpointsRecord } from "./object-checkpoint-store.ts"
import { currentLineage, rowMetrics } from "../common/observe/run-recorder.ts"
import type { BusOutage, CheckpointError, CheckpointInfo, ObjectStoreLocation, Resize, Result } from "./result.ts"

/** The rows of a JSON-lines file of the run directory ([] when it is missing; a line cut short is skipped). */
export const readJsonLines = async (file: string): Promise<Array<Record<string, unknown>>> => {
  let text: string
  try {
    text = await fs.readFile(file, "utf8")
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT") return []
    throw e
  }
  const out: Array<Record<string, unknown>> = []
  for (const line of text.split("\n")) {
    if (line.trim() === "") continue
    try {
      out.push(JSON.parse(line) as Record<string, unknown>)
    } catch {
      // a line cut short by a driver killed while writing it
    }
  }
  return out
}

const json = async <T>(file: string): Promise<T | undefined> => {
  try {
    return JSON.parse(await fs.readFile(file, "utf8")) as T
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === "ENOENT" || e instanceof SyntaxError) return undefined
    throw e
  }
}

/**
 * The Result of the run whose directory is `dir` (result.path, or storagePath/name), read from its
 * files: every round of every fit() of it (each row without the report index and time the recorder
 * adds), its kept checkpoints (best first by checkpointConfig's scoreAttribute), and its restarts,
 * resizes, checkpoint errors and NATS outages. Checkpoints kept in an object store
 * (checkpointConfig.objectStore) are listed from the directory's record of the bucket's index, each
 * with where its bucket is (loadCheckpointModel fetches it from there).
 */
export const loadResult = async (dir: string): Promise<Result> => {
  const runDir = path.resolve(dir)
  const config = await json<{ runConfig?: { checkpointConfig?: { scoreAttribute?: string; scoreOrder?: "min" | "max"; objectStore?: string } } }>(path.join(runDir, "config.json"))
  if (!config) {
    throw new ConfigError({
      field: "loadResult",
      reason: `${runDir} is not a run directory (no config.json): pass result.path, or storagePath joined with the run's name`
    })
  }
  const rows = currentLineage(await readJsonLines(path.join(runDir, "metrics.jsonl")), (r) => Number(r.report))
  const metricsHistory = rows.map(rowMetrics)
  const metricsPerRank = currentLineage(await readJsonLines(path.join(runDir, "metrics_per_rank.jsonl")), (r) => Number(r.report)).map((r) =>
    Array.isArray(r.ranks) ? (r.ranks as Array<Record<string, unknown>>) : []
  )
  // The last fit() of the run says where its checkpoints are: the directory or a bucket.
  const inBucket = config.runConfig?.checkpointConfig?.objectStore !== undefined
  const record = inBucket ? await json<ObjectCheckpointsRecord>(path.join(runDir, OBJECT_CHECKPOINTS_FILE)) : undefined
  const entries = inBucket ? [...(record?.entries ?? [])] : await readCheckpointIndex(runDir)
  let where: ObjectStoreLocation | undefined
  if (record) {
    const { embedded, ...joined } = record.location
    // The embedded cluster's data is where the directory is now, also when it was moved.
    where = embedded === true ? { jetstreamDir: path.join(runDir, "jetstream") } : joined
  }
  const info = (e: CheckpointEntry): CheckpointInfo => ({ path: e.path, metrics: e.metrics, ...(where ? { objectStore: where } : {}) })
  const latest = latestOf(entries)
  const policy = config.runConfig?.checkpointConfig ?? {}
  const events = await readJsonLines(path.join(runDir, "events.jsonl"))
  const of = (type: string) => events.filter((e) => e.type === type)
  const restarts = of("restart")
  const serverRestarts = of("nats-server-restart").map((e) => Date.parse(String(e.time)))
  const outages: BusOutage[] = [...of("bus-up"), ...of("bus-expired")].map((e) => {
    const end = Date.parse(String(e.time))
    const ms = Number(e.ms) || 0
    return { time: new Date(end - ms).toISOString(), server: String(e.server ?? ""), ms, serverRestarted: serverRestarts.some((t) => t >= end - ms && t <= end) }
  })
  return {
    metrics: metricsHistory.at(-1),
    metricsHistory,
    metricsPerRank,
    checkpoint: latest ? info(latest) : undefined,
    bestCheckpoints: bestOf(entries, policy).map(info),
    path: runDir,
    restarts: restarts.length,
    countedFailures: restarts.filter((e) => e.counted === true).length,
    resizes: of("resize").map((e) => ({ time: String(e.time), attempt: Number(e.attempt), from: Number(e.from), to: Number(e.to), reason: String(e.reason) }) satisfies Resize),
    checkpointErrors: of("checkpoint-error").map((e) => ({ time: String(e.time), round: Number(e.round), message: String(e.message), attempts: Number(e.attempts) }) satisfies CheckpointError),
    busOutages: outages,
    natsServerRestarts: serverRestarts.length
  }
}
