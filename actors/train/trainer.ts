// The Trainer: gradwire's TorchTrainer. fit() validates every config before anything starts
// (options.ts), brings up the cluster (cluster.ts: an embedded nats-server and local agent, or an
// existing cluster), and carries out what the controller (controller.ts, a state machine with no
// I/O) decides: place the group, spawn it (worker-group.ts), restart or resize it, finish. The
// controller actor in this process answers the workers (reports, datasets, the checkpoint to
// resume from); checkpoint bytes travel over NATS and land under storagePath, or in a JetStream
// object store bucket with checkpointConfig.objectStore, so workers never need a shared
// filesystem. The run directory is written by observe/run-recorder.ts.
import { randomBytes } from "node:crypto"
import * as fs from "node:fs/promises"
import * as path from "node:path"
import { nuid } from "@nats-io/nats-core"
import { Result as R } from "effect"
import { ConfigError, NatsUnavailable } from "../../core/errors.ts"
import { DEADLINE_WARMUP_STEPS, GPU_WORKER_DEAD_AFTER_MS, PLACEMENT_TIMEOUT_MS } from "../../core/defaults.ts"
import { HeartbeatDeadline } from "../../collectives/deadlines.ts"
import { watchBus, type BusMonitor } from "../../core/bus-monitor.ts"
import { describeConnection, hasCredentials, redactConnection } from "../../core/connection-spec.ts"
import { decodeMessage } from "../../core/wire.ts"
import { jobSubjects } from "../../core/subjects.ts"
import { PlacementInfeasible, SERVER_CPUS, type PlacementPlan, type PlacementRequest } from "../../scheduler/placement.ts"
import { describeBackends } from "../../scheduler/gpu-backend.ts"
import { ActorSystem } from "../runtime/system.ts"
import { defineActor, launchActor, type ActorHandle } from "../runtime/actor.ts"
import { silentLogger, stderrLogger } from "../runtime/log.ts"
import { CheckpointStore, readCheckpoint, type CheckpointEntry, type CheckpointStorage } from "./checkpoint-store.ts"
import { ObjectCheckpointStore, isObjectCheckpointUrl, readObjectCheckpoint } from "./object-checkpoint-store.ts"
import { ControllerProtocol, PARITY_METRIC, WorkerProtocol, type CheckpointPayload, type PeerState, type Position } from "./train-protocol.ts"
import {
  Controller,
  deathOrNodeLoss,
  deathToCheck,
  recoveryFor,
  restartReason,
  startFailureKind,
  type CompletedRound,
  type Generation,
  type GroupFailure,
  type Outcome
} from "./controller.ts"
import { growTo, idle, planLargest, releasingJob } from "./elastic.ts"
import { WorkerGroup, layoutOf, placementsOf, type GroupArgs, type RankSpawn } from "./worker-group.ts"
import { joinCluster, startEmbeddedCluster, type ClusterHandle } from "./cluster.ts"
import { resolveTrainerOptions, type Resolved, type TrainerCallbacks, type TrainerOptions } from "./options.ts"
import { datasetModules, datasetPayloads, describeDatasets, resolveDatasets } from "./dataset-payloads.ts"
import type { ResolvedDataset } from "../../core/data/resolve.ts"
import {
  Interrupted,
  TrainingFailed,
  withResult,
  type BusOutage,
  type CheckpointError,
  type CheckpointInfo,
  type Resize,
  type Result
} from "./result.ts"
import type { Incident } from "./observe/report-html.ts"
import { ProgressPrinter } from "./observe/progress.ts"
import { RunRecorder } from "./observe/run-recorder.ts"
import { spanEvent } from "./observe/timeline.ts"
import { JobMonitor } from "./job-monitor.ts"
import type { JobState } from "./job-telemetry.ts"
import { startDashboard, type Dashboard } from "./dashboard/server.ts"

export type { TrainerCallbacks, TrainerOptions } from "./options.ts"
export { resolveTrainerOptions } from "./options.ts"
export { Interrupted, TrainingFailed, resultOf, type CheckpointInfo, type FitError, type Result } from "./result.ts"

/** Attempts at writing one checkpoint before it is given up (and recorded in Result.checkpointErrors). */
const CHECKPOINT_WRITE_ATTEMPTS = 3

/** While waiting for capacity, what it waits for is printed this often. */
const PLACEMENT_NOTICE_EVERY_MS = 10_000

const sleep = (ms: number): Promise<void> => new Promise((r) => setTimeout(r, ms))

const firstLine = (text: string): string => text.split("\n")[0] ?? ""

/** How long the survivors of a failure get to stop at a group operation and say where they are. */
const PAUSE_TIMEOUT_MS = 20_000

/**
 * Asks of a regroup are sent again every this many ms until their deadline: right after the bus
 * came back a worker may not have renewed its subscriptions yet, and a request sent then is lost
 * without a "no responders" answer. The workers answer a repeated pause or resume once.
 */
const REGROUP_RETRY_MS = 1_000

/** report.html, metrics.csv and summary.json are rewritten this often while the run goes on (and after report rounds, at most this often). */
const REPORT_REFRESH_MS = 10_000
const REPORT_REFRESH_MIN_MS = 2_000

/** On Ctrl-C the run directory gets this long to be completed before the signal takes the process. */
const INTERRUPT_WRITE_MS = 15_000

/** The ranks' "kernels" explanations (keys "kernels.<rank>"), by rank. */
const kernelParts = (parts: Readonly<Record<string, { readonly text: string; readonly json: unknown }>>) =>
  Object.entries(parts)
    .filter(([k]) => k.startsWith("kernels."))
    .sort(([a], [b]) => Number(a.slice(8)) - Number(b.slice(8)))
    .map(([, v]) => v)

/** The all-reduce plan of the run, (strategy "auto") its strategy and the collective and heartbeat deadlines, as explained last. */
const writeExplain = async (dir: string, parts: Readonly<Record<string, { readonly text: string; readonly json: unknown }>>): Promise<void> => {
  const alg = parts.algorithm
  const strat = parts.strategy
  const kernels = kernelParts(parts)
  const deadlines = [parts.deadlines, parts.heartbeat].filter((p) => p !== undefined)
  const text = [alg?.text, strat?.text, deadlines.length ? deadlines.map((d) => d.text).join("\n") : undefined, kernels.length ? `backends and kernels:\n${kernels.map((k) => k.text).join("\n")}` : undefined]
    .filter((t) => t !== undefined)
    .join("\n\n")
  // explain.json stays the all-reduce plan's object, with the strategy's choice under "strategy",
  // each rank's backend and kernels under "kernels" and the collective and heartbeat deadlines
  // under "deadlines" and "heartbeat".
  const base = strat ? { ...((alg?.json as object | undefined) ?? {}), strategy: strat.json } : alg?.json
  const withKernels = kernels.length ? { ...((base as object | undefined) ?? {}), kernels: kernels.map((k) => k.json) } : base
  const json = deadlines.length
    ? {
        ...((withKernels as object | undefined) ?? {}),
        ...(parts.deadlines ? { deadlines: parts.deadlines.json } : {}),
        ...(parts.heartbeat ? { heartbeat: parts.heartbeat.json } : {})
      }
    : withKernels
  await fs.writeFile(path.join(dir, "explain.txt"), `${text}\n`)
  await fs.writeFile(path.join(dir, "explain.json"), `${JSON.stringify(json, null, 2)}\n`)
}

/** `ask` again until it is answered or `totalMs` passed: its answer, or undefined. */
const askAgain = async <A>(ask: () => Promise<A>, totalMs: number): Promise<A | undefined> => {
  const deadline = Date.now() + totalMs
  for (;;) {
    try {
      return await ask()
    } catch {
      if (Date.now() >= deadline) return undefined
      await sleep(100)
    }
  }
}

/** What a regroup (recovery from peers, growth in place) works with. */
interface RegroupContext {
  readonly cfg: Resolved
  readonly cluster: ClusterHandle
  readonly system: ActorSystem
  readonly group: WorkerGroup
  readonly controller: Controller<CheckpointPayload>
  readonly request: Omit<PlacementRequest, "numWorkers">
  /** The failure that ended the last generation; none for a resize. */
  readonly failure?: GroupFailure
  /** The size to grow back to: the controller's decision (numWorkers; elastic: max, or the resize's size). */
  readonly target: number
  readonly what: string
  readonly budget: string
  readonly counted: boolean
  readonly saving: () => Promise<unknown>
  readonly incident: (kind: Incident["kind"], text: string, event: Record<string, unknown>) => void
  readonly progress: ProgressPrinter
  readonly groupArgs: GroupArgs
  readonly lineage: ReadonlyMap<string, number>
  readonly peerStates: Map<number, PeerState>
  readonly onSize: (attempt: number, size: number) => void
  readonly latest: () => string | undefined
  readonly setResume: (path: string | undefined) => void
  /** Why the survivors could not be regrouped (the restart from the checkpoint says it). */
  readonly fellBack: (why: string) => void
}

export class Trainer {
  readonly options: TrainerOptions
  /** The last "workers: <backend> on <node> ..." line printed (printed again only when it changes). */
  #backendLine: string | undefined

  constructor(options: TrainerOptions) {
    this.options = options
  }

  /**
   * Runs training to the end and resolves with its Result. Rejects with a ConfigError when the
   * options are invalid (nothing started, no result), and otherwise with a typed error that
   * carries the partial Result as `error.result`: TrainingFailed (a failure of the job that the
   * failure policy did not retry), NatsUnavailable (the bus stayed away past
   * failureConfig.natsOutageTimeoutMs), PlacementInfeasible (no room for the group within
   * scalingConfig.placementTimeoutMs), Interrupted (SIGINT/SIGTERM).
   */
  async fit(): Promise<Result> {
    const cfg = resolveTrainerOptions(this.options)
    // File datasets on local paths: metadata now (a missing or malformed file fails before anything
    // starts); those in an object store once the cluster is joined.
    const resolvedData = new Map<string, ResolvedDataset>()
    await resolveDatasets(cfg.datasets, resolvedData)
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
      cluster: cfg.cluster ? { clusterName: cfg.cluster.clusterName, ...redactConnection(cfg.cluster.connection) } : "embedded",
      datasets: describeDatasets(cfg.datasets),
      seed: cfg.seed
    }, cfg.run.timeline === true)
    const progress = new ProgressPrinter(cfg.run.progress ?? "auto", cfg.maxWorkers)
    const verbose = cfg.run.verbose === true
    progress.line(`gradwire: run directory ${cfg.runDir} (report.html is refreshed as it trains)`)

    const history: Array<Record<string, unknown>> = []
    const perRank: Array<Array<Record<string, unknown>>> = []
    const resizes: Resize[] = []
    const checkpointErrors: CheckpointError[] = []
    const busOutages: BusOutage[] = []
    const incidents: Incident[] = []
    let natsServerRestarts = 0
    let serverRestartedDuringOutage = false
    let restarts = 0
    let resumePath: string | undefined = cfg.resumeFrom
    let saving: Promise<unknown> = Promise.resolve()
    // Assigned once the cluster is up; nothing that reads it runs before that.
    let store!: CheckpointStorage
    // The lineage: checkpoints saved since the group last started afresh, with the number of
    // report() calls made before each (a joiner of a regroup counts its reports from there).
    const lineage = new Map<string, number>()
    // The state a regrouped generation continues from, by generation (the furthest survivor's).
    const peerStates = new Map<number, PeerState>()
    /** The latest explanations by part (the all-reduce plan; strategy "auto"'s choice): explain.txt / explain.json. */
    const explained: Record<string, { readonly text: string; readonly json: unknown }> = {}
    let bus: BusMonitor | undefined
    let error: Error | undefined
    // Watchers in other processes (the dashboard, gradwire jobs/logs) hear about the job through
    // the monitor; the run directory's report is rewritten as the run goes on.
    let monitor: JobMonitor | undefined
    let dashboard: Dashboard | undefined
    const planSummaries: Record<string, string> = {}
    const planText = (): string | undefined => [explained.algorithm?.text, explained.strategy?.text].filter((t) => t !== undefined).join("\n\n") || undefined
    const runSummary = (state: string, failure?: Error) => ({
      title: cfg.name,
      state,
      ...(failure ? { error: failure.message } : {}),
      restarts,
      history,
      incidents,
      ...(planText() !== undefined ? { plan: planText()! } : {})
    })
    let reportAt = 0
    const refreshReport = (force: boolean): void => {
      if (!force && Date.now() - reportAt < REPORT_REFRESH_MIN_MS) return
      reportAt = Date.now()
      void recorder.snapshot(runSummary("running"))
    }
    /** Resolved once the run directory's final files are written (a Ctrl-C waits for it before the process goes). */
    let markWritten!: () => void
    const written = new Promise<void>((resolve) => (markWritten = resolve))

    /** Something that happened to the run: a progress line, events.jsonl, report.html, summary.json. */
    const incident = (kind: Incident["kind"], text: string, event: Record<string, unknown>): void => {
      incidents.push({ time: new Date().toISOString(), kind, text })
      recorder.event(event)
      progress.line(`gradwire: ${text}`)
      monitor?.changed()
    }

    // A user callback that throws is logged and recorded, never dropped and never fatal.
    const callbacks = (name: string, call: (cb: TrainerCallbacks) => unknown): Promise<void> => {
      const failed = (e: unknown): void => {
        const err = e instanceof Error ? e : new Error(String(e))
        incident("callback", `callback ${name} threw: ${err.message}`, { type: "callback-error", callback: name, message: err.message, stack: err.stack ?? "" })
      }
      const pending: Array<Promise<unknown>> = []
      for (const cb of cfg.callbacks) {
        try {
          const r = call(cb)
          if (r instanceof Promise) pending.push(r.catch(failed))
        } catch (e) {
          failed(e)
        }
      }
      return Promise.all(pending).then(() => undefined)
    }

    // The run's only way to stop early besides a failure the policy gives up on: the bus stayed
    // away too long, or a signal. Every wait of the main loop races it.
    let abortError: Error | undefined
    let rejectAborted!: (e: Error) => void
    const aborted = new Promise<never>((_, reject) => (rejectAborted = reject))
    aborted.catch(() => {})
    const abort = (e: Error): void => {
      if (abortError) return
      abortError = e
      controller.fail(undefined, { kind: "config", rank: -1, tag: (e as { _tag?: string })._tag ?? e.name, message: e.message })
      rejectAborted(e)
    }
    const race = <T>(p: Promise<T>): Promise<T> => Promise.race([p, aborted])

    const controller = new Controller<CheckpointPayload>(
      { maxFailures: cfg.maxFailures, minWorkers: cfg.minWorkers, maxWorkers: cfg.maxWorkers },
      (e) => {
        if (e.type === "state") {
          void callbacks("onStateChange", (cb) => cb.onStateChange?.({ from: e.from, to: e.to, attempt: e.attempt }))
          recorder.event({ type: "state", from: e.from, to: e.to, attempt: e.attempt })
          monitor?.changed()
        } else {
          completeRound(e.round)
        }
      }
    )

    const saveCheckpoint = async (round: CompletedRound<CheckpointPayload>, ckpt: CheckpointPayload): Promise<void> => {
      const files = { ...ckpt.files, ...round.aux }
      const metadata = { ...ckpt.metadata, attempt: round.attempt, round: round.index, worldSize: round.metrics.length }
      const t0 = performance.now()
      let lastError: unknown
      for (let attempt = 1; attempt <= CHECKPOINT_WRITE_ATTEMPTS; attempt++) {
        try {
          const entry = await store.save({ files, metadata }, round.metrics[0])
          lineage.set(entry.path, round.index + 1)
          recorder.trace({ ...spanEvent("checkpoint save", t0, performance.now(), "checkpoints", { path: entry.path, round: round.index }, "checkpoint"), pid: "driver" })
          monitor?.changed()
          await callbacks("onCheckpoint", (cb) => cb.onCheckpoint?.({ path: entry.path, metrics: entry.metrics }))
          return
        } catch (e) {
          lastError = e
          // A bad file name will not get better; a full disk or a restarting object store may.
          if (e instanceof ConfigError) break
          if (attempt < CHECKPOINT_WRITE_ATTEMPTS) await sleep(500 * 2 ** (attempt - 1))
        }
      }
      const message = lastError instanceof Error ? lastError.message : String(lastError)
      const attempts = lastError instanceof ConfigError ? 1 : CHECKPOINT_WRITE_ATTEMPTS
      checkpointErrors.push({ time: new Date().toISOString(), round: round.index, message, attempts })
      incident("checkpoint", `the checkpoint of report round ${round.index} could not be written (${attempts} attempt(s)): ${firstLine(message)}; training goes on`, {
        type: "checkpoint-error",
        round: round.index,
        attempts,
        message
      })
    }

    const completeRound = (round: CompletedRound<CheckpointPayload>): void => {
      const { index, metrics } = round
      history.push(metrics[0])
      perRank.push([...metrics])
      recorder.metrics(index, metrics[0], metrics, round.attempt)
      monitor?.report(index, round.attempt, metrics[0], metrics)
      refreshReport(false)
      progress.report(index, metrics[0])
      const repaired = metrics[0]?.[PARITY_METRIC]
      if (typeof repaired === "number" && repaired > 0) {
        const ranks = String(metrics[0]?.[`${PARITY_METRIC}_ranks`] ?? "").split(" ").map(Number)
        incident("parity", `report round ${index}: the weights or optimizer state of rank(s) ${ranks.join(", ")} differed from rank 0's; they took rank 0's`, {
          type: "parity-repair",
          attempt: round.attempt,
          round: index,
          ranks
        })
      }
      void callbacks("onReport", (cb) => cb.onReport?.({ index, metrics: metrics[0], perRank: metrics }))
      const ckpt = round.checkpoint
      if (ckpt) saving = saving.then(() => saveCheckpoint(round, ckpt))
    }

    // Worker output (embedded cluster: the local agent forwards it here) goes to the terminal and
    // to logs/<worker>.log in the run directory.
    const onOutput = (line: string): void => {
      const m = /^\(([^)]*?)(?: pid=\d+)?(?: node=[^)]*)?\)/.exec(line)
      recorder.log(m ? m[1] : "workers", line)
      progress.line(line)
    }
    let cluster: ClusterHandle
    try {
      cluster = cfg.cluster
        ? await joinCluster(cfg.cluster)
        : await startEmbeddedCluster({
            verbose,
            output: onOutput,
            cpusNeeded:
              cfg.maxWorkers * (cfg.scaling.resourcesPerWorker?.CPU ?? (cfg.scaling.useGpu === true ? 0 : 1)) +
              (cfg.collective.parameterServer ? cfg.collective.parameterServer.numServers * SERVER_CPUS : 0),
            useGpu: cfg.scaling.useGpu !== undefined && cfg.scaling.useGpu !== false,
            gpusNeeded: cfg.maxWorkers * (cfg.scaling.resourcesPerWorker?.GPU ?? 1),
            // The embedded server keeps its JetStream data in the run directory, so a run's object
            // store checkpoints outlive it and a run with the same name resumes from them.
            ...(bucket !== undefined ? { jetstreamStoreDir: path.join(cfg.runDir, "jetstream") } : {}),
            serverEvents: {
              onExit: (x) => {
                serverRestartedDuringOutage = true
                incident("nats-server", `the embedded nats-server (pid ${x.pid}) exited; restarting it on the same port`, { type: "nats-server-exit", pid: x.pid })
              },
              onRestart: (x) => {
                natsServerRestarts = x.restarts
                incident("nats-server", `the embedded nats-server is back (pid ${x.pid}, ${x.downMs} ms after it exited)`, {
                  type: "nats-server-restart",
                  pid: x.pid,
                  downMs: x.downMs,
                  restarts: x.restarts
                })
              },
              onRestartFailed: (x) => {
                const message = x.error instanceof Error ? x.error.message : String(x.error)
                incident("nats-server", `restarting the embedded nats-server failed (attempt ${x.attempt + 1}): ${firstLine(message)}`, {
                  type: "nats-server-restart-failed",
                  attempt: x.attempt,
                  message
                })
              }
            }
          })
    } catch (e) {
      progress.close()
      await recorder.close().catch(() => {})
      // The run directory is complete also when the cluster never came up.
      await recorder.finish(runSummary("failed", e as Error)).catch(() => {})
      throw withResult(e as Error, emptyResult(cfg.runDir))
    }
    const readAt = (p: string): ReturnType<typeof readCheckpoint> =>
      isObjectCheckpointUrl(p) ? readObjectCheckpoint(cluster.nc, p) : readCheckpoint(p)
    try {
      store = localStore ?? (await ObjectCheckpointStore.open(cluster.nc, bucket!, cfg.name, policy, cfg.cluster ? `the NATS server at ${describeConnection(cfg.cluster.connection)}` : "the embedded nats-server"))
      if (cfg.resumeFrom !== undefined && isObjectCheckpointUrl(cfg.resumeFrom)) await readAt(cfg.resumeFrom)
      await resolveDatasets(cfg.datasets, resolvedData, async () => cluster.nc)
    } catch (e) {
      await cluster.close().catch(() => {})
      progress.close()
      await recorder.close().catch(() => {})
      await recorder.finish(runSummary("failed", e as Error)).catch(() => {})
      throw withResult(e as Error, emptyResult(cfg.runDir))
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
    // Workers' heartbeat deadline, from the step times they report (collectives/deadlines.ts). GPU
    // workers get a longer floor: webgpu compiles each kernel's pipeline on its first use, holding
    // the worker's event loop (seconds a kernel on a software adapter), before any step is reported.
    const heartbeats = new HeartbeatDeadline(cfg.scaling.useGpu !== undefined && cfg.scaling.useGpu !== false ? { floorMs: GPU_WORKER_DEAD_AFTER_MS } : {})
    let heartbeatSaid: number | undefined
    const group = new WorkerGroup(system, () => heartbeats.current().ms, verbose)
    let controllerActor: ActorHandle | undefined

    // The job on the bus, for the dashboard and `gradwire jobs` / `gradwire logs` (job-monitor.ts).
    const stateNow = (): JobState => (controller.state === "errored" ? "failed" : controller.state)
    monitor = JobMonitor.start({
      nc: cluster.nc,
      cluster: cluster.clusterName,
      job,
      name: cfg.name,
      runDir: cfg.runDir,
      address: cluster.address,
      minWorkers: cfg.minWorkers,
      maxWorkers: cfg.maxWorkers,
      strategy: {
        strategy: cfg.collective.strategy ?? "allreduce",
        algorithm: cfg.collective.algorithm,
        compression: typeof cfg.collective.compression === "string" ? cfg.collective.compression : JSON.stringify(cfg.collective.compression),
        zeroStage: cfg.collective.zeroStage ?? 0
      },
      facts: () => {
        const latest = store.latest()
        const best = store.best()[0]
        const plan = planText()
        return {
          state: stateNow(),
          attempt: controller.attempt,
          worldSize: controller.current?.worldSize ?? 0,
          restarts,
          countedFailures: controller.countedFailures,
          resizes,
          incidents,
          reports: history.length,
          lastMetrics: history.at(-1),
          checkpoints: {
            count: store.list().length,
            ...(latest ? { latest: { path: latest.path, metrics: latest.metrics } } : {}),
            ...(best ? { best: { path: best.path, metrics: best.metrics } } : {})
          },
          ...(plan !== undefined ? { plan: { summary: Object.values(planSummaries).join("; "), text: plan, json: explained.algorithm?.json ?? null } } : {}),
          members: [...group.members].map(([rank, w]) => ({ rank, actor: w.name, node: w.node, pid: w.pid }))
        }
      }
    })
    if (cfg.run.dashboard) {
      const d = cfg.run.dashboard === true ? {} : cfg.run.dashboard
      try {
        dashboard = await startDashboard({
          nc: cluster.nc,
          cluster: cluster.clusterName,
          address: cluster.address,
          // A cluster with credentials gets a token. The embedded one's credential is the run's own
          // (made up to keep other local users off its bus): its loopback dashboard stays as it was.
          requireToken: !cluster.embedded && hasCredentials(cluster.connection),
          ...(d.host !== undefined ? { host: d.host } : {}),
          ...(d.port !== undefined ? { port: d.port } : {}),
          ...(d.token !== undefined ? { token: d.token } : {})
        })
        monitor.dashboard = dashboard.baseUrl
        const line = `gradwire: dashboard at ${dashboard.url} (Prometheus: ${dashboard.baseUrl}/metrics)`
        if (progress.mode === "off") console.log(line)
        else progress.line(line)
      } catch (e) {
        // A taken port costs the run its dashboard, not its training.
        progress.line(`gradwire: no dashboard: ${(e as Error).message}`)
      }
    }
    const refresher = setInterval(() => refreshReport(true), REPORT_REFRESH_MS)
    refresher.unref?.()

    // The driver's connection: an outage fails the running generation at once (its collectives
    // abort anyway), the group restarts once the bus is back, and an outage longer than
    // natsOutageTimeoutMs ends the run with NatsUnavailable.
    bus = watchBus(cluster.nc, {
      timeoutMs: cfg.natsOutageTimeoutMs,
      onDown: (o) => {
        incident("bus", `lost the NATS connection to ${cluster.where}; waiting up to ${cfg.natsOutageTimeoutMs / 1000} s for it to come back`, {
          type: "bus-down",
          server: o.server
        })
        controller.fail(controller.current, { kind: "bus", rank: -1, tag: "NatsDisconnected", message: `the driver lost its NATS connection to ${cluster.where}` })
      },
      onUp: (o) => {
        busOutages.push({ time: new Date(o.since).toISOString(), server: o.server, ms: o.ms, serverRestarted: serverRestartedDuringOutage })
        serverRestartedDuringOutage = false
        incident("bus", `the NATS connection is back after ${(o.ms / 1000).toFixed(1)} s`, { type: "bus-up", server: o.server, ms: o.ms })
      },
      onExpired: (o) => {
        busOutages.push({ time: new Date(o.since).toISOString(), server: o.server, ms: o.ms, serverRestarted: serverRestartedDuringOutage })
        recorder.event({ type: "bus-expired", server: o.server, ms: o.ms })
        abort(new NatsUnavailable({ servers: cluster.where, outageMs: o.ms, timeoutMs: cfg.natsOutageTimeoutMs, hint: cluster.outageHint }))
      }
    })
    const waitForBus = async (): Promise<void> => {
      if (!bus?.outage) return
      const r = await race(bus.whenUp())
      if (r === "closed") {
        abort(new NatsUnavailable({ servers: cluster.where, outageMs: 0, timeoutMs: cfg.natsOutageTimeoutMs, hint: "the connection was closed" }))
      }
      if (r !== "up") await aborted
    }

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

    const onSignal = (signal: NodeJS.Signals): void => {
      abort(new Interrupted({ signal }))
      // The run stops where it is; its directory is completed (report.html, metrics.csv,
      // summary.json) before the signal takes the process, within a deadline.
      let timer: ReturnType<typeof setTimeout> | undefined
      const deadline = new Promise<void>((resolve) => (timer = setTimeout(resolve, INTERRUPT_WRITE_MS)))
      void Promise.race([teardown().then(() => written), deadline]).finally(() => {
        clearTimeout(timer)
        process.removeListener("SIGINT", onSignal)
        process.removeListener("SIGTERM", onSignal)
        process.kill(process.pid, signal)
      })
    }
    let tornDown: Promise<void> | undefined
    const teardown = (): Promise<void> =>
      (tornDown ??= (async () => {
        // With the bus gone the agents cannot be reached: ask once, briefly (the workers exit on
        // their own after natsOutageTimeoutMs, and agents kill a job whose driver went silent).
        const busDown = bus?.outage !== undefined
        bus?.stop()
        clearInterval(refresher)
        await group.kill(job, "the run ended", busDown ? { timeoutMs: 1_000, alive: () => false } : {})
        await controllerActor?.stop({ drain: false, reason: "run ended" }).catch(() => {})
        // The job's last state goes out while the bus is still there (and into the jobs bucket).
        const ended: JobState = abortError instanceof Interrupted ? "interrupted" : (abortError ?? error) !== undefined || stateNow() === "failed" ? "failed" : "finished"
        const why = (abortError ?? error)?.message
        await monitor?.close({ state: ended, ...(why !== undefined ? { error: why } : {}) }, busDown ? 500 : 3_000).catch(() => {})
        await dashboard?.close().catch(() => {})
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

    const datasetPayload = datasetPayloads(cfg.datasets, resolvedData)
    const isCurrent = (attempt: number): boolean => controller.current?.number === attempt && controller.state === "running"

    const controllerDef = defineActor(ControllerProtocol, () => ({
      report: (body) => {
        controller.report(body)
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
        // The store's own checkpoints through the store (an object store reuses its open bucket); a
        // checkpoint the run was pointed at elsewhere (resumeFrom) by its kind of path.
        const c = await (store.list().some((e) => e.path === p) ? store.read(p) : readAt(p))
        return { path: p, metrics: c.metrics, payload: { files: c.files, metadata: c.metadata } }
      },
      progress: (body) => {
        if (!isCurrent(body.attempt)) return
        progress.step(body)
        recorder.progress(body.rank, body.samples)
        monitor?.progress(body)
        // The report's compute/communication split: kept whether or not the timeline is on.
        if (body.stepTimes) recorder.stepTimes(body.attempt, body.rank, body.stepTimes)
        if (body.stepTimes) {
          // [step, forward/backward, all-reduce, apply, wait]: the parts that hold the event loop.
          for (const s of body.stepTimes) heartbeats.noteCompute((s[1] ?? 0) + (s[3] ?? 0))
          // Said once measured, and again whenever it moves (only steps too long for the floor move it).
          const now = heartbeats.current()
          if (heartbeats.measured >= DEADLINE_WARMUP_STEPS && now.ms !== heartbeatSaid) {
            heartbeatSaid = now.ms
            const d = heartbeats.describe()
            progress.line(d.summary)
            recorder.event({ type: "explain", summary: d.summary })
            explained.heartbeat = { text: d.text, json: d.json }
            saving = saving.then(() => writeExplain(cfg.runDir, explained)).catch(() => {})
          }
        }
        void callbacks("onProgress", (cb) => cb.onProgress?.(body))
      },
      trace: (body) => {
        if (isCurrent(body.attempt)) recorder.traceEvents(body.rank, body.events)
      },
      explain: (body) => {
        if (!isCurrent(body.attempt)) return
        const part = body.part === "kernels" ? `kernels.${body.rank ?? 0}` : (body.part ?? "algorithm")
        if (body.summary) {
          progress.line(body.summary)
          recorder.event({ type: "explain", summary: body.summary })
        }
        explained[part] = { text: body.text, json: body.json }
        if (body.part !== "kernels" && body.part !== "deadlines") planSummaries[part] = body.summary
        monitor?.changed()
        saving = saving.then(() => writeExplain(cfg.runDir, explained)).catch(() => {})
      },
      finished: (body) => controller.finished(body),
      failed: (body) => controller.failed(body),
      peerState: (body) => {
        const st = peerStates.get(body.attempt)
        if (!st) throw new ConfigError({ field: "peerState", reason: `no survivor's state is held for generation ${body.attempt}` })
        return st
      }
    }))

    const request: Omit<PlacementRequest, "numWorkers"> = {
      jobId: job,
      ...(cfg.scaling.useGpu !== undefined ? { useGpu: cfg.scaling.useGpu } : {}),
      ...(cfg.scaling.resourcesPerWorker !== undefined ? { resourcesPerWorker: cfg.scaling.resourcesPerWorker } : {}),
      ...(cfg.scaling.placementStrategy !== undefined ? { placementStrategy: cfg.scaling.placementStrategy } : {}),
      ...(cfg.scaling.acceleratorType !== undefined ? { acceleratorType: cfg.scaling.acceleratorType } : {}),
      ...(cfg.scaling.nodeLabels !== undefined ? { nodeLabels: cfg.scaling.nodeLabels } : {}),
      ...(cfg.scaling.backend !== undefined ? { backend: cfg.scaling.backend } : {}),
      // Parameter servers are placed with the workers, SERVER_CPUS each.
      ...(cfg.collective.parameterServer ? { servers: cfg.collective.parameterServer.numServers } : {})
    }

    // Elastic runs below max size watch for capacity (an agent joined, another job ended) and
    // grow at the next report round that leaves a checkpoint.
    const watchCapacity = (worldSize: number): (() => void) => {
      if (!controller.elastic || worldSize >= cfg.maxWorkers) return () => {}
      const check = (): void => {
        if (controller.state !== "running") return
        const size = growTo(request, worldSize, cfg.maxWorkers, releasingJob(cluster.view.alive().map((n) => n.ad), job))
        if (size === undefined || size === controller.pendingResize?.size) return
        controller.capacity(size, `room for ${size} workers`)
        progress.line(`gradwire: the cluster has room for ${size} workers (running ${worldSize}); growing at the next checkpoint`)
      }
      const off = cluster.view.onEvent((e) => {
        if (e.type === "node-joined" || e.type === "node-back") check()
      })
      const timer = setInterval(check, 2_000)
      timer.unref?.()
      return () => {
        off()
        clearInterval(timer)
      }
    }

    let lastSize: number | undefined
    let lastCause: string | undefined
    /** A generation of another size than the last one: a resize (elastic shrink or growth). */
    const noteSize = (attempt: number, size: number): void => {
      if (lastSize !== undefined && size !== lastSize) {
        const resize: Resize = { time: new Date().toISOString(), attempt, from: lastSize, to: size, reason: lastCause ?? "capacity changed" }
        resizes.push(resize)
        incident("resize", `the group ${resize.to > resize.from ? "grows" : "shrinks"} from ${resize.from} to ${resize.to} workers (${resize.reason})`, { type: "resize", ...resize })
      }
      lastSize = size
    }
    const groupArgs: GroupArgs = {
      controller: "controller",
      loopModule: cfg.loop.module,
      loopExport: cfg.loop.export,
      ...(datasetModules(cfg.datasets).length > 0 ? { datasetModules: datasetModules(cfg.datasets) } : {}),
      loopConfig: cfg.loopConfig,
      // The direct links' secret: one per run, to the workers over the bus only (not in the run directory).
      collective: { ...cfg.collective, directSecret: randomBytes(32).toString("hex") },
      seed: cfg.seed,
      timeline: cfg.run.timeline === true,
      natsOutageTimeoutMs: cfg.natsOutageTimeoutMs,
      parityEvery: cfg.parityEvery,
      ...(controller.elastic ? { elastic: { maxWorkers: cfg.maxWorkers, batch: cfg.elasticBatch } } : {})
    }
    try {
      controllerActor = await launchActor(system, controllerDef, { name: "controller", heartbeat: false })
      let regrouped: Generation<CheckpointPayload> | undefined
      /** Why the last failure or resize was not recovered from the surviving peers. */
      let fallback: string | undefined
      // The world sizes the next placement may take: the controller's decision after a restart or
      // a resize (numWorkers, or min..max; a resize asks for up to its size).
      let bounds = controller.wantedSize
      // Killing the group goes through the agents: wait for the bus first; then let the last
      // checkpoint land.
      const stopGroup = async (reason: string): Promise<void> => {
        await waitForBus()
        await race(group.kill(job, reason, { alive: (node) => cluster.view.get(node)?.state === "alive" }))
        await race(saving)
      }
      // Recovery from peers after a failure, or growth in place: undefined when it cannot be done.
      const regroup = async (
        why: Pick<RegroupContext, "failure" | "target" | "what" | "budget" | "counted">
      ): Promise<Generation<CheckpointPayload> | undefined> => {
        const g = await race(
          this.#regroup({
            ...why, cfg, cluster, system, group, controller, request,
            saving: () => saving, incident, progress, groupArgs, lineage, peerStates, onSize: noteSize,
            latest: () => store.latest()?.path ?? resumePath,
            setResume: (p) => (resumePath = p),
            fellBack: (why) => (fallback = why)
          })
        )
        // The regroup set resumePath to the checkpoint its joiners resume from: it stays until the
        // next restart, whatever is saved meanwhile.
        return g
      }
      // A rank that died with its machine: its peers can name it (a direct link closes at once)
      // before the cluster view has missed the node's heartbeats. Before the failure is counted,
      // wait for the node's next heartbeat (alive: the rank's own failure stands) or its death
      // (then it is the lost node's, an infrastructure failure), at most the view's deadline.
      const nodeLossOrNot = async (o: Outcome): Promise<Outcome> => {
        const rank = deathToCheck(o)
        const node = rank === undefined ? undefined : group.members.get(rank)?.node
        if (node === undefined || cluster.view.get(node) === undefined) return o
        const at = Date.now()
        const known = (): boolean => {
          const n = cluster.view.get(node)
          return n === undefined || n.state !== "alive" || n.lastSeenAt > at
        }
        await cluster.view.waitFor(known, cluster.view.deadAfterMs + 1_000).catch(() => undefined)
        return deathOrNodeLoss(o, node, cluster.view.get(node)?.state)
      }
      for (let first = true; ; first = false) {
        let generation: Generation<CheckpointPayload>
        if (regrouped) {
          // The survivors of the last generation and their replacements run already.
          generation = regrouped
          regrouped = undefined
        } else {
          await waitForBus()
          const plan = await this.#place(cfg, cluster, request, bounds, { first, race, isAbort: (e) => e === abortError, progress })
          generation = controller.begin(plan.ranks.length)
          noteSize(generation.number, plan.ranks.length)
          progress.start(generation.number, plan.ranks.length)
          // A fresh lineage: report and operation counts start again from this checkpoint.
          lineage.clear()
          if (resumePath !== undefined) lineage.set(resumePath, 0)
          group.reset()
          const g = generation
          const startFailure = await race(
            (async () => {
              // The parameter servers first: the workers' args name them.
              let args = groupArgs
              const ps = cfg.collective.parameterServer
              if (ps) {
                try {
                  const servers = await group.spawnServers(
                    g.number,
                    ps.numServers,
                    plan.servers.map((s) => s.nodeId),
                    (index, detail) => controller.fail(g, { kind: "died", rank: -1, tag: "ServerDown", message: detail }),
                    () => !g.settled
                  )
                  args = {
                    ...groupArgs,
                    servers,
                    parameterServer: {
                      mode: ps.mode,
                      staleness: ps.staleness,
                      backupWorkers: cfg.collective.backupWorkers ?? 0,
                      timeoutMs: cfg.collective.timeoutMs,
                      ...(cfg.collective.strategy === "auto" ? { auto: true } : {})
                    }
                  }
                } catch (e) {
                  const err = e as { message?: string; _tag?: string }
                  return { tag: err._tag ?? "SpawnError", message: `a parameter server could not start: ${err.message ?? String(e)}` }
                }
              }
              return group.spawn(placementsOf(plan, g.number), args, {
                onDown: (rank, down) => controller.workerDown(g.number, rank, down),
                stillMatters: (rank) => !g.settled && !g.finished.has(rank)
              })
            })()
          )
          if (startFailure) {
            controller.fail(generation, { kind: startFailureKind(startFailure.tag, bus.outage !== undefined), rank: -1, ...startFailure })
          }
        }
        const attempt = generation.number
        const stopWatching = watchCapacity(generation.worldSize)
        const outcome: Outcome = await race(nodeLossOrNot(await race(generation.outcome)))
        stopWatching()
        const next = controller.next(outcome)
        if (next.action !== "restart") {
          await stopGroup(outcome.type === "finished" ? "training finished" : "the run failed")
          if (next.action === "finish") break
          recorder.event({ type: "failure", attempt, failure: next.failure, decision: { action: "fail", reason: next.reason } })
          error = new TrainingFailed(next.failure, attempt + 1, next.reason)
          break
        }
        restarts++
        bounds = next.size
        lastCause = restartReason(next.cause)
        // The controller's choice: regroup the surviving peers, or restart from the checkpoint (and why).
        const recovery = recoveryFor(next.cause, cfg.recoverFrom, bus.outage !== undefined)
        fallback = recovery.from === "checkpoint" ? recovery.reason : undefined
        if (next.cause.type === "failure") {
          const failure: GroupFailure = next.cause.failure
          recorder.event({ type: "failure", attempt, failure, decision: { action: "restart", counted: next.counted } })
          await callbacks("onRestart", (cb) => cb.onRestart?.({ attempt: attempt + 1, failure }))
          const budget = next.counted
            ? ` (restart ${controller.countedFailures}${cfg.maxFailures >= 0 ? ` of ${cfg.maxFailures}` : ""})`
            : " (not counted toward maxFailures: an infrastructure failure)"
          const what = `${failure.rank >= 0 ? `rank ${failure.rank} failed` : "the group failed"} (${failure.tag}: ${firstLine(failure.message)})`
          if (fallback === undefined) {
            await waitForBus()
            regrouped = await regroup({ failure, target: bounds.max, what, budget, counted: next.counted })
            if (regrouped) continue
          }
          await stopGroup("restarting the group")
          const from = store.latest() ? store.latest()!.name : "the start"
          incident("restart", `${what}; restarting the group from ${from}${fallback !== undefined ? ` (not from the surviving peers: ${fallback})` : ""}${budget}`, {
            type: "restart",
            attempt: attempt + 1,
            kind: failure.kind,
            counted: next.counted,
            from,
            recovery: "checkpoint",
            ...(fallback !== undefined ? { reason: fallback } : {})
          })
        } else {
          recorder.event({ type: "resize-requested", attempt, size: next.cause.size, reason: next.cause.reason, from: store.latest()?.name ?? "the start" })
          if (fallback === undefined) {
            // Growing in place: the running workers stay, the new ones replay from the checkpoint
            // just saved and join them.
            regrouped = await regroup({ target: bounds.max, what: `the cluster has room for ${bounds.max} workers`, budget: "", counted: false })
            if (regrouped) continue
          }
          recorder.event({ type: "resize-from-checkpoint", attempt, reason: fallback ?? "unknown" })
          await stopGroup("resizing the group")
        }
        resumePath = store.latest()?.path ?? resumePath
      }
    } catch (e) {
      error = abortError ?? (e as Error)
    } finally {
      if (error) controller.abort()
      await saving
      await teardown()
      process.removeListener("SIGINT", onSignal)
      process.removeListener("SIGTERM", onSignal)
    }
    const info = (e: CheckpointEntry): CheckpointInfo => ({ path: e.path, metrics: e.metrics })
    const latest = store.latest()
    try {
      await recorder.finish(runSummary(abortError instanceof Interrupted ? "interrupted" : error ? "failed" : "finished", error))
    } finally {
      markWritten()
    }
    progress.summary(recorder.dir, history.at(-1), error)
    const result: Result = {
      metrics: history.at(-1),
      metricsHistory: history,
      metricsPerRank: perRank,
      checkpoint: latest ? info(latest) : undefined,
      bestCheckpoints: store.best().map(info),
      path: cfg.runDir,
      restarts,
      countedFailures: controller.countedFailures,
      resizes,
      checkpointErrors,
      busOutages,
      natsServerRestarts
    }
    if (error) throw withResult(error, result)
    return result
  }

  /**
   * Recovery from surviving peers after a lost worker or node: pauses every other worker at its
   * next group operation, regroups those that park (the survivors) with replacements placed where
   * there is room (fixed size: as many as were lost; elastic: up to max, or none), and hands the
   * furthest survivor's state to the others. Returns the new, running generation, or undefined when
   * the survivors cannot be regrouped (then the caller restarts the group from the checkpoint).
   */
  async #regroup(x: RegroupContext): Promise<Generation<CheckpointPayload> | undefined> {
    const attempt = x.controller.attempt
    const giveUp = (why: string): undefined => {
      x.progress.line(`gradwire: cannot regroup the survivors (${why}); restarting from the checkpoint instead`)
      x.fellBack(why)
      return undefined
    }
    // Growing: only if the new workers have room now (nothing is paused for a grow that cannot be).
    if (!x.failure) {
      const planned = planLargest(x.request, { min: 1, max: Math.max(1, x.target - x.group.members.size) }, x.cluster.view.resources())
      if (!R.isSuccess(planned)) return giveUp(`no room for new workers: ${firstLine(planned.failure.message)}`)
    }
    // 1. Every other worker stops at its next group operation; those that park survive. Workers on
    // a node the cluster sees dead are lost with it: not asked (a cut link stalls an ask until its
    // timeout), and killed in the background in case the node comes back.
    const alive = (node: string): boolean => x.cluster.view.get(node)?.state === "alive"
    for (const [rank, w] of x.group.members) {
      if (rank !== x.failure?.rank && !alive(w.node)) void x.group.killOne(w, "its node was lost")
    }
    const replies = await Promise.all(
      [...x.group.members]
        .filter(([rank, w]) => rank !== x.failure?.rank && alive(w.node))
        .map(async ([rank, w]) => {
          const reply = await askAgain(() => x.system.askPromise(w.ref(WorkerProtocol), "pause", { attempt }, { timeoutMs: REGROUP_RETRY_MS }), PAUSE_TIMEOUT_MS)
          return { rank, w, reply }
        })
    )
    const survivors = replies.filter((r) => r.reply?.state === "parked").sort((a, b) => a.rank - b.rank)
    if (survivors.length === 0) {
      const why = replies.map((r) => r.reply?.reason).find((w) => w) ?? "no worker survived"
      return giveUp(why)
    }
    for (const r of replies) if (!survivors.includes(r)) await x.group.killOne(r.w, "left out of the regrouped generation")
    // The failed rank may still run (hung, or its loop threw): it is not part of the new group.
    const failed = x.failure ? x.group.members.get(x.failure.rank) : undefined
    if (failed) {
      const killing = x.group.killOne(failed, "it failed")
      if (alive(failed.node)) await killing
    }
    // 2. The survivor that got furthest: the others and the joiners continue from its state.
    const source = survivors.reduce((a, b) => (b.reply!.position.ops > a.reply!.position.ops ? b : a))
    const pos: Position = source.reply!.position
    // 3. Replacements: as many as were lost (fixed size), up to max where there is room (elastic).
    const s = survivors.length
    const kMax = x.target - s
    const kMin = Math.max(0, x.cfg.minWorkers - s)
    let joinPlan: PlacementPlan | undefined
    if (kMax > 0) {
      // New workers replay the loop from the checkpoint and join where the survivors are: in
      // dp.fit() at their epoch and step, in a hand-written loop after as many report() calls and
      // steps since (group-session.ts).
      const deadline = Date.now() + (kMin > 0 ? (x.cfg.scaling.placementTimeoutMs ?? PLACEMENT_TIMEOUT_MS) : 1_000)
      for (;;) {
        const planned = planLargest(x.request, { min: Math.max(1, kMin), max: kMax }, x.cluster.view.resources())
        if (R.isSuccess(planned)) {
          joinPlan = planned.success
          break
        }
        if (Date.now() >= deadline) {
          if (kMin > 0 || !x.failure) return giveUp(`no room for new workers: ${firstLine(planned.failure.message)}`)
          break
        }
        await x.cluster.view.waitFor(() => true, 500).catch(() => undefined)
      }
    }
    const joiners = joinPlan?.ranks.length ?? 0
    const worldSize = s + joiners
    const nodes = [...survivors.map((r) => r.w.node), ...(joinPlan?.ranks.map((r) => r.nodeId) ?? [])]
    const layout = layoutOf(nodes)
    const placementOf = (rank: number) => ({ attempt, rank, worldSize, ...layout[rank]!, nodes, group: `g${attempt}` })
    // 4. The furthest survivor's state, which every member loads.
    const state = await x.system.askPromise(source.w.ref(WorkerProtocol), "snapshot", null, { timeoutMs: 60_000 }).catch(() => undefined)
    if (!state) return giveUp(`rank ${source.rank} could not hand over its state`)
    x.peerStates.set(attempt, state)
    // 5. The regrouped generation: survivors keep their processes under new ranks, joiners start.
    // Rounds only the lost ranks had yet to report complete as it forms, and may leave a checkpoint:
    // the joiners resume from the latest one once it is written (its report count in this lineage
    // tells them where they start), and are given that one even if newer ones follow.
    const generation = x.controller.regroup({ worldSize, survivors: survivors.map((r, i) => ({ from: r.rank, to: i })), survivorsOnlyBelow: pos.reports })
    await x.saving()
    const from = x.latest()
    x.setResume(from)
    x.onSize(attempt, worldSize)
    x.progress.start(attempt, worldSize)
    const where = pos.inFit
      ? `epoch ${pos.epoch} step ${Math.min(pos.stepInEpoch, pos.stepsPerEpoch)}/${pos.stepsPerEpoch}`
      : `${pos.reports} report() calls and ${pos.stepsSinceReport} steps since the last`
    x.incident(
      x.failure ? "restart" : "resize",
      x.failure
        ? `${x.what}; regrouping ${s} surviving worker(s)${joiners ? ` with ${joiners} new one(s)` : ""} at the furthest survivor's position (${where}): at most the step in flight is lost${x.budget}`
        : `${x.what}: ${joiners} new worker(s) join the ${s} running ones at ${where}`,
      { type: x.failure ? "restart" : "grow", attempt, kind: x.failure?.kind ?? "resize", counted: x.counted, recovery: "peers", survivors: s, joiners, source: source.rank, position: pos }
    )
    const watch = {
      onDown: (rank: number, down: { readonly reason: string; readonly detail: string }) => x.controller.workerDown(attempt, rank, down),
      stillMatters: (rank: number) => !generation.settled && !generation.finished.has(rank)
    }
    const members = new Map(survivors.map((r, i) => [i, r.w] as const))
    x.group.adopt(members)
    x.group.watch(members, watch)
    const resumed = Promise.all(
      survivors.map(async (r, i) => {
        const ok = await askAgain(() => x.system.askPromise(r.w.ref(WorkerProtocol), "resume", { placement: placementOf(i), source: pos }, { timeoutMs: REGROUP_RETRY_MS }), 15_000)
        if (ok === undefined) throw new Error(`rank ${r.rank} did not answer`)
      })
    ).catch((e: unknown) => {
      x.controller.fail(generation, { kind: "recovery", rank: -1, tag: "RegroupError", message: `a survivor did not take its new place: ${String(e)}` })
    })
    if (joinPlan) {
      const fromReports = from !== undefined ? (x.lineage.get(from) ?? 0) : 0
      const spawns: RankSpawn[] = joinPlan.ranks.map((r, j) => ({
        placement: placementOf(s + j),
        nodeId: r.nodeId,
        backend: r.backend,
        gpuIndices: r.gpuIndices,
        cudaVisibleDevices: r.cudaVisibleDevices,
        resources: r.resources,
        join: { fromReports, to: pos }
      }))
      const failed = await x.group.spawn(spawns, x.groupArgs, watch)
      if (failed) x.controller.fail(generation, { kind: "recovery", rank: -1, ...failed })
    }
    await resumed
    return generation
  }

  /**
   * Places the group: the largest size within the bounds that fits now, or waits for room up to
   * scalingConfig.placementTimeoutMs (default 60 s), saying what it waits for. A first placement
   * the cluster could not hold even when idle fails at once unless a timeout was given.
   */
  async #place(
    cfg: Resolved,
    cluster: ClusterHandle,
    request: Omit<PlacementRequest, "numWorkers">,
    bounds: { readonly min: number; readonly max: number },
    ctx: {
      readonly first: boolean
      readonly race: <T>(p: Promise<T>) => Promise<T>
      readonly isAbort: (e: unknown) => boolean
      readonly progress: ProgressPrinter
    }
  ): Promise<PlacementPlan> {
    // Waits on the cluster view; a timeout just means "look again", the run's abort ends the wait.
    const settle = (p: Promise<unknown>): Promise<void> =>
      ctx.race(p).then(
        () => undefined,
        (e: unknown) => {
          if (ctx.isAbort(e)) throw e
        }
      )
    const explicit = cfg.scaling.placementTimeoutMs
    const timeoutMs = explicit ?? PLACEMENT_TIMEOUT_MS
    const deadline = Date.now() + timeoutMs
    let noticeAt = 0
    for (;;) {
      const nodes = cluster.view.resources()
      if (nodes.length === 0) {
        // Agents advertise every 500 ms; give a just-joined cluster a moment to be seen.
        await settle(cluster.view.waitFor((n) => n.some((x) => x.state === "alive"), ctx.first ? 3_000 : Math.max(50, deadline - Date.now())))
        if (cluster.view.resources().length > 0) continue
        if (ctx.first || Date.now() >= deadline) {
          throw new ConfigError({
            field: "cluster",
            reason: `no node agent is alive in cluster "${cluster.clusterName}": start one with \`gradwire start --head\` (or --address)`
          })
        }
        continue
      }
      const planned = planLargest(request, bounds, nodes)
      if (R.isSuccess(planned)) {
        // Which backend each rank runs, and why: said at start, and again when a new placement changes it.
        const line = describeBackends(planned.success.ranks, cfg.scaling.backend ?? "auto", cfg.scaling.useGpu ?? false, nodes)
        if (line !== this.#backendLine) ctx.progress.line(`gradwire: ${line}`)
        this.#backendLine = line
        return planned.success
      }
      const failure = planned.failure
      if (!(failure instanceof PlacementInfeasible)) throw failure
      if (ctx.first && explicit === undefined && R.isFailure(planLargest(request, bounds, idle(nodes)))) throw failure
      const now = Date.now()
      if (now >= deadline) throw failure
      if (now >= noticeAt) {
        noticeAt = now + PLACEMENT_NOTICE_EVERY_MS
        ctx.progress.line(`gradwire: waiting up to ${Math.ceil((deadline - now) / 1000)} s for room: ${firstLine(failure.message)}`)
      }
      await settle(cluster.view.waitFor(() => true, Math.min(1_000, Math.max(50, deadline - now))))
    }
  }
}

/** The Result of a run that stopped before its first generation. */
const emptyResult = (dir: string): Result => ({
  metrics: undefined,
  metricsHistory: [],
  metricsPerRank: [],
  checkpoint: undefined,
  bestCheckpoints: [],
  path: dir,
  restarts: 0,
  countedFailures: 0,
  resizes: [],
  checkpointErrors: [],
  busOutages: [],
  natsServerRestarts: 0
})
