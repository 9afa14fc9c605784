// The Trainer: gradwire's TorchTrainer. fit() validates every config before anything starts,
// brings up the cluster (an embedded nats-server and local agent, or an existing cluster), places
// the workers, and runs the controller: an explicit state machine (scheduling -> running ->
// restarting -> ... -> finished | errored) whose failure policy (failure-policy.ts) returns the
// decisions it carries out. Workers are separate processes (actors/train/worker.ts) spawned through
// node agents; the controller and the checkpoint keeper live in the driver process, so workers
// never need a shared filesystem: checkpoint bytes travel over NATS and land under storagePath, or
// in a JetStream object store bucket with checkpointConfig.objectStore (object-checkpoint-store.ts).
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath, pathToFileURL } from "node:url"
import { nuid, type NatsConnection } from "@nats-io/nats-core"
import { Result as R } from "effect"
import {
  ClusterConfig,
  CollectiveConfig,
  RunConfig,
  ScalingConfig,
  defaultStoragePath,
  parseTrainLoopRef,
  type TrainLoopRef
} from "../../core/config.ts"
import { decodeConfig } from "../../core/validate.ts"
import { ConfigError } from "../../core/errors.ts"
import { openNats } from "../../core/connection.ts"
import { launchNatsServer, type NatsServerProcess } from "../../core/nats-server.ts"
import { resolvable } from "../../core/engine.ts"
import type { ArrayDataset } from "../../core/datasets.ts"
import { parseCompressionConfig } from "../../collectives/compression/index.ts"
import { parseAlgorithmChoice } from "../../collectives/algorithms/index.ts"
import { ClusterView, openClusterView } from "../../scheduler/cluster-view.ts"
import { planPlacement, type PlacementPlan } from "../../scheduler/placement.ts"
import { ActorSystem } from "../runtime/system.ts"
import { defineActor, launchActor, type ActorHandle } from "../runtime/actor.ts"
import { launchAgent, type NodeAgent } from "../node/agent.ts"
import { agentRef, spawnActor, type SpawnedActor } from "../node/spawn.ts"
import { silentLogger, stderrLogger } from "../runtime/log.ts"
import type { ConnectionSpec } from "../../core/connection-spec.ts"
import { CheckpointStore, readCheckpoint, type CheckpointEntry, type CheckpointStorage } from "./checkpoint-store.ts"
import { ObjectCheckpointStore, isObjectCheckpointUrl, readObjectCheckpoint } from "./object-checkpoint-store.ts"
import { ControllerProtocol, WorkerProtocol, type CheckpointPayload, type WorkerArgs } from "./train-protocol.ts"
import { decide, type GroupFailure, type TrainerState } from "./failure-policy.ts"
import { ProgressPrinter } from "./observe/progress.ts"
import { RunRecorder } from "./observe/run-recorder.ts"
import { spanEvent } from "./observe/timeline.ts"
import { decodeMessage } from "../../core/wire.ts"
import { jobSubjects } from "../../core/subjects.ts"
import type { TrainContext } from "./train-context.ts"

export type TrainLoop<C = unknown> = (config: C, ctx: TrainContext) => unknown | Promise<unknown>

export interface TrainerCallbacks {
  /** After every report round (all ranks reported): rank 0's metrics and every rank's. */
  onReport?(info: { index: number; metrics: Record<string, unknown>; perRank: ReadonlyArray<Record<string, unknown>> }): void | Promise<void>
  onCheckpoint?(info: { path: string; metrics: Record<string, unknown> }): void | Promise<void>
  onRestart?(info: { attempt: number; failure: GroupFailure }): void | Promise<void>
  onStateChange?(info: { from: TrainerState; to: TrainerState; attempt: number }): void
  /** Step progress of a rank (rate-limited by the workers to a few per second, plus each epoch's last step). */
  onProgress?(info: { attempt: number; rank: number; epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }): void
}

export interface TrainerOptions {
  /** The loop each worker runs: "./train.ts#trainLoop", a URL, or { module, export }. Not a closure. */
  readonly trainLoopPerWorker: string | URL | TrainLoopRef | TrainLoop
  readonly trainLoopConfig?: unknown
  readonly scalingConfig: ScalingConfig
  readonly runConfig?: RunConfig & { callbacks?: ReadonlyArray<TrainerCallbacks> }
  /** Named in-memory datasets; each worker reads its shard with ctx.getDatasetShard(name). */
  readonly datasets?: Readonly<Record<string, ArrayDataset>>
  readonly collectiveConfig?: CollectiveConfig
  /** Omitted: an embedded local cluster. { address }: a cluster started with `gradwire start`. */
  readonly cluster?: ClusterConfig
  /** A checkpoint directory or nats-obj:// checkpoint to start from (default: the run's latest, when the run exists). */
  readonly resumeFromCheckpoint?: string
  /** Seed of the data shuffles. */
  readonly seed?: number
}

export interface CheckpointInfo {
  readonly path: string
  readonly metrics: Record<string, unknown>
}

/** Why fit() ended without finishing. */
export class TrainingFailed extends Error {
  readonly _tag = "TrainingFailed"
  readonly rank: number
  readonly kind: GroupFailure["kind"]
  readonly remoteTag: string
  readonly remoteStack: string
  readonly attempts: number
  constructor(failure: GroupFailure, attempts: number, decision: string) {
    super(
      `training failed on rank ${failure.rank} (${failure.kind === "loop-error" ? `${failure.tag} in the training loop` : failure.kind}): ` +
        `${failure.message}; giving up: ${decision}`
    )
    this.name = "TrainingFailed"
    this.rank = failure.rank
    this.kind = failure.kind
    this.remoteTag = failure.tag
    this.remoteStack = failure.remoteStack ?? ""
    this.attempts = attempts
  }
}

export interface Result {
  /** Rank 0's last reported metrics. */
  readonly metrics: Record<string, unknown> | undefined
  /** Rank 0's metrics, one entry per report round (as Ray keeps them). */
  readonly metricsHistory: ReadonlyArray<Record<string, unknown>>
  /** Every rank's metrics per round: metricsPerRank[round][rank]. */
  readonly metricsPerRank: ReadonlyArray<ReadonlyArray<Record<string, unknown>>>
  /** The latest checkpoint. */
  readonly checkpoint: CheckpointInfo | undefined
  /** Kept checkpoints, best first by checkpointConfig.scoreAttribute (newest first without one). */
  readonly bestCheckpoints: ReadonlyArray<CheckpointInfo>
  readonly error: TrainingFailed | undefined
  /** The run directory: metrics, config, logs, checkpoints. */
  readonly path: string
  /** Worker-group restarts after failures. */
  readonly restarts: number
}

/** The all-reduce plan of the run, as the workers' scheduler explained it. */
const writeExplain = async (dir: string, text: string, json: unknown): Promise<void> => {
  await fs.writeFile(path.join(dir, "explain.txt"), `${text}\n`)
  await fs.writeFile(path.join(dir, "explain.json"), `${JSON.stringify(json, null, 2)}\n`)
}

/**
 * Silence after which a worker counts as dead. Exits (crash, kill -9) are reported by the agent at
 * once; this only catches hung processes and lost nodes, and a worker busy in a long tfjs kernel on
 * an oversubscribed machine must not be mistaken for one.
 */
const WORKER_DEAD_AFTER_MS = 10_000

const WORKER_MODULE = fileURLToPath(new URL(import.meta.url.endsWith(".ts") ? "./worker.ts" : "./worker.js", import.meta.url))

interface Resolved {
  readonly loop: TrainLoopRef & { export: string }
  readonly loopConfig: unknown
  readonly scaling: ScalingConfig
  readonly run: RunConfig
  readonly callbacks: ReadonlyArray<TrainerCallbacks>
  readonly collective: WorkerArgs["collective"]
  readonly cluster: ClusterConfig | undefined
  readonly datasets: Readonly<Record<string, ArrayDataset>>
  readonly name: string
  readonly runDir: string
  readonly resumeFrom: string | undefined
  readonly maxFailures: number
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
  if (path.isAbsolute(module) || module.startsWith(".")) return pathToFileURL(path.resolve(module)).href
  return module
}

const checkDataset = (name: string, ds: unknown): ArrayDataset => {
  const d = ds as Partial<ArrayDataset> | undefined
  if (!d || !(d.x instanceof Float32Array) || !(d.y instanceof Int32Array) || !Array.isArray(d.featureShape)) {
    throw new ConfigError({
      field: `datasets.${name}`,
      reason: "a dataset is { x: Float32Array, y: Int32Array, featureShape: number[], size, numClasses } (see makeDataset / loadDigits)"
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
    throw new ConfigError({ field: "runConfig.callbacks", reason: "an array of objects with optional onReport/onCheckpoint/onRestart/onStateChange methods" })
  }
  const coll = decodeConfig(CollectiveConfig, options.collectiveConfig ?? {}, "collectiveConfig")
  const compression = parseCompressionConfig(coll.compression, "collectiveConfig.compression")
  const cluster = options.cluster === undefined ? undefined : decodeConfig(ClusterConfig, options.cluster, "cluster")
  const datasets: Record<string, ArrayDataset> = {}
  for (const [k, v] of Object.entries(options.datasets ?? {})) datasets[k] = checkDataset(k, v)
  const name = run.name ?? `gradwire_${new Date().toISOString().replace(/[-:]/g, "").replace(/\..*$/, "").replace("T", "_")}`
  const storage = path.resolve(run.storagePath ?? defaultStoragePath())
  if (options.seed !== undefined && !Number.isInteger(options.seed)) throw new ConfigError({ field: "seed", reason: `an integer, got ${String(options.seed)}` })
  return {
    loop: { module: resolveModule(ref.module), export: ref.export ?? "default" },
    loopConfig: options.trainLoopConfig ?? {},
    scaling,
    run,
    callbacks: (callbacks ?? []) as ReadonlyArray<TrainerCallbacks>,
    collective: {
      // 'auto' (the default) is resolved on the workers from the measured topology (actors/train/auto-config.ts).
      algorithm: parseAlgorithmChoice(coll.algorithm, "collectiveConfig.algorithm"),
      compression,
      adaptiveBatching: coll.adaptiveBatching ?? false,
      bucketSizeMiB: coll.bucketSizeMiB ?? 25,
      firstBucketSizeMiB: coll.firstBucketSizeMiB ?? 1,
      wireDtype: coll.wireDtype ?? "float32",
      timeoutMs: coll.timeoutMs ?? 30_000
    },
    cluster,
    datasets,
    name,
    runDir: path.join(storage, name),
    resumeFrom: options.resumeFromCheckpoint,
    maxFailures: run.failureConfig?.maxFailures ?? 0,
    seed: options.seed ?? 0
  }
}

/** The cluster a fit() runs on: embedded (started and stopped here) or joined. */
interface ClusterHandle {
  readonly nc: NatsConnection
  readonly clusterName: string
  readonly connection: ConnectionSpec
  readonly view: ClusterView
  readonly embedded: boolean
  close(): Promise<void>
}

const localBackends = (): Array<"tensorflow-gpu" | "tensorflow" | "wasm" | "cpu"> => {
  const out: Array<"tensorflow-gpu" | "tensorflow" | "wasm" | "cpu"> = []
  if (resolvable("@tensorflow/tfjs-node-gpu")) out.push("tensorflow-gpu")
  if (resolvable("@tensorflow/tfjs-node")) out.push("tensorflow")
  out.push("wasm", "cpu")
  return out
}

/**
 * The embedded cluster sizes its one node to the job, the way `ray.init(num_cpus=...)` would: a
 * 2-core laptop can still run 4 CPU workers (they share the cores). GPUs are never invented.
 */
const startEmbeddedCluster = async (
  verbose: boolean,
  output: (line: string) => void,
  cpusNeeded: number,
  jetstreamStoreDir?: string
): Promise<ClusterHandle> => {
  const server: NatsServerProcess = await launchNatsServer({
    maxPayload: 8 * 1024 * 1024,
    ...(jetstreamStoreDir !== undefined ? { jetstreamStoreDir } : {})
  })
  let agent: NodeAgent | undefined
  let opened: Awaited<ReturnType<typeof openNats>> | undefined
  try {
    opened = await openNats({ servers: server.url, name: "gradwire driver" })
    const connection: ConnectionSpec = { servers: [server.url] }
    const agentConn = await openNats({ servers: server.url, name: "gradwire local agent" })
    agent = await launchAgent({
      nc: agentConn.nc,
      connection,
      cluster: "local",
      nodeId: "local",
      head: true,
      backends: localBackends(),
      log: verbose ? stderrLogger("agent") : silentLogger,
      ownerTimeoutMs: 5_000,
      numCpus: Math.max(os.availableParallelism(), Math.ceil(cpusNeeded)),
      output
    })
    const view = await openClusterView({ nc: opened.nc, cluster: "local" })
    await view.waitFor((nodes) => nodes.some((n) => n.state === "alive"), 10_000)
    const o = opened
    const a = agent
    return {
      nc: o.nc,
      clusterName: "local",
      connection,
      view,
      embedded: true,
      close: async () => {
        view.close()
        await a.stop("run finished").catch(() => {})
        await agentConn.close().catch(() => {})
        await o.close().catch(() => {})
        await server.stop()
      }
    }
  } catch (e) {
    await agent?.stop().catch(() => {})
    await opened?.close().catch(() => {})
    await server.stop()
    throw e
  }
}

const joinCluster = async (c: ClusterConfig): Promise<ClusterHandle> => {
  const connection: ConnectionSpec = {
    servers: [c.address],
    ...(c.user !== undefined ? { user: c.user, password: c.password ?? "" } : {}),
    ...(c.token !== undefined ? { token: c.token } : {}),
    ...(c.credsFile !== undefined ? { creds: c.credsFile } : {})
  }
  const opened = await openNats({
    servers: c.address,
    name: "gradwire driver",
    ...(c.user !== undefined ? { user: c.user, pass: c.password ?? "" } : {}),
    ...(c.token !== undefined ? { token: c.token } : {}),
    ...(c.credsFile !== undefined ? { creds: c.credsFile } : {}),
    ...(c.nkeySeed !== undefined ? { nkey: c.nkeySeed } : {})
  })
  const clusterName = c.clusterName ?? "default"
  const view = await openClusterView({ nc: opened.nc, cluster: clusterName })
  await view.refresh().catch(() => {})
  return {
    nc: opened.nc,
    clusterName,
    connection,
    view,
    embedded: false,
    close: async () => {
      view.close()
      await opened.close()
    }
  }
}

interface Round {
  readonly metrics: Array<Record<string, unknown> | undefined>
  checkpoint: CheckpointPayload | undefined
  readonly aux: Record<string, Uint8Array>
  count: number
}

type Outcome = { readonly type: "finished" } | { readonly type: "failed"; readonly failure: GroupFailure }

/** One attempt's worker group as the controller tracks it. */
class Attempt {
  readonly number: number
  readonly worldSize: number
  readonly rounds = new Map<number, Round>()
  readonly finished = new Map<number, number>()
  completedRounds = 0
  #resolve!: (o: Outcome) => void
  readonly outcome: Promise<Outcome>
  settled = false

  constructor(number: number, worldSize: number) {
    this.number = number
    this.worldSize = worldSize
    this.outcome = new Promise((resolve) => (this.#resolve = resolve))
  }

  settle(o: Outcome): void {
    if (this.settled) return
    this.settled = true
    this.#resolve(o)
  }

  /** Settles as failed (the first outcome wins). */
  fail(failure: GroupFailure): void {
    this.settle({ type: "failed", failure })
  }
}

export class Trainer {
  readonly options: TrainerOptions

  constructor(options: TrainerOptions) {
    this.options = options
  }

  /** Runs training to the end (or to an unrecoverable failure, reported in Result.error). */
  async fit(): Promise<Result> {
    const cfg = resolveTrainerOptions(this.options)
    await fs.mkdir(cfg.runDir, { recursive: true })
    const policy = {
      ...(cfg.run.checkpointConfig?.numToKeep !== undefined ? { numToKeep: cfg.run.checkpointConfig.numToKeep } : {}),
      ...(cfg.run.checkpointConfig?.scoreAttribute !== undefined ? { scoreAttribute: cfg.run.checkpointConfig.scoreAttribute } : {}),
      ...(cfg.run.checkpointConfig?.scoreOrder !== undefined ? { scoreOrder: cfg.run.checkpointConfig.scoreOrder } : {})
    }
    // With checkpointConfig.objectStore the checkpoints live in a JetStream bucket, opened once the
    // cluster is up; otherwise under the run directory.
    const bucket = cfg.run.checkpointConfig?.objectStore
    const localStore = bucket === undefined ? await CheckpointStore.open(cfg.runDir, policy) : undefined
    // Fails early on a bad path (a nats-obj:// one is checked once the cluster is joined).
    if (cfg.resumeFrom !== undefined && !isObjectCheckpointUrl(cfg.resumeFrom)) await readCheckpoint(cfg.resumeFrom)
    const recorder = await RunRecorder.open(cfg.runDir, {
      name: cfg.name,
      trainLoopPerWorker: cfg.loop,
      trainLoopConfig: cfg.loopConfig,
      scalingConfig: cfg.scaling,
      runConfig: cfg.run,
      collectiveConfig: cfg.collective,
      cluster: cfg.cluster ? { ...cfg.cluster, password: cfg.cluster.password ? "***" : undefined, token: cfg.cluster.token ? "***" : undefined } : "embedded",
      datasets: Object.fromEntries(Object.entries(cfg.datasets).map(([k, d]) => [k, { size: d.size, featureShape: d.featureShape, numClasses: d.numClasses }])),
      seed: cfg.seed
    }, cfg.run.timeline === true)
    const progress = new ProgressPrinter(cfg.run.progress ?? "auto", cfg.scaling.numWorkers)
    const verbose = cfg.run.verbose === true

    let state: TrainerState = "scheduling"
    let attemptNo = 0
    const setState = (to: TrainerState): void => {
      for (const cb of cfg.callbacks) cb.onStateChange?.({ from: state, to, attempt: attemptNo })
      recorder.event({ type: "state", from: state, to, attempt: attemptNo })
      state = to
    }

    const history: Array<Record<string, unknown>> = []
    const perRank: Array<Array<Record<string, unknown>>> = []
    let resumePath: string | undefined = cfg.resumeFrom
    let saving: Promise<unknown> = Promise.resolve()
    let current: Attempt | undefined
    let interrupted = false

    // Worker output (embedded cluster: the local agent forwards it here) goes to the terminal and
    // to logs/<worker>.log in the run directory.
    const onOutput = (line: string): void => {
      const m = /^\(([^)]*?)(?: pid=\d+)?(?: node=[^)]*)?\)/.exec(line)
      recorder.log(m ? m[1] : "workers", line)
      progress.line(line)
    }
    const cluster = cfg.cluster ? await joinCluster(cfg.cluster) : await startEmbeddedCluster(
          verbose,
          onOutput,
          cfg.scaling.numWorkers * (cfg.scaling.resourcesPerWorker?.CPU ?? (cfg.scaling.useGpu ? 0 : 1)),
          // The embedded server keeps its JetStream data in the run directory, so a run's object
          // store checkpoints outlive it and a run with the same name resumes from them.
          bucket !== undefined ? path.join(cfg.runDir, "jetstream") : undefined
        )
    const readAt = (p: string): ReturnType<typeof readCheckpoint> =>
      isObjectCheckpointUrl(p) ? readObjectCheckpoint(cluster.nc, p) : readCheckpoint(p)
    let store: CheckpointStorage
    try {
      store = localStore ?? (await ObjectCheckpointStore.open(cluster.nc, bucket!, cfg.name, policy, cfg.cluster ? `the NATS server at ${cfg.cluster.address}` : "the embedded nats-server"))
      if (cfg.resumeFrom !== undefined && isObjectCheckpointUrl(cfg.resumeFrom)) await readAt(cfg.resumeFrom)
    } catch (e) {
      await cluster.close().catch(() => {})
      progress.close()
      await recorder.close().catch(() => {})
      throw e
    }
    resumePath ??= store.latest()?.path
    const job = `${cfg.name.slice(0, 100)}-${nuid.next().slice(-8)}`
    const system = new ActorSystem({
      nc: cluster.nc,
      cluster: cluster.clusterName,
      job,
      identity: "driver",
      node: "driver",
      log: verbose ? stderrLogger(`${job}/driver`) : silentLogger
    })
    let controller: ActorHandle | undefined
    let workers: SpawnedActor[] = []
    // On a joined cluster the agents run elsewhere and cannot call onOutput: they publish each
    // line of their processes on the job's log subjects, which land in the same logs/ files.
    const logSub = cluster.embedded
      ? undefined
      : cluster.nc.subscribe(jobSubjects(cluster.clusterName, job).logs, {
          callback: (err, msg) => {
            if (err) return
            try {
              const m = decodeMessage(msg.data) as { line?: unknown; name?: unknown; pid?: unknown; node?: unknown }
              const rank = /^w\d+-(\d+)$/.exec(String(m.name))?.[1]
              const label = rank !== undefined ? `worker rank=${rank}` : String(m.name)
              onOutput(`(${label} pid=${String(m.pid)} node=${String(m.node)}) ${String(m.line)}`)
            } catch {
              // a malformed log message is not worth failing a run over
            }
          }
        })

    const killWorkers = async (reason: string): Promise<void> => {
      const nodes = new Set(workers.map((w) => w.node))
      workers = []
      await Promise.all(
        [...nodes].map((node) =>
          system.askPromise(agentRef(system, node), "killJob", { job, reason }, { timeoutMs: 15_000 }).catch(() => undefined)
        )
      )
    }

    const onSignal = (signal: NodeJS.Signals): void => {
      interrupted = true
      current?.fail({ kind: "config", rank: -1, tag: signal, message: `interrupted by ${signal}` })
      void teardown().finally(() => {
        process.removeListener("SIGINT", onSignal)
        process.removeListener("SIGTERM", onSignal)
        process.kill(process.pid, signal)
      })
    }
    let tornDown: Promise<void> | undefined
    const teardown = (): Promise<void> =>
      (tornDown ??= (async () => {
        await killWorkers("the run ended")
        await controller?.stop({ drain: false, reason: "run ended" }).catch(() => {})
        // Let the last forwarded log lines arrive before unsubscribing.
        if (logSub) await cluster.nc.flush().catch(() => {})
        logSub?.unsubscribe()
        system.endJob()
        system.close()
        await cluster.close().catch(() => {})
        progress.close()
        await recorder.close()
      })())
    process.on("SIGINT", onSignal)
    process.on("SIGTERM", onSignal)

    const datasetPayload = new Map<string, { x: Float32Array; y: Int32Array; featureShape: number[]; numClasses: number }>()
    for (const [k, d] of Object.entries(cfg.datasets)) {
      datasetPayload.set(k, { x: d.x, y: d.y, featureShape: [...d.featureShape], numClasses: d.numClasses })
    }

    const completeRound = (a: Attempt, index: number, round: Round): void => {
      const metrics = round.metrics.map((m) => m ?? {})
      history.push(metrics[0])
      perRank.push(metrics)
      recorder.metrics(index, metrics[0], metrics)
      progress.report(index, metrics[0])
      for (const cb of cfg.callbacks) void Promise.resolve(cb.onReport?.({ index, metrics: metrics[0], perRank: metrics })).catch(() => {})
      const ckpt = round.checkpoint
      if (ckpt) {
        const files = { ...ckpt.files, ...round.aux }
        const t0 = performance.now()
        saving = saving.then(async () => {
          const entry = await store.save({ files, metadata: { ...ckpt.metadata, attempt: a.number, round: index } }, metrics[0])
          recorder.trace({ ...spanEvent("checkpoint save", t0, performance.now(), "checkpoints", { path: entry.path, round: index }, "checkpoint"), pid: "driver" })
          for (const cb of cfg.callbacks) await Promise.resolve(cb.onCheckpoint?.({ path: entry.path, metrics: entry.metrics })).catch(() => {})
        }).catch((e: unknown) => {
          process.stderr.write(`gradwire: checkpoint write failed: ${String(e)}\n`)
        })
      }
      a.completedRounds = Math.max(a.completedRounds, index + 1)
    }

    const controllerDef = defineActor(ControllerProtocol, () => ({
      report: (body) => {
        const a = current
        if (!a || body.attempt !== a.number || a.settled) return null
        for (const [rank, count] of a.finished) {
          if (body.index >= count) {
            a.fail({
              kind: "report-mismatch",
              rank: body.rank,
              tag: "ReportMismatch",
              message: `rank ${body.rank} called report() more than ${count} times, but rank ${rank} finished after ${count} report() calls: every rank must call report() the same number of times`
            })
            return null
          }
        }
        let round = a.rounds.get(body.index)
        if (!round) {
          round = { metrics: new Array(a.worldSize).fill(undefined), checkpoint: undefined, aux: {}, count: 0 }
          a.rounds.set(body.index, round)
        }
        if (round.metrics[body.rank] === undefined) round.count++
        round.metrics[body.rank] = body.metrics
        // Rank 0's checkpoint wins when several ranks hand one in (as in Ray, usually only rank 0 does).
        if (body.checkpoint && (round.checkpoint === undefined || body.rank === 0)) round.checkpoint = body.checkpoint
        if (body.aux) Object.assign(round.aux, body.aux)
        if (round.count === a.worldSize) {
          a.rounds.delete(body.index)
          completeRound(a, body.index, round)
        }
        return null
      },
      dataset: (body) => {
        const d = datasetPayload.get(body.name)
        if (!d) {
          throw new ConfigError({
            field: `getDatasetShard("${body.name}")`,
            reason: `no dataset "${body.name}" was given to the Trainer; it has: ${[...datasetPayload.keys()].join(", ") || "none"}`
          })
        }
        return d
      },
      checkpoint: async () => {
        await saving
        const p = resumePath
        if (!p) return null
        const c = await (store instanceof ObjectCheckpointStore ? store.read(p) : readAt(p))
        return { path: p, metrics: c.metrics, payload: { files: c.files, metadata: c.metadata } }
      },
      progress: (body) => {
        if (current && body.attempt === current.number) {
          progress.step(body)
          // The report's compute/communication split: kept whether or not the timeline is on.
          if (body.stepTimes) recorder.stepTimes(body.attempt, body.rank, body.stepTimes)
          for (const cb of cfg.callbacks) cb.onProgress?.(body)
        }
      },
      trace: (body) => {
        if (current && body.attempt === current.number) recorder.traceEvents(body.rank, body.events)
      },
      explain: (body) => {
        if (!current || body.attempt !== current.number) return
        progress.line(body.summary)
        recorder.event({ type: "explain", summary: body.summary })
        saving = saving.then(() => writeExplain(cfg.runDir, body.text, body.json)).catch(() => {})
      },
      finished: (body) => {
        const a = current
        if (!a || body.attempt !== a.number || a.settled) return
        a.finished.set(body.rank, body.reports)
        const counts = new Set(a.finished.values())
        const highest = Math.max(a.completedRounds, ...[...a.rounds.keys()].map((k) => k + 1))
        if (counts.size > 1 || body.reports < highest) {
          const [r0, c0] = [...a.finished.entries()].find(([, c]) => c !== body.reports) ?? [-1, highest]
          a.fail({
            kind: "report-mismatch",
            rank: body.rank,
            tag: "ReportMismatch",
            message: `rank ${body.rank} finished after ${body.reports} report() calls but ${r0 >= 0 ? `rank ${r0} made ${c0}` : `other ranks reported ${c0} times`}: every rank must call report() the same number of times`
          })
          return
        }
        if (a.finished.size === a.worldSize) a.settle({ type: "finished" })
      },
      failed: (body) => {
        const a = current
        if (!a || body.attempt !== a.number) return
        const blamed = body.blamed?.[0]
        if (blamed !== undefined) {
          // A collective on this rank failed because of another one (dead or stalled): name that one.
          a.fail({
            kind: "died",
            rank: blamed,
            tag: body.tag,
            message: `rank ${blamed} stopped taking part in collectives (reported by rank ${body.rank}: ${body.message})`,
            remoteStack: body.stack
          })
          return
        }
        const kind = body.tag === "ConfigError" ? "config" : "loop-error"
        a.fail({ kind, rank: body.rank, tag: body.tag, message: body.message, remoteStack: body.stack })
      }
    }))

    let error: TrainingFailed | undefined
    let restarts = 0
    try {
      controller = await launchActor(system, controllerDef, { name: "controller", heartbeat: false })
      for (;;) {
        // scheduling
        const plan = await this.#place(cfg, cluster, job)
        setState("running")
        const a = new Attempt(attemptNo, plan.ranks.length)
        current = a
        progress.start(attemptNo, plan.ranks.length)
        const outcome = await this.#runAttempt(cfg, cluster, system, plan, a, (w) => (workers = w))
        if (interrupted) throw new Error("interrupted")
        await killWorkers(outcome.type === "finished" ? "training finished" : "restarting the group")
        await saving
        if (outcome.type === "finished") {
          setState("finished")
          break
        }
        const decision = decide(outcome.failure, restarts, cfg.maxFailures)
        recorder.event({ type: "failure", attempt: attemptNo, failure: outcome.failure, decision })
        if (decision.action === "fail") {
          error = new TrainingFailed(outcome.failure, attemptNo + 1, decision.reason)
          progress.line(`gradwire: ${error.message}`)
          setState("errored")
          break
        }
        restarts = decision.failuresSoFar
        progress.line(
          `gradwire: rank ${outcome.failure.rank} failed (${outcome.failure.tag}: ${outcome.failure.message.split("\n")[0]}); ` +
            `restarting the group from ${store.latest() ? store.latest()!.name : "the start"} (restart ${restarts}${cfg.maxFailures >= 0 ? ` of ${cfg.maxFailures}` : ""})`
        )
        for (const cb of cfg.callbacks) await Promise.resolve(cb.onRestart?.({ attempt: attemptNo + 1, failure: outcome.failure })).catch(() => {})
        resumePath = store.latest()?.path ?? resumePath
        setState("restarting")
        attemptNo++
        setState("scheduling")
      }
    } finally {
      await saving
      await teardown()
      process.removeListener("SIGINT", onSignal)
      process.removeListener("SIGTERM", onSignal)
    }
    const info = (e: CheckpointEntry): CheckpointInfo => ({ path: e.path, metrics: e.metrics })
    const latest = store.latest()
    await recorder.finish({ title: cfg.name, error: error?.message, restarts, history })
    progress.summary(recorder.dir, history.at(-1), error)
    return {
      metrics: history.at(-1),
      metricsHistory: history,
      metricsPerRank: perRank,
      checkpoint: latest ? info(latest) : undefined,
      bestCheckpoints: store.best().map(info),
      error,
      path: cfg.runDir,
      restarts
    }
  }

  /** Places the workers now, or waits for resources up to scalingConfig.placementTimeoutMs. */
  async #place(cfg: Resolved, cluster: ClusterHandle, job: string): Promise<PlacementPlan> {
    const deadline = Date.now() + (cfg.scaling.placementTimeoutMs ?? 0)
    const request = {
      jobId: job,
      numWorkers: cfg.scaling.numWorkers,
      ...(cfg.scaling.useGpu !== undefined ? { useGpu: cfg.scaling.useGpu } : {}),
      ...(cfg.scaling.resourcesPerWorker !== undefined ? { resourcesPerWorker: cfg.scaling.resourcesPerWorker } : {}),
      ...(cfg.scaling.placementStrategy !== undefined ? { placementStrategy: cfg.scaling.placementStrategy } : {}),
      ...(cfg.scaling.acceleratorType !== undefined ? { acceleratorType: cfg.scaling.acceleratorType } : {}),
      ...(cfg.scaling.nodeLabels !== undefined ? { nodeLabels: cfg.scaling.nodeLabels } : {}),
      ...(cfg.scaling.backend !== undefined ? { backend: cfg.scaling.backend } : {})
    }
    for (;;) {
      const nodes = cluster.view.resources()
      if (nodes.length === 0 && Date.now() < deadline + 3_000) {
        // Agents advertise every 500 ms; give a just-joined cluster a moment to be seen.
        await cluster.view.waitFor((n) => n.some((x) => x.state === "alive"), 3_000).catch(() => undefined)
        if (cluster.view.resources().length === 0) {
          throw new ConfigError({
            field: "cluster",
            reason: `no node agent is alive in cluster "${cluster.clusterName}": start one with \`gradwire start --head\` (or --address)`
          })
        }
        continue
      }
      const planned = planPlacement(request, nodes)
      if (R.isSuccess(planned)) return planned.success
      if (Date.now() >= deadline) throw planned.failure
      await cluster.view.waitFor(() => true, Math.min(1_000, Math.max(50, deadline - Date.now()))).catch(() => undefined)
    }
  }

  /** Spawns the group, starts the loops and waits for the attempt's outcome. */
  async #runAttempt(
    cfg: Resolved,
    cluster: ClusterHandle,
    system: ActorSystem,
    plan: PlacementPlan,
    a: Attempt,
    track: (w: SpawnedActor[]) => void
  ): Promise<Outcome> {
    const nodes = plan.ranks.map((r) => r.nodeId)
    const spawned: SpawnedActor[] = []
    const group = `g${a.number}`
    try {
      await Promise.all(
        plan.ranks.map(async (r) => {
          const args: WorkerArgs = {
            attempt: a.number,
            rank: r.rank,
            worldSize: plan.ranks.length,
            localRank: r.localRank,
            localWorldSize: r.localWorldSize,
            nodeRank: r.nodeRank,
            nodes,
            controller: "controller",
            loopModule: cfg.loop.module,
            loopExport: cfg.loop.export,
            loopConfig: cfg.loopConfig,
            connection: cluster.connection,
            group,
            backend: r.backend,
            collective: cfg.collective,
            seed: cfg.seed,
            timeline: cfg.run.timeline === true
          }
          const w = await spawnActor(system, {
            node: r.nodeId,
            name: `w${a.number}-${r.rank}`,
            module: WORKER_MODULE,
            export: "trainWorker",
            args,
            gpus: r.gpuIndices,
            env: { CUDA_VISIBLE_DEVICES: r.cudaVisibleDevices, GRADWIRE_RANK: String(r.rank), GRADWIRE_WORLD_SIZE: String(plan.ranks.length) },
            resources: plan.resourcesPerWorker,
            logPrefix: `worker rank=${r.rank}`,
            readyTimeoutMs: 60_000
          })
          spawned[r.rank] = w
          track(spawned.filter(Boolean))
        })
      )
    } catch (e) {
      track(spawned.filter(Boolean))
      const err = e as { message?: string; _tag?: string }
      return { type: "failed", failure: { kind: "died", rank: -1, tag: err._tag ?? "SpawnError", message: err.message ?? String(e) } }
    }
    for (const w of spawned) {
      void w.down({ deadAfterMs: WORKER_DEAD_AFTER_MS }).then((down) => {
        if (a.settled || a.finished.has(spawned.indexOf(w))) return
        // A worker that stops right after telling us it finished is fine; give that message a moment.
        setTimeout(() => {
          if (a.settled || a.finished.has(spawned.indexOf(w))) return
          a.fail({
            kind: "died",
            rank: spawned.indexOf(w),
            tag: down.reason,
            message: `worker process (pid ${w.pid} on node ${w.node}) went down: ${down.detail}`
          })
        }, 300)
      })
    }
    await Promise.all(spawned.map((w) => system.askPromise(w.ref(WorkerProtocol), "run", null, { timeoutMs: 15_000 }))).catch((e: unknown) => {
      a.fail({ kind: "died", rank: -1, tag: "StartError", message: `could not start the loops: ${String(e)}` })
    })
    return a.outcome
  }
}
