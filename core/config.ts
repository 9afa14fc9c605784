// The Trainer's configuration (Ray Train vocabulary: ScalingConfig, RunConfig, CheckpointConfig,
// FailureConfig) as Schemas, with the defaults a Ray Train user expects. Validated before anything
// starts; see core/validate.ts for how a bad value is reported.
import * as os from "node:os"
import * as path from "node:path"
import * as Schema from "effect/Schema"
import { decodeConfig } from "./validate.ts"
import { ConfigError } from "./errors.ts"
import { ConnectionAuth, connectionFromAddress, redactUrl, scrubSecrets, type ConnectionSpec } from "./connection-spec.ts"

const PositiveInt = Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))
const NonNegative = Schema.Finite.check(Schema.isGreaterThanOrEqualTo(0))
const Positive = Schema.Finite.check(Schema.isGreaterThan(0))
const Name = Schema.String.check(
  Schema.isPattern(/^[A-Za-z0-9_-]{1,128}$/, { message: "Expected 1-128 letters, digits, \"_\" or \"-\"" })
)

/**
 * Ray's placement strategies: the config's vocabulary. Each has exactly one entry in the
 * scheduler's table (scheduler/placement-strategies.ts), which is typed by this list.
 */
export const placementStrategyNames = ["PACK", "SPREAD", "STRICT_PACK", "STRICT_SPREAD"] as const
export const PlacementStrategy = Schema.Literals(placementStrategyNames)
export type PlacementStrategy = typeof PlacementStrategy.Type

/**
 * collectiveConfig.strategy: the way of training, by name. The names, what each needs and its
 * checks belong to the training-strategy registry (actors/train/worker/strategies/registry.ts), which
 * checks a name when the Trainer resolves its options; here only the shape is checked, so a
 * strategy registered by another module is a valid config value.
 */
export const TrainingStrategySchema = Schema.String.check(
  Schema.isPattern(/^[a-z][a-z0-9-]{0,31}$/, { message: 'Expected a training strategy\'s name, e.g. "allreduce", "parameter-server", "auto", "local-sgd"' })
)
export type TrainingStrategy = typeof TrainingStrategySchema.Type

export const BackendName = Schema.Literals(["auto", "tensorflow-gpu", "webgpu", "tensorflow", "wasm", "cpu"])
export type BackendName = typeof BackendName.Type

/** Elastic bounds: the group runs with as many workers as fit, at least min, at most max. */
export const WorkerRange = Schema.Struct({ min: PositiveInt, max: PositiveInt }).check(
  Schema.makeFilter((r) => r.min <= r.max || `Expected min <= max, got { min: ${r.min}, max: ${r.max} }`)
)

export const ScalingConfig = Schema.Struct({
  /** A number, or { min, max } for an elastic group (Ray Train v2's num_workers=(min, max)). */
  numWorkers: Schema.Union([PositiveInt, WorkerRange]),
  /**
   * With elastic numWorkers, what stays fixed when the group's size changes: "keep-global" (the
   * default) keeps the global batch (a per-rank batchSize is the one at max workers; fewer workers
   * take larger batches), "keep-per-worker" keeps each rank's batch and scales the optimizer's
   * learning rate by size / max (the linear scaling rule).
   */
  elasticBatch: Schema.optional(Schema.Literals(["keep-global", "keep-per-worker"])),
  /**
   * true: every worker on a GPU; "auto": a GPU worker on each node with a free GPU and a GPU
   * backend, CPU workers elsewhere (one job across GPU and CPU machines); default false.
   */
  useGpu: Schema.optional(Schema.Union([Schema.Boolean, Schema.Literal("auto")])),
  /** Resources each worker needs, e.g. { CPU: 2 } or { GPU: 1, memory: 4e9 }. Default { GPU: 1 } with useGpu, else { CPU: 1 }. */
  resourcesPerWorker: Schema.optional(Schema.Record(Schema.String, NonNegative)),
  placementStrategy: Schema.optional(PlacementStrategy),
  /** Substring of the GPU name a worker needs, e.g. "H100". */
  acceleratorType: Schema.optional(Schema.String),
  /** tfjs backend for the workers; "auto" picks the best that loads on each node. */
  backend: Schema.optional(BackendName),
  /** Label selector: a worker goes only to nodes whose labels include all of these. */
  nodeLabels: Schema.optional(Schema.Record(Schema.String, Schema.String)),
  /**
   * How long to wait for resources before failing with PlacementInfeasible (default 60 s). A first
   * placement that the cluster could not hold even when idle fails at once unless this is given.
   */
  placementTimeoutMs: Schema.optional(NonNegative)
})
export type ScalingConfig = typeof ScalingConfig.Type

export const CheckpointConfig = Schema.Struct({
  numToKeep: Schema.optional(PositiveInt),
  scoreAttribute: Schema.optional(Schema.String),
  scoreOrder: Schema.optional(Schema.Literals(["max", "min"])),
  /**
   * Keep checkpoints in this JetStream object store bucket on the cluster's NATS server instead of
   * under storagePath (for workers and drivers that share no filesystem).
   */
  objectStore: Schema.optional(
    Schema.String.check(
      Schema.isPattern(/^[A-Za-z0-9_-]{1,64}$/, {
        message: "Expected a NATS object store bucket name: 1-64 letters, digits, \"_\" or \"-\" (no dots, spaces or slashes)"
      })
    )
  )
})
export type CheckpointConfig = typeof CheckpointConfig.Type

export const FailureConfig = Schema.Struct({
  /**
   * Restarts allowed after failures of the job (a worker crashed or hung, the loop threw); -1 means
   * no limit. Default 0. Lost nodes and NATS outages do not count (see actors/train/driver/failure-policy.ts).
   */
  maxFailures: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(-1))),
  /** How long any gradwire process waits for a lost NATS connection to come back. Default 60 s. */
  natsOutageTimeoutMs: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(1))),
  /**
   * After a worker or node is lost: "peers" (the default) regroups the surviving workers in place
   * and hands the furthest one's state to the others and to replacements, so the failure costs the
   * step in flight; "checkpoint" restarts every worker from the latest checkpoint. "peers" falls
   * back to the checkpoint when no worker survives or the survivors cannot be regrouped.
   */
  recoverFrom: Schema.optional(Schema.Literals(["peers", "checkpoint"])),
  /**
   * State parity: every this many report() rounds the ranks of a synchronous data-parallel group
   * compare a hash of their weights and optimizer state; a rank that differs takes rank 0's and the
   * repair is an event. Default 1 (every round); 0 turns it off.
   */
  parityEvery: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
  /**
   * Spare workers kept ready beside the group (spawned, tfjs loaded, connected, the loop imported,
   * in no group), each holding a worker's resources: a worker's death is made good by one at once,
   * at the survivors' regroup, instead of by a process starting cold; a new spare then starts in
   * the background. Default 0. Needs recovery from peers (recoverFrom "peers").
   */
  spares: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type FailureConfig = typeof FailureConfig.Type

export const DashboardConfig = Schema.Struct({
  port: Schema.optional(Schema.Int.check(Schema.isBetween({ minimum: 0, maximum: 65535 }))),
  host: Schema.optional(Schema.String.check(Schema.isNonEmpty())),
  /** The token the page and /metrics require (default: one made up when required: the cluster has credentials, or host is not loopback). */
  token: Schema.optional(Schema.String.check(Schema.isMinLength(8)))
})
export type DashboardConfig = typeof DashboardConfig.Type

export const RunConfig = Schema.Struct({
  name: Schema.optional(Name),
  storagePath: Schema.optional(Schema.String.check(Schema.isNonEmpty())),
  checkpointConfig: Schema.optional(CheckpointConfig),
  failureConfig: Schema.optional(FailureConfig),
  /** Objects with optional hooks (TrainerCallbacks: onReport, onCheckpoint, onRestart, onStateChange, onProgress); functions cannot be validated by shape. */
  callbacks: Schema.optional(Schema.Array(Schema.Unknown)),
  /** Live progress in the terminal: "auto" (bars on a TTY, plain lines otherwise), or off. */
  progress: Schema.optional(Schema.Union([Schema.Boolean, Schema.Literal("auto")])),
  /** Write a Chrome trace-event timeline of every step into the run directory. */
  timeline: Schema.optional(Schema.Boolean),
  verbose: Schema.optional(Schema.Boolean),
  /**
   * Serve the live dashboard (and Prometheus /metrics) from the driver while it trains: true
   * (127.0.0.1:8265), or { port (0: any free one), host, token }. The URL is printed.
   */
  dashboard: Schema.optional(Schema.Union([Schema.Boolean, DashboardConfig]))
})
export type RunConfig = typeof RunConfig.Type

/**
 * "auto" or the name of a registered all-reduce algorithm ("ring", "tree", "hierarchical", or one
 * registered at run time). Only the shape is checked here: the algorithm registry
 * (collectives/algorithms/) owns the list and checks the name when the Trainer resolves its options.
 */
export const CollectiveAlgorithm = Schema.String.check(
  Schema.isPattern(/^[a-z][a-z0-9-]{0,31}$/, { message: 'Expected "auto" or an all-reduce algorithm\'s name, e.g. "ring", "tree", "hierarchical"' })
)
export type CollectiveAlgorithm = typeof CollectiveAlgorithm.Type

export const CollectiveConfig = Schema.Struct({
  algorithm: Schema.optional(CollectiveAlgorithm),
  /** Validated by the compression module (collectives/compression), which owns its vocabulary. */
  compression: Schema.optional(Schema.Unknown),
  /** Gradient bucket size. Default 25 (BUCKET_SIZE_MIB, core/defaults.ts). */
  bucketSizeMiB: Schema.optional(Positive),
  /** The first bucket's size, small so communication starts early. Default 1 (FIRST_BUCKET_SIZE_MIB). */
  firstBucketSizeMiB: Schema.optional(Positive),
  wireDtype: Schema.optional(Schema.Literals(["float32", "float16"])),
  /**
   * Deadline for any single collective wait; a dead or stalled rank fails the step after it. Set, it
   * is used as given. Unset, it is derived from the measured steps (collectives/deadlines.ts: 2 x the
   * median step + 5 s, at most COLLECTIVE_TIMEOUT_MS, which also applies until 5 steps are measured).
   */
  timeoutMs: Schema.optional(PositiveInt),
  /**
   * How collective frames travel between workers: "auto" (default) over direct TCP / Unix-socket
   * links between the workers for the sizes where the group measured them faster, NATS for the
   * rest; "direct": every call over the direct links; "nats": everything through the NATS servers.
   * A worker that peers cannot reach gets NATS either way, and explain.txt says why. The links
   * authenticate with a per-run secret and run TLS (pre-shared key) when the bus uses TLS.
   */
  transport: Schema.optional(Schema.Literals(["auto", "nats", "direct"])),
  /** Heterogeneity-aware per-worker batch sizes (needs a global batch size). */
  adaptiveBatching: Schema.optional(Schema.Boolean),
  /**
   * ZeRO: 0 (default) every rank holds the whole optimizer state; 1 each rank holds and updates
   * 1/p of it (gradients all-reduced, parameters all-gathered); 2 also reduce-scatters the
   * gradients, so each rank receives only its 1/p of the reduced gradient.
   */
  zeroStage: Schema.optional(Schema.Literals([0, 1, 2])),
  /**
   * "allreduce" (default): every rank all-reduces its gradients; "parameter-server": server
   * processes own shards of the parameters and their optimizer state, workers push gradients and
   * pull parameters (parameterServer); "auto": starts on the all-reduce and moves between it, the
   * servers with backup workers and the servers with bounded staleness (SSP) as the measured
   * compute and communication times predict (explained in explain.txt); "local-sgd": every rank
   * takes localSgd.syncEvery steps on its own, then the ranks average their parameter deltas
   * (Local SGD / DiLoCo, localSgd).
   */
  strategy: Schema.optional(TrainingStrategySchema),
  /**
   * strategy "local-sgd": syncEvery (H, default 32), outerOptimizer ("nesterov", DiLoCo's default,
   * or "average"), outerLr (0.7 nesterov, 1 average), outerMomentum (0.9), compression of the
   * parameter deltas (a codec, as collectiveConfig.compression), fragments (streaming DiLoCo: parts
   * synchronised at staggered steps, default 1) and overlap (default with fragments > 1).
   * Validated by actors/train/common/optim/outer-optimizer.ts.
   */
  localSgd: Schema.optional(Schema.Unknown),
  parameterServer: Schema.optional(
    Schema.Struct({
      /** Server processes, each owning a contiguous 1/numServers of the flat parameters. Default 1. */
      numServers: Schema.optional(PositiveInt),
      /** "sync" (default: every step waits for the workers' gradients), "async" (applied as they arrive), "ssp" (bounded staleness). */
      mode: Schema.optional(Schema.Literals(["sync", "async", "ssp"])),
      /** ssp: how many steps a worker may run ahead of the slowest. Default 2. */
      staleness: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0))),
      /**
       * Each server keeps a replica of the one before it (its state, then every update it applies),
       * from which a lost server is made again while the workers go on. Default: with two servers
       * or more when failureConfig.recoverFrom is "peers"; false saves one shard-sized message and
       * optimizer step per update on the next server, and a lost server restarts the job from the
       * checkpoint.
       */
      replicas: Schema.optional(Schema.Boolean)
    })
  ),
  /** Synchronous parameter servers: each step applies the first numWorkers - backupWorkers gradients and drops the rest (Chen et al. 2016). Default 0. */
  backupWorkers: Schema.optional(Schema.Int.check(Schema.isGreaterThanOrEqualTo(0)))
})
export type CollectiveConfig = typeof CollectiveConfig.Type

/**
 * An existing cluster: its address (nats://host:4222, with credentials in it as the NATS CLI takes
 * them, tls://, or several comma-separated) and credentials (core/connection-spec.ts).
 */
export const ClusterConfig = Schema.Struct({
  address: Schema.String,
  clusterName: Schema.optional(Name),
  ...ConnectionAuth.fields
})
export type ClusterConfig = typeof ClusterConfig.Type

/**
 * Validates a `cluster` option into the cluster's name and connection spec. Errors never show a
 * secret, not even one given in the wrong field or type.
 */
export const resolveClusterConfig = (value: unknown, field = "cluster"): { readonly clusterName: string; readonly connection: ConnectionSpec } => {
  const secrets = typeof value === "object" && value !== null ? (value as Record<string, unknown>) : {}
  const scrub = (e: unknown): never => {
    if (!(e instanceof ConfigError)) throw e
    const text = (s: unknown): string | undefined => (typeof s === "string" ? s : undefined)
    const address = text(secrets.address) ?? ""
    let reason = scrubSecrets(e.reason, { password: text(secrets.password), token: text(secrets.token), nkeySeed: text(secrets.nkeySeed) })
    if (address !== "") reason = reason.split(address).join(redactUrl(address))
    throw new ConfigError({ field: e.field, reason })
  }
  try {
    const c = decodeConfig(ClusterConfig, value, field)
    const { address, clusterName, ...auth } = c
    return { clusterName: clusterName ?? "default", connection: connectionFromAddress(address, auth, `${field}.address`) }
  } catch (e) {
    return scrub(e)
  }
}

/** Where the user's loop lives: a module (path or URL) and the name of its exported function. */
export const TrainLoopRef = Schema.Struct({
  module: Schema.String.check(Schema.isNonEmpty()),
  export: Schema.optional(Schema.String.check(Schema.isNonEmpty()))
})
export type TrainLoopRef = typeof TrainLoopRef.Type

export const defaultStoragePath = (): string => path.join(os.homedir(), "gradwire_results")

/** A path with "~" (alone, or before a slash) read as the home directory, as a shell and Ray's storage_path take it; path.resolve would make it a folder named "~". */
export const expandHome = (p: string): string => (/^~(?=$|[\\/])/.test(p) ? path.join(os.homedir(), p.slice(1)) : p)

const closureHint =
  'trainLoopPerWorker must name a module here (Trainer.fit() finds the module that exports a loop function; resolving the options alone does not): workers are separate processes (possibly on ' +
  "other machines), so a closure cannot be shipped to them. Put the loop in a module and export it:\n" +
  "  // train.ts\n  export async function trainLoop(config, ctx) { ... }\n" +
  '  new Trainer({ trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" }, ... })\n' +
  '(or the string "./train.ts#trainLoop", resolved against the current directory).'

/**
 * Normalises the forms a user may give for the loop: "path#export", a URL, { module, export }.
 * A function is refused with the module form shown.
 */
export const parseTrainLoopRef = (value: unknown): TrainLoopRef => {
  if (typeof value === "function") throw new ConfigError({ field: "trainLoopPerWorker", reason: closureHint })
  if (value instanceof URL) return { module: value.href, export: "default" }
  if (typeof value === "string") {
    const hash = value.lastIndexOf("#")
    if (hash > 0 && !value.slice(hash + 1).includes("/")) {
      return { module: value.slice(0, hash), export: value.slice(hash + 1) }
    }
    return { module: value, export: "default" }
  }
  const ref = decodeConfig(TrainLoopRef, value, "trainLoopPerWorker")
  return { module: ref.module, export: ref.export ?? "default" }
}
