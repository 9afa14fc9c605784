// The Trainer's options as users give them, and their resolution: every config validated (a bad
// value is a ConfigError naming the field) and defaulted before anything starts.
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { existsSync } from "node:fs"
import {
  CollectiveConfig,
  RunConfig,
  ScalingConfig,
  defaultStoragePath,
  expandHome,
  parseTrainLoopRef,
  resolveClusterConfig,
  type ClusterConfig,
  type TrainLoopRef
} from "../../../core/config.ts"
import type { ConnectionSpec } from "../../../core/connection-spec.ts"
import { decodeConfig } from "../../../core/validate.ts"
import { BUCKET_SIZE_MIB, COLLECTIVE_TIMEOUT_MS, FIRST_BUCKET_SIZE_MIB, NATS_OUTAGE_TIMEOUT_MS } from "../../../core/defaults.ts"
import { ConfigError } from "../../../core/errors.ts"
import type { ArrayDataset } from "../../../core/datasets.ts"
import { isDatasetFactorySpec, isFileDatasetSpec, type DatasetFactorySpec, type FileDatasetSpec } from "../../../core/data/file-spec.ts"
import { parseCompressionConfig } from "../../../collectives/compression/index.ts"
import { parseAlgorithmChoice } from "../../../collectives/algorithms/index.ts"
import { resolveStrategy, type StrategyConfigInput } from "../worker/strategies/index.ts"
import { resolveLocalSgd, type LocalSgdSettings } from "../common/optim/outer-optimizer.ts"
import type { WorkerArgs } from "../common/train-protocol.ts"
import type { GroupFailure, TrainerState } from "./failure-policy.ts"
import type { ObjectStoreLocation } from "./result.ts"

/** What `datasets` takes: in-memory arrays, files (fromFiles), or a worker-side factory (datasetFactory). */
export type DatasetInput = ArrayDataset | FileDatasetSpec | DatasetFactorySpec

/**
 * A train loop function as the driver sees it: any function (its parameters are the worker's
 * business, see TrainLoop in train-context.ts), so this module stays free of the worker's types.
 */
export type AnyTrainLoop = (...args: never[]) => unknown

export interface TrainerCallbacks {
  /** After every report round (all ranks reported): rank 0's metrics and every rank's. */
  onReport?(info: { index: number; metrics: Record<string, unknown>; perRank: ReadonlyArray<Record<string, unknown>> }): void | Promise<void>
  onCheckpoint?(info: { path: string; metrics: Record<string, unknown> }): void | Promise<void>
  onRestart?(info: { attempt: number; failure: GroupFailure }): void | Promise<void>
  onStateChange?(info: { from: TrainerState; to: TrainerState; attempt: number }): void
  /** Step progress of a rank (rate-limited by the workers to a few per second, plus each epoch's last step): `loss` is the step's, `meanLoss` the mean over the epoch so far (or, without epochs, since the last report), `samples` this rank's since the attempt began. */
  onProgress?(info: { attempt: number; rank: number; epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number; meanLoss?: number }): void
}

export interface TrainerOptions {
  /** The loop each worker runs: "./train.ts#trainLoop", a URL, { module, export }, or the function itself when a module exports it (not a closure, not in the driver's own script). */
  readonly trainLoopPerWorker: string | URL | TrainLoopRef | AnyTrainLoop
  readonly trainLoopConfig?: unknown
  readonly scalingConfig: ScalingConfig
  readonly runConfig?: RunConfig & { callbacks?: ReadonlyArray<TrainerCallbacks> }
  /**
   * Named datasets; each worker reads its shard with ctx.getDatasetShard(name): in-memory arrays
   * (makeDataset), files each worker streams its own rows of (fromFiles), or a loader that runs on
   * each worker (datasetFactory).
   */
  readonly datasets?: Readonly<Record<string, DatasetInput>>
  readonly collectiveConfig?: CollectiveConfig
  /** Omitted: an embedded local cluster. { address }: a cluster started with `gradwire start`. */
  readonly cluster?: ClusterConfig
  /**
   * A checkpoint to start from, as Ray's resume_from_checkpoint: another run's result.checkpoint (or
   * one of its bestCheckpoints), a checkpoint directory, or a nats-obj:// checkpoint (default: this
   * run's latest, when the run exists). A bare nats-obj:// path is read from this run's cluster; a
   * Result's checkpoint that another embedded run kept in its bucket (`objectStore.jetstreamDir`)
   * from that run's data.
   */
  readonly resumeFromCheckpoint?: string | { readonly path: string; readonly objectStore?: ObjectStoreLocation }
  /** Seed of the data shuffles. */
  readonly seed?: number
}

export interface Resolved {
  readonly loop: TrainLoopRef & { export: string }
  readonly loopConfig: unknown
  readonly scaling: ScalingConfig
  readonly run: RunConfig
  readonly callbacks: ReadonlyArray<TrainerCallbacks>
  readonly collective: WorkerArgs["collective"]
  /** A joined cluster: its name and how to reach it (credentials parsed out of the address). */
  readonly cluster: { readonly clusterName: string; readonly connection: ConnectionSpec } | undefined
  readonly datasets: Readonly<Record<string, DatasetInput>>
  readonly name: string
  readonly runDir: string
  readonly resumeFrom: string | undefined
  /** Where resumeFrom's bucket is, where a Result's checkpoint (CheckpointInfo.objectStore) said so. */
  readonly resumeFromStore: ObjectStoreLocation | undefined
  readonly maxFailures: number
  /** World size bounds (equal unless numWorkers is { min, max }). */
  readonly minWorkers: number
  readonly maxWorkers: number
  readonly elasticBatch: "keep-global" | "keep-per-worker"
  readonly natsOutageTimeoutMs: number
  readonly recoverFrom: "peers" | "checkpoint"
  /** Why recoverFrom is "checkpoint" where the run left it unset (no survivor holds the whole state: the strategy's reason). */
  readonly recoverFromWhy?: string
  /** failureConfig.parityEvery: report rounds between state-parity checks (0: none). */
  readonly parityEvery: number
  /** failureConfig.spares: standby workers kept ready beside the group (refill.ts). */
  readonly spares: number
  readonly seed: number
}

const TOP_LEVEL = new Set([
  "trainLoopPerWorker",
  "trainLoopConfig",
  "scalingConfig",
  "runConfig",
  "datasets",
  "collectiveConfig",
  "cluster",
  "resumeFromCheckpoint",
  "seed"
])

const resolveModule = (module: string): string => {
  if (/^[a-z]+:/.test(module)) return module
  const file = expandHome(module)
  if (path.isAbsolute(file) || file.startsWith(".")) return pathToFileURL(path.resolve(file)).href
  return module
}

/**
 * On the embedded cluster (workers on this machine), a loop module that is a local file must exist:
 * a ConfigError before anything starts, instead of every worker failing to import it. Trainer.fit
 * calls it (resolving the options alone touches no file).
 */
export const checkLoopModule = (options: TrainerOptions, resolved: Resolved): void => {
  const module = resolved.loop.module
  if (options.cluster !== undefined || !module.startsWith("file:")) return
  const file = fileURLToPath(module)
  if (existsSync(file)) return
  const given = parseTrainLoopRef(options.trainLoopPerWorker).module
  throw new ConfigError({
    field: "trainLoopPerWorker",
    reason:
      `${file} does not exist` +
      (given.startsWith(".")
        ? ` (a relative path is taken from the current directory, ${process.cwd()}, not from the driver's file; for a module beside the driver write { module: new URL("${given}", import.meta.url).href, export: ... })`
        : "")
  })
}

/**
 * trainLoopConfig goes to every worker process as data (msgpack): what would not arrive as it was
 * given is a ConfigError naming its place, instead of a loop that finds a field missing (a function,
 * dropped) or changed (a class instance, which arrives as its fields; a Map, as an object).
 */
export const checkLoopConfig = (value: unknown, at = "trainLoopConfig", seen = new Set<object>()): void => {
  const fail = (reason: string): never => {
    throw new ConfigError({ field: at, reason })
  }
  if (typeof value === "function") {
    fail(
      "is a function: the config goes to the workers, separate processes, as data, and a function cannot go with it; " +
        "pass what it is made from (numbers, strings) and make it in the loop, or export it from a module the loop imports"
    )
  }
  if (typeof value === "symbol") fail("is a symbol, which cannot go to the workers: pass a string")
  if (typeof value !== "object" || value === null) return
  if (ArrayBuffer.isView(value) || value instanceof ArrayBuffer || value instanceof Date || value instanceof RegExp) return
  if (seen.has(value)) fail("refers back to itself (a cycle): the config goes to the workers as a tree of data")
  seen.add(value)
  if (value instanceof Map) fail("is a Map, which the workers would get as a plain object: pass an object, or an array of [key, value] pairs")
  if (value instanceof Set) {
    for (const v of value) checkLoopConfig(v, `${at}[]`, seen)
  } else if (Array.isArray(value)) {
    value.forEach((v, i) => checkLoopConfig(v, `${at}[${i}]`, seen))
  } else {
    const proto = Object.getPrototypeOf(value)
    if (proto !== Object.prototype && proto !== null) {
      const name = (value as { constructor?: { name?: string } }).constructor?.name || "a class"
      fail(
        (typeof (value as { dataSync?: unknown }).dataSync === "function"
          ? "is a tensor: pass its values (await t.array()) and make the tensor in the loop"
          : `is a ${name} instance: the workers would get its fields alone, without its class (methods, getters); pass plain data and make the ${name} in the loop`)
      )
    }
    for (const [k, v] of Object.entries(value)) checkLoopConfig(v, `${at}.${k}`, seen)
  }
  seen.delete(value)
}

/** resumeFromCheckpoint as a path: a CheckpointInfo's, or the string (a directory, "~" for home; or a nats-obj:// URL). */
const resumeFromOf = (given: unknown): string | undefined => {
  if (given === undefined) return undefined
  const p = typeof given === "string" ? given : typeof given === "object" && given !== null && typeof (given as { path?: unknown }).path === "string" ? (given as { path: string }).path : undefined
  if (p === undefined || p === "") {
    throw new ConfigError({
      field: "resumeFromCheckpoint",
      reason: `takes a checkpoint: another run's result.checkpoint (or one of its bestCheckpoints), a checkpoint directory, or a nats-obj:// checkpoint; got ${given === null ? "null" : typeof given === "object" ? "an object without a path" : JSON.stringify(given)}`
    })
  }
  if (p.startsWith("file:")) return fileURLToPath(p)
  return /^[a-z][a-z0-9+.-]*:\/\//i.test(p) ? p : path.resolve(expandHome(p))
}

/** A CheckpointInfo's `objectStore`: where the run that kept it had its bucket. */
const objectStoreOf = (given: unknown): ObjectStoreLocation | undefined => {
  const where = typeof given === "object" && given !== null ? (given as { objectStore?: unknown }).objectStore : undefined
  return typeof where === "object" && where !== null ? (where as ObjectStoreLocation) : undefined
}

const checkDataset = (name: string, ds: unknown): DatasetInput => {
  if (isFileDatasetSpec(ds) || isDatasetFactorySpec(ds)) return ds
  const d = ds as Partial<ArrayDataset> | undefined
  if (!d || !(d.x instanceof Float32Array) || !(d.y instanceof Int32Array || d.y instanceof Float32Array) || !Array.isArray(d.featureShape)) {
    throw new ConfigError({
      field: `datasets.${name}`,
      reason:
        "a dataset is in-memory arrays { x: Float32Array, y: Int32Array | Float32Array, featureShape, size, numClasses } (makeDataset / loadDigits), " +
        'files (fromFiles("data/*.csv", { label: "label" }) or fromFiles("nats-obj://bucket/prefix")), or a worker-side loader (datasetFactory("./data.ts#load"))'
    })
  }
  return d as ArrayDataset
}

/** Validates everything before anything starts; throws ConfigError naming the field. */
export const resolveTrainerOptions = (options: TrainerOptions): Resolved => {
  if (typeof options !== "object" || options === null) {
    throw new ConfigError({ field: "Trainer", reason: "pass an options object: new Trainer({ trainLoopPerWorker, scalingConfig, ... })" })
  }
  for (const key of Object.keys(options)) {
    if (!TOP_LEVEL.has(key)) throw new ConfigError({ field: key, reason: `unknown option; allowed: ${[...TOP_LEVEL].join(", ")}` })
  }
  const ref = parseTrainLoopRef(options.trainLoopPerWorker)
  if (options.scalingConfig === undefined) throw new ConfigError({ field: "scalingConfig", reason: "required, e.g. { numWorkers: 4 }" })
  const scaling = decodeConfig(ScalingConfig, options.scalingConfig, "scalingConfig")
  const { callbacks, ...runRest } = options.runConfig ?? {}
  const run = decodeConfig(RunConfig, runRest, "runConfig")
  if (callbacks !== undefined && (!Array.isArray(callbacks) || callbacks.some((c) => typeof c !== "object" || c === null))) {
    throw new ConfigError({ field: "runConfig.callbacks", reason: "an array of objects with optional onReport/onCheckpoint/onRestart/onStateChange/onProgress methods" })
  }
  const coll = decodeConfig(CollectiveConfig, options.collectiveConfig ?? {}, "collectiveConfig")
  const compression = parseCompressionConfig(coll.compression, "collectiveConfig.compression")
  const zeroStage = coll.zeroStage ?? 0
  if (zeroStage === 2 && compression !== "none") {
    throw new ConfigError({
      field: "collectiveConfig.compression",
      reason:
        `zeroStage 2 reduce-scatters the gradients, which the compressors (they work on all-reduce) do not do; got ${JSON.stringify(compression)}. ` +
        `Use zeroStage 1 with compression, or zeroStage 2 with wireDtype "float16" (half the bytes)`
    })
  }
  const strategy = coll.strategy ?? "allreduce"
  // The registry owns the names: an unknown one is refused here, listing the registered ones.
  const entry = resolveStrategy(strategy)
  // Local SGD: no gradient is exchanged; the group's reducer carries the outer rounds with localSgd.compression.
  const local = resolveLocalSgdOptions(coll, strategy, zeroStage, compression)
  const backupWorkers = coll.backupWorkers ?? 0
  const psMode = coll.parameterServer?.mode ?? "sync"
  const numServers = coll.parameterServer?.numServers ?? 1
  const minWorkersAsked = typeof scaling.numWorkers === "number" ? scaling.numWorkers : scaling.numWorkers.min
  if (coll.parameterServer !== undefined && !entry.servers) {
    throw new ConfigError({ field: "collectiveConfig.parameterServer", reason: `configures the parameter servers, but strategy is "${strategy}": add strategy: "parameter-server"` })
  }
  const input: StrategyConfigInput = { strategy, collective: coll, compression, zeroStage, localSgd: local?.settings, minWorkers: minWorkersAsked }
  entry.validate?.(input)
  if (backupWorkers > 0) {
    if (strategy !== "parameter-server" || psMode !== "sync") {
      throw new ConfigError({ field: "collectiveConfig.backupWorkers", reason: `backup workers drop the slowest gradients of a synchronous step: use strategy "parameter-server" with parameterServer.mode "sync"` })
    }
    if (backupWorkers >= minWorkersAsked) {
      throw new ConfigError({ field: "collectiveConfig.backupWorkers", reason: `must be below the number of workers (${minWorkersAsked}), got ${backupWorkers}: each step needs at least one gradient` })
    }
  }
  // Where no survivor holds the whole training state, a failure restarts from the checkpoint.
  const peersCannot = entry.peersCannot(input)
  if (peersCannot && run.failureConfig?.recoverFrom === "peers") {
    throw new ConfigError({
      field: "runConfig.failureConfig.recoverFrom",
      reason: `"peers" regroups the surviving workers from their own state, but ${peersCannot}: leave recoverFrom unset (it is "checkpoint" then)`
    })
  }
  const cluster = options.cluster === undefined ? undefined : resolveClusterConfig(options.cluster)
  const datasets: Record<string, DatasetInput> = {}
  for (const [k, v] of Object.entries(options.datasets ?? {})) datasets[k] = checkDataset(k, v)
  const name = run.name ?? `gradwire_${new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "_")}`
  const storage = path.resolve(run.storagePath !== undefined ? expandHome(run.storagePath) : defaultStoragePath())
  if (options.seed !== undefined && !Number.isInteger(options.seed)) throw new ConfigError({ field: "seed", reason: `an integer, got ${String(options.seed)}` })
  // A file dataset's epoch is planned again at a regroup from what each rank trained (fit-loop.ts).
  const recoverFrom = run.failureConfig?.recoverFrom ?? (peersCannot ? "checkpoint" : "peers")
  if (coll.parameterServer?.replicas === true && (numServers < 2 || recoverFrom === "checkpoint")) {
    throw new ConfigError({
      field: "collectiveConfig.parameterServer.replicas",
      reason:
        numServers < 2
          ? "each server keeps its replica on another server: use numServers >= 2, or leave replicas unset"
          : `a lost server is made again from its replica while the workers go on, but this run restarts from the checkpoint (recoverFrom "checkpoint"${run.failureConfig?.recoverFrom === undefined ? `, the default here: ${peersCannot}` : ""}): leave replicas unset`
    })
  }
  if ((run.failureConfig?.spares ?? 0) > 0 && recoverFrom === "checkpoint") {
    throw new ConfigError({
      field: "runConfig.failureConfig.spares",
      reason:
        `spare workers join the survivors of a failure, but this run restarts every worker from the checkpoint (recoverFrom "checkpoint"` +
        `${run.failureConfig?.recoverFrom === undefined ? `, the default here: ${peersCannot}` : ""}): leave spares at 0`
    })
  }
  checkLoopConfig(options.trainLoopConfig ?? {})
  return {
    loop: { module: resolveModule(ref.module), export: ref.export ?? "default" },
    loopConfig: options.trainLoopConfig ?? {},
    scaling,
    run,
    callbacks: (callbacks ?? []) as ReadonlyArray<TrainerCallbacks>,
    collective: {
      // 'auto' (the default) is resolved on the workers from the measured topology (actors/train/worker/auto-config.ts).
      algorithm: parseAlgorithmChoice(coll.algorithm, "collectiveConfig.algorithm"),
      compression: local ? local.compression : compression,
      adaptiveBatching: coll.adaptiveBatching ?? false,
      zeroStage,
      // ZeRO recovering from peers keeps a replica of each rank's optimizer shard on the next rank.
      ...(zeroStage > 0 && recoverFrom === "peers" ? { zeroReplica: true } : {}),
      strategy,
      backupWorkers,
      ...(local ? { localSgd: local.settings } : {}),
      ...(entry.servers
        ? { parameterServer: { numServers, mode: psMode, staleness: coll.parameterServer?.staleness ?? 2, replicas: numServers > 1 && (coll.parameterServer?.replicas ?? recoverFrom === "peers") } }
        : {}),
      bucketSizeMiB: coll.bucketSizeMiB ?? BUCKET_SIZE_MIB,
      firstBucketSizeMiB: coll.firstBucketSizeMiB ?? FIRST_BUCKET_SIZE_MIB,
      wireDtype: coll.wireDtype ?? "float32",
      timeoutMs: coll.timeoutMs ?? COLLECTIVE_TIMEOUT_MS,
      // Explicit: used as given; otherwise derived from measured steps, capped at the default.
      ...(coll.timeoutMs !== undefined ? { timeoutFixed: true } : {}),
      transport: coll.transport ?? "auto"
    },
    cluster,
    datasets,
    name,
    runDir: path.join(storage, name),
    resumeFrom: resumeFromOf(options.resumeFromCheckpoint),
    resumeFromStore: objectStoreOf(options.resumeFromCheckpoint),
    maxFailures: run.failureConfig?.maxFailures ?? 0,
    minWorkers: typeof scaling.numWorkers === "number" ? scaling.numWorkers : scaling.numWorkers.min,
    maxWorkers: typeof scaling.numWorkers === "number" ? scaling.numWorkers : scaling.numWorkers.max,
    elasticBatch: scaling.elasticBatch ?? "keep-global",
    natsOutageTimeoutMs: run.failureConfig?.natsOutageTimeoutMs ?? NATS_OUTAGE_TIMEOUT_MS,
    recoverFrom,
    ...(run.failureConfig?.recoverFrom === undefined && peersCannot ? { recoverFromWhy: peersCannot } : {}),
    parityEvery: run.failureConfig?.parityEvery ?? 1,
    spares: run.failureConfig?.spares ?? 0,
    seed: options.seed ?? 0
  }
}


/**
 * collectiveConfig.localSgd, checked against the rest of collectiveConfig: only with strategy
 * "local-sgd", which combines neither with parameter servers nor ZeRO, and takes its codec in
 * localSgd.compression (no gradient is exchanged, so collectiveConfig.compression would compress nothing).
 */
const resolveLocalSgdOptions = (
  coll: CollectiveConfig,
  strategy: string,
  zeroStage: number,
  compression: unknown
): { readonly settings: LocalSgdSettings; readonly compression: ReturnType<typeof parseCompressionConfig> } | undefined => {
  if (strategy === "auto" && coll.localSgd !== undefined) {
    // A candidate of the automatic strategy: its rounds go through the gradient reducer, with collectiveConfig.compression.
    if ((coll.localSgd as { compression?: unknown }).compression !== undefined) {
      throw new ConfigError({ field: "collectiveConfig.localSgd.compression", reason: `under strategy "auto" local SGD's rounds use collectiveConfig.compression: move the codec there` })
    }
    return { settings: resolveLocalSgd(coll.localSgd), compression: compression as ReturnType<typeof parseCompressionConfig> }
  }
  if (strategy !== "local-sgd") {
    if (coll.localSgd !== undefined) {
      throw new ConfigError({ field: "collectiveConfig.localSgd", reason: `configures local SGD, but strategy is "${strategy}": add strategy: "local-sgd" (or "auto", which may move to it)` })
    }
    return undefined
  }
  if (coll.parameterServer !== undefined) {
    throw new ConfigError({ field: "collectiveConfig.parameterServer", reason: `strategy "local-sgd" averages the workers' parameter deltas among themselves, without parameter servers: remove parameterServer, or use strategy "parameter-server"` })
  }
  if (zeroStage > 0) {
    throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: `strategy "local-sgd" keeps every rank's whole parameters and inner optimizer state: use zeroStage 0 with it` })
  }
  if (compression !== "none") {
    throw new ConfigError({
      field: "collectiveConfig.compression",
      reason: `strategy "local-sgd" exchanges no gradients, only parameter deltas every syncEvery steps: put the codec in localSgd.compression (e.g. { type: "int8" }) and leave collectiveConfig.compression unset`
    })
  }
  const settings = resolveLocalSgd(coll.localSgd)
  const field = "collectiveConfig.localSgd.compression"
  const outer = parseCompressionConfig((coll.localSgd as { compression?: unknown } | undefined)?.compression, field)
  if (outer === "auto") {
    throw new ConfigError({ field, reason: `"auto" decides per gradient step from measured compute; name a codec for the parameter deltas ("fp16", { type: "int8" }, { type: "topk", ratio }, { type: "powersgd", rank }) or leave it unset` })
  }
  return { settings, compression: outer }
}
