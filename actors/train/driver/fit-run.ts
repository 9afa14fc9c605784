// One Trainer.fit() run: everything the run shares (the cluster, the controller, the worker group,
// the checkpoint store, what it records) in one object, with the steps fit()'s loop carries the
// controller's decisions out through: place (trainer.ts) and start a generation, watch it to its
// outcome, then finish, or regroup the survivors (regroup.ts) or restart from the checkpoint, as
// the controller decides (controller.ts: next, recoveryFor). open() brings up the cluster and what
// watches the run (the job monitor, the dashboard, the bus, signals); close() and result() end it.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { nuid } from "@nats-io/nats-core"
import { ConfigError, NatsUnavailable, firstLine } from "../../../core/errors.ts"
import { DEADLINE_WARMUP_STEPS, GPU_WORKER_DEAD_AFTER_MS, JOIN_CHECKPOINT_WAIT_MS } from "../../../core/defaults.ts"
import { HeartbeatDeadline, seconds } from "../../../collectives/deadlines.ts"
import type { BusMonitor } from "../../../core/bus-monitor.ts"
import { credentialKind, describeConnection, hasCredentials, redactConnection } from "../../../core/connection-spec.ts"
import { SERVER_CPUS, type PlacementPlan, type PlacementRequest } from "../../../scheduler/placement.ts"
import type { ResolvedDataset } from "../../../core/data/resolve.ts"
import { ActorSystem } from "../../runtime/system.ts"
import { defineActor, launchActor, type ActorHandle } from "../../runtime/actor.ts"
import type { RequestOf } from "../../runtime/protocol.ts"
import { AGENT_GONE } from "../../runtime/watcher.ts"
import { describeStack, mainThreadStack } from "../../runtime/heartbeat.ts"
import { silentLogger, stderrLogger } from "../../runtime/log.ts"
import { CheckpointStore, readCheckpoint, saveWithRetries, type CheckpointPolicy, type CheckpointStorage } from "./checkpoint-store.ts"
import { ObjectCheckpointStore, isObjectCheckpointUrl, readObjectCheckpoint } from "./object-checkpoint-store.ts"
import { fetchCheckpointData } from "./checkpoint-fetch.ts"
import { ControllerProtocol, RUN_FACTS_KEY, runFactsOf, ServerProtocol, type CheckpointPayload, type PeerState, type RunFacts } from "../common/train-protocol.ts"
import { missingStageShards } from "../common/stage-handover.ts"
import {
  Controller,
  deathOrNodeLoss,
  ranksToCheck,
  recoveryFor,
  restartReason,
  SERVER_DOWN,
  startFailureKind,
  type CompletedRound,
  type Generation,
  type GroupFailure,
  type Next,
  type Outcome,
  type Recovery
} from "./controller.ts"
import { isEndState } from "./failure-policy.ts"
import { readJsonLines } from "./result-files.ts"
import { WorkerGroup, groupArgsOf, placementRequestOf, placementsOf, type GroupArgs } from "./worker-group.ts"
import { startsAtOnce } from "./start-pacer.ts"
import { joinCluster, sharedCoresLine, startEmbeddedCluster, type ClusterHandle } from "./cluster.ts"
import type { Resolved } from "./options.ts"
import { datasetPayloads, describeDatasets, resolveDatasets } from "./dataset-payloads.ts"
import { latestAtOrBefore, regroupSurvivors, type RegroupContext } from "./regroup.ts"
import { Refill } from "./refill.ts"
import { FitRecord, emptyResult } from "./fit-record.ts"
import { Interrupted, TrainingFailed, withResult, type ObjectStoreLocation, type Result } from "./result.ts"
import { ProgressPrinter, changedConfigLine, configChanges, resumeLine } from "../common/observe/progress.ts"
import { RunRecorder } from "../common/observe/run-recorder.ts"
import { spanEvent } from "../common/observe/timeline.ts"
import { embeddedServerEvents, forwardJobLogs, nodeNews, startJobMonitor, startRunDashboard, watchDriverBus } from "./fit-watch.ts"
import type { JobState } from "../common/job-telemetry.ts"
import { ownSignalListener, programListens } from "../../../core/signals.ts"
import type { Dashboard } from "../dashboard/server.ts"

/** How long a server gets to make a lost one's replacement from its replica, or to send it its shard (a few shard sizes over the bus). */
const SERVER_HANDOVER_TIMEOUT_MS = 30_000

/** How long a failure blaming a rank waits for that rank's stack or idle place. */
const BLAMED_STACK_MS = 2_500
/** A blamed rank heard from this recently is asked (its beat thread answers). */
const BLAMED_HEARD_MS = 1_500
/** Attempts at writing one checkpoint before it is given up (and recorded in Result.checkpointErrors). */
const CHECKPOINT_WRITE_ATTEMPTS = 3

/**
 * Where a reader finds the run's object store checkpoints after fit(): the joined cluster's servers
 * (credentials only named: a reader passes its own), or the embedded server's JetStream directory.
 */
const objectStoreLocation = (cfg: Resolved): ObjectStoreLocation => {
  const c = cfg.cluster?.connection
  if (!c) return { jetstreamDir: path.join(cfg.runDir, "jetstream") }
  return {
    servers: [...c.servers],
    ...(hasCredentials(c) ? { credentials: credentialKind(c) } : {}),
    ...(c.tls !== undefined ? { tls: { ...c.tls } } : {})
  }
}

/** report.html, metrics.csv and summary.json are rewritten this often while the run goes on (fit-record.ts: and after report rounds). */
const REPORT_REFRESH_MS = 10_000

/** On Ctrl-C the run directory gets this long to be completed before the signal takes the process. */
const INTERRUPT_WRITE_MS = 15_000

/** The controller's decision to restart (after a failure or for a resize). */
export type Restart = Extract<Next, { readonly action: "restart" }>

export class FitRun {
  readonly cfg: Resolved
  readonly recorder: RunRecorder
  readonly progress: ProgressPrinter
  /** What the run records as it goes: rounds, incidents, resizes, explanations; the Result at the end. */
  readonly record: FitRecord
  readonly #resolvedData: Map<string, ResolvedDataset>
  readonly #localStore: CheckpointStore | undefined
  readonly #policy: CheckpointPolicy

  #resumePath: string | undefined
  /** resumeFrom's checkpoint, where it was read before the run's cluster started (another embedded run's bucket). */
  #resumeData: Awaited<ReturnType<typeof readCheckpoint>> | undefined
  /** The trainLoopConfig of an earlier fit() of this run (its config.json), where there was one. */
  #earlierLoopConfig: { readonly config: unknown } | undefined
  #saving: Promise<unknown> = Promise.resolve()
  // Workers' failure messages, one at a time (#withBlamedState may ask a rank first).
  #failing: Promise<void> = Promise.resolve()
  // Assigned once the cluster is up; nothing that reads it runs before that.
  #store!: CheckpointStorage
  // The lineage: checkpoints saved since the group last started afresh, with the number of
  // report() calls made before each (a joiner of a regroup counts its reports from there).
  readonly #lineage = new Map<string, number>()
  /** The run's report number (metrics.jsonl's "report") of each checkpoint of this run's store: a generation resuming one counts on from it. */
  readonly #reportOf = new Map<string, number>()
  // The state a regrouped generation continues from, by generation (the furthest survivor's).
  readonly #peerStates = new Map<number, PeerState>()
  #bus!: BusMonitor
  #error: Error | undefined
  #dashboard: Dashboard | undefined
  // The run's only way to stop early besides a failure the policy gives up on: the bus stayed
  // away too long, or a signal. Every wait of the main loop races it.
  abortError: Error | undefined
  #rejectAborted!: (e: Error) => void
  readonly #aborted = new Promise<never>((_, reject) => (this.#rejectAborted = reject))
  readonly controller: Controller<CheckpointPayload>
  cluster!: ClusterHandle
  #job!: string
  #system!: ActorSystem
  /** When each node's agent last sent an exit notice of this job's processes (ms since the epoch). */
  readonly #agentHeard = new Map<string, number>()
  #heartbeats!: HeartbeatDeadline
  #heartbeatSaid: number | undefined
  #group!: WorkerGroup
  #controllerActor: ActorHandle | undefined
  request!: Omit<PlacementRequest, "numWorkers">
  #groupArgs!: GroupArgs
  /**
   * The parameter servers of the running generation (started with it, kept across its regroups):
   * the args naming them, which joiners and standby workers need too, and the generation whose
   * failure a server's loss is.
   */
  #servers:
    | {
        readonly spawnedFor: number
        groupArgs: GroupArgs
        generation: Generation<CheckpointPayload>
        /** How a server's loss is reported, and whether it still matters (a replacement is watched the same way). */
        readonly onDown: (index: number, detail: string) => void
        readonly stillMatters: () => boolean
        /**
         * Servers lost and not made again yet, with what was seen: one lost while no generation
         * ran (a regroup forming) fails the next as it forms, and the regroup replaces them all.
         */
        readonly down: Map<number, string>
      }
    | undefined
  /** The workers' args: with the running generation's parameter servers, when it has them. */
  get #liveArgs(): GroupArgs {
    return this.#servers?.groupArgs ?? this.#groupArgs
  }
  /** Standby workers that refill a short group (refill.ts). */
  #refill!: Refill
  #refresher: ReturnType<typeof setInterval> | undefined
  #logSub: { unsubscribe(): void } | undefined
  #tornDown: Promise<void> | undefined
  /** Why the last failure or resize was not recovered from the surviving peers. */
  #fallback: string | undefined
  // The world sizes the next placement may take: the controller's decision after a restart or
  // a resize (numWorkers, or min..max; a resize asks for up to its size).
  bounds: { readonly min: number; readonly max: number }

  private constructor(
    cfg: Resolved,
    recorder: RunRecorder,
    progress: ProgressPrinter,
    resolvedData: Map<string, ResolvedDataset>,
    localStore: CheckpointStore | undefined,
    policy: CheckpointPolicy
  ) {
    this.cfg = cfg
    this.recorder = recorder
    this.progress = progress
    this.record = new FitRecord(cfg, recorder, progress)
    this.#resolvedData = resolvedData
    this.#localStore = localStore
    this.#policy = policy
    this.#resumePath = cfg.resumeFrom
    this.#aborted.catch(() => {})
    this.controller = new Controller<CheckpointPayload>({ maxFailures: cfg.maxFailures, minWorkers: cfg.minWorkers, maxWorkers: cfg.maxWorkers }, (e) => {
      if (e.type === "state") {
        void this.record.callbacks("onStateChange", (cb) => cb.onStateChange?.({ from: e.from, to: e.to, attempt: e.attempt }))
        this.recorder.event({ type: "state", from: e.from, to: e.to, attempt: e.attempt })
        this.record.monitor?.changed()
      } else {
        this.#completeRound(e.round)
      }
    })
    this.bounds = this.controller.wantedSize
  }

  /**
   * Everything before the first placement: datasets, the run directory and its recorder, the
   * checkpoint store, the cluster, and what watches the run. A failure before the cluster is up
   * leaves a complete run directory and rejects with an empty Result.
   */
  static async open(cfg: Resolved): Promise<FitRun> {
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
    const localStore = cfg.run.checkpointConfig?.objectStore === undefined ? await CheckpointStore.open(cfg.runDir, policy) : undefined
    // Fails early on a bad path (a nats-obj:// one is checked once the cluster is joined). A
    // checkpoint another embedded run kept in its bucket is read now from that run's data (its
    // nats-server stopped with its fit()), not looked for in this run's cluster.
    if (cfg.resumeFrom !== undefined && !isObjectCheckpointUrl(cfg.resumeFrom)) await readCheckpoint(cfg.resumeFrom)
    const elsewhere = cfg.resumeFromStore?.jetstreamDir
    const resumeData =
      cfg.resumeFrom !== undefined && elsewhere !== undefined && path.resolve(elsewhere) !== path.join(cfg.runDir, "jetstream")
        ? await fetchCheckpointData({ path: cfg.resumeFrom, metrics: {}, objectStore: { jetstreamDir: elsewhere } }, {}, "resumeFromCheckpoint")
        : undefined
    // (the trainLoopConfig an earlier fit() of this run made its checkpoints with, before this one's replaces it)
    const earlierLoopConfig = await fs
      .readFile(path.join(cfg.runDir, "config.json"), "utf8")
      .then((t) => ({ config: (JSON.parse(t) as { trainLoopConfig?: unknown }).trainLoopConfig }), () => undefined)
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
    progress.line(`gradwire: run directory ${cfg.runDir} (report.html is refreshed as it trains)`)
    const run = new FitRun(cfg, recorder, progress, resolvedData, localStore, policy)
    run.#resumeData = resumeData
    run.#earlierLoopConfig = earlierLoopConfig
    await run.#join()
    await run.#setUp()
    return run
  }

  readonly #abort = (e: Error): void => {
    if (this.abortError) return
    this.abortError = e
    this.controller.fail(undefined, { kind: e instanceof Interrupted ? "interrupted" : "config", rank: -1, tag: (e as { _tag?: string })._tag ?? e.name, message: e.message })
    this.#rejectAborted(e)
  }

  /** `p`, or the run's abort (the bus stayed away, a signal), whichever comes first. */
  readonly race = <T>(p: Promise<T>): Promise<T> => Promise.race([p, this.#aborted])

  async #saveCheckpoint(round: CompletedRound<CheckpointPayload>, ckpt: CheckpointPayload, report: number): Promise<void> {
    const files = { ...ckpt.files, ...round.aux }
    // A pipeline's round that a regroup completed without a lost rank's report lacks its stage.
    const missing = missingStageShards(files)
    if (missing.length > 0) {
      this.record.checkpointSkipped(report, `it lacks the shard of ${missing.join(", ")} (its rank was lost before it reported this round)`)
      return
    }
    // The driver's facts go under their own key: the loop's metadata stays as it gave it.
    const facts: RunFacts = { attempt: round.attempt, round: round.index, report, worldSize: round.metrics.length }
    const metadata = { ...ckpt.metadata, [RUN_FACTS_KEY]: facts }
    const t0 = performance.now()
    const saved = await saveWithRetries(this.#store, { files, metadata }, round.metrics[0], CHECKPOINT_WRITE_ATTEMPTS)
    if ("error" in saved) {
      this.record.checkpointFailed(report, saved.tries, saved.error instanceof Error ? saved.error.message : String(saved.error))
      return
    }
    const { entry } = saved
    this.#lineage.set(entry.path, round.index + 1)
    this.#reportOf.set(entry.path, report)
    this.recorder.trace({ ...spanEvent("checkpoint save", t0, performance.now(), "checkpoints", { path: entry.path, round: round.index }, "checkpoint"), pid: "driver" })
    this.record.monitor?.changed()
    await this.record.callbacks("onCheckpoint", (cb) => cb.onCheckpoint?.({ path: entry.path, metrics: entry.metrics }))
  }

  /**
   * The checkpoint a rank joining generation `attempt` resumes from, where the survivors had made
   * `reports` report() calls, with the report() calls made before it (the joiner counts on from
   * there). A survivor that parked one step behind the furthest (the pause closed the group under
   * its step's exchange) makes that step's report only once regrouped, so the round of report
   * `reports` may complete, and its checkpoint be saved, after the regroup formed: that checkpoint
   * is the one to join from (an older one would leave the joiner short of the report made in a
   * step it skips). Waits for that round (at most JOIN_CHECKPOINT_WAIT_MS), then takes the latest
   * checkpoint of the lineage made at or before it; undefined when the lineage has none.
   */
  async #joinCheckpoint(joinAt: { readonly attempt: number; readonly reports: number }): Promise<{ path: string; reports: number } | undefined> {
    const deadline = Date.now() + JOIN_CHECKPOINT_WAIT_MS
    for (;;) {
      const g = this.controller.current
      if (!g || g.number !== joinAt.attempt || joinAt.reports <= 0 || g.completed.has(joinAt.reports - 1) || Date.now() >= deadline) break
      await new Promise((resolve) => setTimeout(resolve, 20))
    }
    await this.#saving
    return latestAtOrBefore(this.#lineage, joinAt.reports)
  }

  #completeRound(round: CompletedRound<CheckpointPayload>): void {
    this.record.round(round)
    const ckpt = round.checkpoint
    // (its report number now: a save queued behind another may run after the next generation began)
    const report = this.record.reportBase + round.index
    if (ckpt) this.#saving = this.#saving.then(() => this.#saveCheckpoint(round, ckpt, report))
  }

  // Worker output (embedded cluster: the local agent forwards it here) goes to the terminal and
  // to logs/<worker>.log in the run directory.
  readonly #onOutput = (line: string): void => {
    const m = /^\(([^)]*?)(?: pid=\d+)?(?: node=[^)]*)?\)/.exec(line)
    this.recorder.log(m ? m[1] : "workers", line)
    this.progress.output(line)
  }

  /** The cluster (embedded or joined), the checkpoint store, and datasets in an object store. */
  async #join(): Promise<void> {
    const { cfg } = this
    const bucket = cfg.run.checkpointConfig?.objectStore
    try {
      this.cluster = cfg.cluster
        ? await joinCluster(cfg.cluster)
        : await startEmbeddedCluster({
            verbose: cfg.run.verbose === true,
            output: this.#onOutput,
            cpusNeeded:
              (cfg.maxWorkers + cfg.spares) * (cfg.scaling.resourcesPerWorker?.CPU ?? (cfg.scaling.useGpu === true ? 0 : 1)) +
              (cfg.collective.parameterServer ? cfg.collective.parameterServer.numServers * SERVER_CPUS : 0),
            useGpu: cfg.scaling.useGpu !== undefined && cfg.scaling.useGpu !== false,
            gpusNeeded: (cfg.maxWorkers + cfg.spares) * (cfg.scaling.resourcesPerWorker?.GPU ?? 1),
            // The embedded server keeps its JetStream data in the run directory, so a run's object
            // store checkpoints outlive it and a run with the same name resumes from them.
            ...(bucket !== undefined ? { jetstreamStoreDir: path.join(cfg.runDir, "jetstream") } : {}),
            serverEvents: embeddedServerEvents(this.record)
          })
    } catch (e) {
      // (said as a started run's failure is: the closing lines, the run directory)
      this.progress.summary(cfg.runDir, undefined, e as Error)
      this.progress.close()
      await this.recorder.close().catch(() => {})
      // The run directory is complete also when the cluster never came up.
      await this.recorder.finish(this.record.summary("failed", e as Error)).catch(() => {})
      throw withResult(e as Error, emptyResult(cfg.runDir))
    }
    const cluster = this.cluster
    if (!cfg.cluster) {
      const line = sharedCoresLine(cfg.scaling.useGpu === true ? 0 : cfg.maxWorkers, os.availableParallelism())
      if (line) this.progress.line(line)
    }
    try {
      this.#store =
        this.#localStore ??
        (await ObjectCheckpointStore.open(
          cluster.nc,
          bucket!,
          cfg.name,
          this.#policy,
          cfg.cluster ? `the NATS server at ${describeConnection(cfg.cluster.connection)}` : "the embedded nats-server",
          { runDir: cfg.runDir, location: objectStoreLocation(cfg) }
        ))
      if (cfg.resumeFrom !== undefined && isObjectCheckpointUrl(cfg.resumeFrom) && this.#resumeData === undefined) await this.#readAt(cfg.resumeFrom)
      await resolveDatasets(cfg.datasets, this.#resolvedData, async () => cluster.nc)
    } catch (e) {
      await cluster.close().catch(() => {})
      this.progress.summary(cfg.runDir, undefined, e as Error)
      this.progress.close()
      await this.recorder.close().catch(() => {})
      await this.recorder.finish(this.record.summary("failed", e as Error)).catch(() => {})
      throw withResult(e as Error, emptyResult(cfg.runDir))
    }
  }

  #readAt(p: string): ReturnType<typeof readCheckpoint> {
    if (p === this.cfg.resumeFrom && this.#resumeData !== undefined) return Promise.resolve(this.#resumeData)
    return isObjectCheckpointUrl(p) ? readObjectCheckpoint(this.cluster.nc, p) : readCheckpoint(p)
  }

  #stateNow(): JobState {
    return this.controller.state === "errored" ? "failed" : this.controller.state
  }

  /**
   * A rerun resuming a checkpoint of its own run goes on with the run's history: its report numbers
   * count on from the checkpoint's, and the earlier fit()'s rounds up to it come first in the Result,
   * metrics.csv and report.html (as Ray's restored trainer continues its training_iteration).
   */
  async #continueHistory(): Promise<void> {
    const p = this.#resumePath
    if (p === undefined || !this.#store.list().some((e) => e.path === p)) return
    const report = await this.#store.metadataOf(p).then((m) => runFactsOf(m).report, () => undefined)
    if (report === undefined) return
    this.#reportOf.set(p, report)
    const rows = await readJsonLines(path.join(this.cfg.runDir, "metrics.jsonl"))
    const perRank = (await readJsonLines(path.join(this.cfg.runDir, "metrics_per_rank.jsonl"))).flatMap((r) =>
      typeof r.report === "number" && Array.isArray(r.ranks) ? [{ report: r.report, ranks: r.ranks as Array<Record<string, unknown>> }] : []
    )
    this.record.seed(rows, perRank, report + 1)
  }

  /** The job's actor system and worker group, the monitor and dashboard, the bus watch, the log feed, signals. */
  async #setUp(): Promise<void> {
    const { cfg, cluster } = this
    const verbose = cfg.run.verbose === true
    this.#resumePath ??= this.#store.latest()?.path
    if (this.#resumePath !== undefined) this.progress.line(resumeLine(cfg.name, this.#resumePath, cfg.resumeFrom !== undefined))
    await this.#continueHistory()
    // A rerun going on from its own checkpoint with another trainLoopConfig: said, not silently used.
    const changes = cfg.resumeFrom === undefined && this.#resumePath !== undefined && this.#earlierLoopConfig ? configChanges(this.#earlierLoopConfig.config, cfg.loopConfig) : []
    if (changes.length > 0) {
      const line = changedConfigLine(cfg.name, changes)
      this.progress.warn(line)
      this.recorder.event({ type: "config-changed", changes, checkpoint: this.#resumePath })
    }
    const job = (this.#job = `${cfg.name.slice(0, 100)}-${nuid.next().slice(-8)}`)
    this.#system = new ActorSystem({
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
    const heartbeats = (this.#heartbeats = new HeartbeatDeadline(cfg.scaling.useGpu !== undefined && cfg.scaling.useGpu !== false ? { floorMs: GPU_WORKER_DEAD_AFTER_MS } : {}))
    this.#group = new WorkerGroup(this.#system, (instance) => heartbeats.current(instance).ms, verbose, {
      silentAfterMs: () => heartbeats.silentMs,
      heldAfterMs: (instance) => heartbeats.heldMs(instance),
      // Said once a stretch, with where: its beat thread takes the main thread's stack (a moment's pause there).
      onHeld: (rank, heldMs, hungAfterMs, name) =>
        void mainThreadStack(this.#system.nc, this.#system.subjects.stack(name)).then((stack) => {
          const frames = stack?.frames ?? []
          this.progress.warn(
            `gradwire: rank ${rank}'s event loop has been held ${seconds(heldMs)} by one synchronous computation` +
              (frames.length > 0 ? ` ${describeStack(frames)}` : "") +
              ` (an evaluation loop whose awaits resolve at once? yield between its batches); its peers wait for it, and it is taken for hung after ${seconds(hungAfterMs)}`
          )
          this.recorder.event({ type: "held", rank, heldMs, hungAfterMs, ...(frames.length > 0 ? { stack: frames } : stack?.error ? { stackError: stack.error } : {}) })
        })
    }, (node) =>
      // The embedded node is this machine, sized to the job (cluster.ts): its cores are the real bound.
      startsAtOnce(cluster.embedded ? os.availableParallelism() : this.cluster.view.get(node)?.ad.cpus),
      (s) => this.recorder.event({ type: "process-start", ...s })
    )
    // An agent that sends a process's exit notice is alive: its node needs no heartbeat awaited (#nodeLossOrNot).
    const watcher = await this.#system.watcherReady()
    watcher.onEvent((e) => {
      if (e.type === "exit") this.#agentHeard.set(e.node, Date.now())
      // A worker whose agent is gone says so as it exits (actors/node/host.ts): its node is lost
      // now, not once its heartbeats are overdue, and no regroup asks the node's other workers.
      if (e.type === "stopped" && e.reason === AGENT_GONE) {
        const w = [...this.#group.members.values()].find((m) => m.instance === e.instance)
        if (w) this.cluster.view.markDead(w.node)
      }
    })
    this.record.monitor = startJobMonitor({
      cfg,
      cluster,
      job,
      controller: this.controller,
      record: this.record,
      store: () => this.#store,
      group: () => this.#group,
      state: () => this.#stateNow()
    })
    if (cfg.run.dashboard) this.#dashboard = await startRunDashboard(cluster, cfg.run.dashboard === true ? {} : cfg.run.dashboard, this.record, this.progress)
    this.#refresher = setInterval(() => this.record.refreshReport(true), REPORT_REFRESH_MS)
    this.#refresher.unref?.()
    this.#bus = watchDriverBus(cfg, cluster, this.controller, this.record, this.#abort)
    this.#logSub = forwardJobLogs(cluster, job, this.#onOutput)
    process.on("SIGINT", this.#onSignal)
    process.on("SIGTERM", this.#onSignal)
    this.request = placementRequestOf(cfg, job)
    this.#groupArgs = groupArgsOf(cfg, this.controller.elastic)
    this.#refill = new Refill({
      controller: this.controller,
      group: this.#group,
      cluster,
      request: this.request,
      groupArgs: () => this.#liveArgs,
      max: cfg.maxWorkers,
      spares: cfg.spares,
      job,
      line: (text) => this.progress.line(text),
      event: (e) => this.recorder.event(e)
    })
  }

  /** Returns once the bus is up (at once when it is), or rejects with the run's abort. */
  async waitForBus(): Promise<void> {
    if (!this.#bus?.outage) return
    const r = await this.race(this.#bus.whenUp())
    if (r === "closed") {
      this.#abort(new NatsUnavailable({ servers: this.cluster.where, outageMs: 0, timeoutMs: this.cfg.natsOutageTimeoutMs, hint: "the connection was closed" }))
    }
    if (r !== "up") await this.#aborted
  }

  readonly #onSignal = ownSignalListener((signal: NodeJS.Signals): void => {
    this.#abort(new Interrupted({ signal }))
    // The run stops where it is; its directory is completed (report.html, metrics.csv,
    // summary.json) before the signal takes the process, within a deadline.
    let timer: ReturnType<typeof setTimeout> | undefined
    const deadline = new Promise<void>((resolve) => (timer = setTimeout(resolve, INTERRUPT_WRITE_MS)))
    void Promise.race([this.#teardown().then(() => this.record.written), deadline]).finally(() => {
      clearTimeout(timer)
      process.removeListener("SIGINT", this.#onSignal)
      process.removeListener("SIGTERM", this.#onSignal)
      // The process ends of the signal, as by default, unless the program listens for it itself:
      // then it goes on, and fit() rejects with Interrupted (core/signals.ts).
      if (!programListens(signal)) process.kill(process.pid, signal)
    })
  })

  #teardown(): Promise<void> {
    return (this.#tornDown ??= (async () => {
      // With the bus gone the agents cannot be reached: ask once, briefly (the workers exit on
      // their own after natsOutageTimeoutMs, and agents kill a job whose driver went silent).
      const busDown = this.#bus?.outage !== undefined
      this.#bus?.stop()
      clearInterval(this.#refresher)
      await this.#group.kill(this.#job, "the run ended", busDown ? { timeoutMs: 1_000, alive: () => false } : {})
      await this.#controllerActor?.stop({ drain: false, reason: "run ended" }).catch(() => {})
      // The job's last state goes out while the bus is still there (and into the jobs bucket).
      const failure = this.abortError ?? this.#error
      const ended: JobState = this.abortError instanceof Interrupted ? "interrupted" : failure !== undefined || this.#stateNow() === "failed" ? "failed" : "finished"
      const why = failure?.message
      await this.record.monitor?.close({ state: ended, ...(why !== undefined ? { error: why } : {}) }, busDown ? 500 : 3_000).catch(() => {})
      await this.#dashboard?.close().catch(() => {})
      // Let the last forwarded log lines arrive before unsubscribing.
      if (this.#logSub) await this.cluster.nc.flush().catch(() => {})
      this.#logSub?.unsubscribe()
      this.#system.endJob()
      this.#system.close()
      await this.cluster.close().catch(() => {})
      this.progress.close()
      await this.recorder.close()
    })())
  }

  #isCurrent(attempt: number): boolean {
    return this.controller.current?.number === attempt && this.controller.state === "running"
  }

  /**
   * A worker's failure that blames a rank for a collective's timeout, with what that rank is doing,
   * asked of its beat thread (BLAMED_STACK_MS at most): where its idle loop waits, or its held main
   * thread's stack. The rank lives (it answered the liveness probe), so it is found as DDP's
   * timeouts never say: "its event loop is idle, its loop outside gradwire's calls, after 0
   * training steps since report() call 2".
   */
  async #withBlamedState<B extends { readonly attempt: number; readonly tag: string; readonly blamed?: ReadonlyArray<number> }>(body: B): Promise<B & { blamedState?: string }> {
    const blamed = body.blamed?.[0]
    const w = blamed === undefined ? undefined : this.#group.members.get(blamed)
    if (!w || (body.tag !== "CollectiveTimeout" && body.tag !== "CollectiveAborted") || !this.#isCurrent(body.attempt)) return body
    // Only a rank whose beats still come (an abort can blame a dead or stopped rank, which would
    // only make the regroup wait for an answer that cannot come).
    const heard = this.#system.watcher().heldState(w.name, w.instance)
    if (heard === undefined || heard.heardAgoMs > BLAMED_HEARD_MS) return body
    const st = await mainThreadStack(this.#system.nc, this.#system.subjects.stack(w.name), BLAMED_STACK_MS)
    if (st?.idle) {
      return { ...body, blamedState: `its event loop is idle${st.where !== undefined ? `, the loop ${st.where}` : ""} (an await that has not settled?)` }
    }
    if (st?.frames && st.frames.length > 0) return { ...body, blamedState: `its main thread is ${describeStack(st.frames)}` }
    return body
  }

  /** The controller actor: what the workers report to, and ask for (datasets, the checkpoint, a survivor's state). */
  async launch(): Promise<void> {
    const datasetPayload = datasetPayloads(this.cfg.datasets, this.#resolvedData)
    const controller = this.controller
    const def = defineActor(ControllerProtocol, () => ({
      report: (body) => {
        controller.report(body)
        return null
      },
      dataset: (body) => {
        const d = datasetPayload.get(body.name)
        if (!d) {
          throw new ConfigError({
            field: `getDatasetShard("${body.name}")`,
            reason: `no dataset "${body.name}" was given to the Trainer; it has: ${[...datasetPayload.keys()].join(", ") || "none"} (give it as the Trainer's datasets: { ${JSON.stringify(body.name)}: ... }, or with gradwire train's --dataset ${body.name}=FILES)`
          })
        }
        return d
      },
      checkpoint: async (body) => {
        await this.#saving
        const joined = body?.joinAt ? await this.#joinCheckpoint(body.joinAt) : undefined
        const p = joined?.path ?? this.#resumePath
        if (!p) return null
        // The store's own checkpoints through the store (an object store reuses its open bucket); a
        // checkpoint the run was pointed at elsewhere (resumeFrom) by its kind of path.
        const c = await (this.#store.list().some((e) => e.path === p) ? this.#store.read(p) : this.#readAt(p))
        const omit = new Set(body?.omit ?? [])
        const files = omit.size === 0 ? c.files : Object.fromEntries(Object.entries(c.files).filter(([f]) => !omit.has(f)))
        return { path: p, metrics: c.metrics, payload: { files, metadata: c.metadata }, ...(joined ? { reports: joined.reports } : {}) }
      },
      progress: (body) => this.#onProgress(body),
      trace: (body) => {
        if (this.#isCurrent(body.attempt)) this.recorder.traceEvents(body.rank, body.events)
      },
      explain: (body) => {
        if (!this.#isCurrent(body.attempt)) return
        const part = body.part === "kernels" ? `kernels.${body.rank ?? 0}` : (body.part ?? "algorithm")
        const write = this.record.explain(part, body.text, body.json, body.summary)
        if (body.part !== "kernels" && body.part !== "deadlines") this.record.planSummaries[part] = body.summary
        this.record.monitor?.changed()
        this.#saving = this.#saving.then(write).catch(() => {})
      },
      liveness: (body) => {
        if (!this.#isCurrent(body.attempt)) return []
        const watcher = this.#system.watcher()
        const known: Array<{ rank: number; heardAgoMs: number; heldMs: number; cpu?: number; hungAfterMs: number }> = []
        for (const rank of body.ranks) {
          const w = this.#group.members.get(rank)
          const state = w && watcher.heldState(w.name, w.instance)
          if (w && state) known.push({ rank, ...state, hungAfterMs: this.#heartbeats.heldMs(w.instance) })
        }
        return known
      },
      finished: (body) => {
        if (body.unapplied) this.record.unappliedAccumulation(body.rank, body.unapplied)
        controller.finished(body)
      },
      // In arrival order; one that blames a rank for a collective's timeout waits while that rank
      // is asked where it is (its process lives: it answered the liveness probe).
      failed: (body) => {
        // (asking can fail, the failure must still be told: without it the generation never ends)
        this.#failing = this.#failing.then(async () => controller.failed(await this.#withBlamedState(body).catch(() => body))).catch(() => {})
      },
      peerState: (body) => {
        const st = this.#peerStates.get(body.attempt)
        if (!st) throw new ConfigError({ field: "peerState", reason: `no survivor's state is held for generation ${body.attempt}` })
        if (body.files === undefined) return st
        const only: Record<string, Uint8Array> = {}
        for (const f of body.files) if (st.files[f] !== undefined) only[f] = st.files[f]
        return { ...st, files: only }
      }
    }))
    this.#controllerActor = await launchActor(this.#system, def, { name: "controller", heartbeat: false })
  }

  #onProgress(body: RequestOf<ControllerProtocol["kinds"], "progress">): void {
    if (!this.#isCurrent(body.attempt)) return
    this.progress.step(body)
    this.recorder.progress(body.rank, body.samples)
    this.record.monitor?.progress(body)
    // The report's compute/communication split: kept whether or not the timeline is on.
    if (body.stepTimes) this.recorder.stepTimes(body.attempt, body.rank, body.stepTimes)
    if (body.stepTimes) {
      const heartbeats = this.#heartbeats
      // [step, forward/backward, all-reduce, apply, wait]: the parts that hold the event loop.
      const who = this.#group.members.get(body.rank)?.instance
      for (const s of body.stepTimes) heartbeats.noteCompute((s[1] ?? 0) + (s[3] ?? 0), who)
      // Said once measured, and again whenever it moves (only steps too long for the floor move it).
      const now = heartbeats.current()
      if (heartbeats.measured >= DEADLINE_WARMUP_STEPS && now.ms !== this.#heartbeatSaid) {
        this.#heartbeatSaid = now.ms
        const d = heartbeats.describe()
        this.progress.line(d.summary)
        this.recorder.event({ type: "explain", summary: d.summary })
        const write = this.record.explain("heartbeat", d.text, d.json)
        this.#saving = this.#saving.then(write).catch(() => {})
      }
    }
    void this.record.callbacks("onProgress", (cb) => cb.onProgress?.(body))
  }

  /** Whether the cluster sees `node` alive. */
  readonly #nodeAlive = (node: string): boolean => this.cluster.view.get(node)?.state === "alive"

  // Killing the group goes through the agents: wait for the bus first; then let the last
  // checkpoint land.
  async #stopGroup(reason: string): Promise<void> {
    await this.waitForBus()
    await this.race(this.#group.kill(this.#job, reason, { alive: this.#nodeAlive }))
    await this.race(this.#saving)
  }

  /** Start: a new generation on the placement, from the checkpoint to resume from (a fresh lineage). */
  async start(plan: PlacementPlan): Promise<Generation<CheckpointPayload>> {
    const generation = this.controller.begin(plan.ranks.length)
    // Its rounds are counted on from the checkpoint's report (a checkpoint from elsewhere starts a new history at 0).
    const from = this.#resumePath !== undefined ? this.#reportOf.get(this.#resumePath) : undefined
    this.record.startsAt(from !== undefined ? from + 1 : 0)
    this.record.noteSize(generation.number, plan.ranks.length)
    this.progress.start(generation.number, plan.ranks.length)
    // A fresh lineage: report and operation counts start again from this checkpoint.
    this.#lineage.clear()
    if (this.#resumePath !== undefined) this.#lineage.set(this.#resumePath, 0)
    this.#group.reset()
    const g = generation
    const startFailure = await this.race(
      (async () => {
        // The parameter servers first: the workers' args name them.
        const args = await this.#spawnServers(g, plan)
        if (!("groupArgs" in args)) return args
        return this.#group.spawn(placementsOf(plan, g.number, this.bounds.max), args.groupArgs, {
          onDown: (rank, down) => this.controller.workerDown(g.number, rank, down),
          stillMatters: (rank) => !g.settled && !g.finished.has(rank)
        })
      })()
    )
    if (startFailure) {
      this.controller.fail(generation, { kind: startFailureKind(startFailure.tag, this.#bus.outage !== undefined), rank: -1, ...startFailure })
    }
    return generation
  }

  /** The parameter servers (collectiveConfig.parameterServer), and the workers' args naming them; or why they could not start. */
  async #spawnServers(g: Generation<CheckpointPayload>, plan: PlacementPlan): Promise<{ readonly groupArgs: GroupArgs } | { readonly tag: string; readonly message: string }> {
    const { cfg } = this
    const ps = cfg.collective.parameterServer
    this.#servers = undefined
    if (!ps) return { groupArgs: this.#groupArgs }
    // A server's loss fails the generation running then: this one, or a regroup of it; one lost
    // while a regroup forms fails the regrouped generation as it forms (formed()).
    const mine = () => (this.#servers?.spawnedFor === g.number ? this.#servers.generation : undefined)
    const down = new Map<number, string>()
    // With replicas (two servers or more, recovering from peers) each shard has one on the next server: the regroup makes a lost server again from it.
    const onDown = (index: number, detail: string): void => {
      down.set(index, detail)
      const running = mine()
      if (running && !running.settled) this.#serverLost(running, index, detail)
    }
    // (Until the group restarts from the checkpoint with new servers, or the run ends.)
    const stillMatters = (): boolean => this.#servers?.spawnedFor === g.number && !isEndState(this.controller.state)
    try {
      const servers = await this.#group.spawnServers(g.number, ps.numServers, ps.replicas === true, plan.servers.map((s) => s.nodeId), onDown, stillMatters)
      const groupArgs: GroupArgs = {
        ...this.#groupArgs,
        servers,
        parameterServer: {
          mode: ps.mode,
          staleness: ps.staleness,
          backupWorkers: cfg.collective.backupWorkers ?? 0,
          timeoutMs: cfg.collective.timeoutMs,
          ...(cfg.collective.strategy === "auto" ? { auto: true } : {})
        }
      }
      this.#servers = { spawnedFor: g.number, groupArgs, generation: g, onDown, stillMatters, down }
      return { groupArgs }
    } catch (e) {
      const err = e as { message?: string; _tag?: string }
      return { tag: err._tag ?? "SpawnError", message: `a parameter server could not start: ${err.message ?? String(e)}` }
    }
  }

  /** A parameter server's loss fails generation `g` (with replicas: naming the server, which the regroup makes again). */
  #serverLost(g: Generation<CheckpointPayload>, index: number, detail: string): void {
    const replicas = this.cfg.collective.parameterServer?.replicas === true
    this.controller.fail(g, { kind: "died", rank: -1, tag: SERVER_DOWN, message: detail, ...(replicas ? { server: index } : {}) })
  }

  /**
   * A lost parameter server's replacement (a regroup after its loss): started on the lost one's
   * node (or a worker's), initialised by its successor from the replica kept there, and sent its
   * predecessor's shard to keep a replica of; the workers' args name it from then on.
   */
  async #replaceServer(k: number, numWorkers: number, group: number): Promise<string[]> {
    const held = this.#servers
    const names = [...(held?.groupArgs.servers ?? [])]
    if (!held || names.length < 2 || k >= names.length) throw new Error(`no replica of parameter server ${k} is kept (${names.length} server(s))`)
    const count = names.length
    const successor = names[(k + 1) % count]!
    const predecessor = names[(k + count - 1) % count]!
    const fallback = [...this.#group.members.values()][0]?.node
    if (fallback === undefined) throw new Error("no worker is left to place it by")
    const name = await this.#group.replaceServer(held.spawnedFor, k, count, successor, fallback, this.#nodeAlive, held.onDown, held.stillMatters)
    const server = (n: string) => this.#system.ref(ServerProtocol, n)
    await this.#system.askPromise(server(successor), "handOver", { index: k, to: name, numWorkers, group, successor }, { timeoutMs: SERVER_HANDOVER_TIMEOUT_MS })
    await this.#system.askPromise(server(predecessor), "replicateTo", { to: name }, { timeoutMs: SERVER_HANDOVER_TIMEOUT_MS })
    names[k] = name
    held.groupArgs = { ...held.groupArgs, servers: names }
    held.down.delete(k)
    return names
  }

  /**
   * Watch: the generation's outcome, growing when capacity comes back (elastic). A rank's death
   * waits for its node's next heartbeat or its death before it is counted: the controller then
   * decides whether it was the node's loss (ranksToCheck, deathOrNodeLoss).
   */
  async watch(generation: Generation<CheckpointPayload>): Promise<Outcome> {
    const stopWatching = this.#refill.watch(generation)
    const outcome: Outcome = await this.race(this.#nodeLossOrNot(await this.race(generation.outcome)))
    stopWatching()
    return outcome
  }

  async #nodeLossOrNot(o: Outcome): Promise<Outcome> {
    const { view } = this.cluster
    // Each node to watch, with the first of its ranks to check.
    const nodes = new Map<string, number>()
    for (const rank of ranksToCheck(o, this.#group.members.size)) {
      const node = this.#group.members.get(rank)?.node
      if (node !== undefined && view.get(node) !== undefined && !nodes.has(node)) nodes.set(node, rank)
    }
    if (nodes.size === 0) return o
    await nodeNews(view, [...nodes.keys()], this.#agentHeard)
    for (const [node, rank] of nodes) {
      const lost = deathOrNodeLoss(o, node, view.get(node)?.state, rank)
      if (lost !== o) return lost
    }
    return o
  }

  /** Finish: the group stops (training finished, or the run failed as the controller decided). */
  async finish(next: Exclude<Next, Restart>, attempt: number): Promise<void> {
    await this.#stopGroup(next.action === "finish" ? "training finished" : "the run failed")
    if (next.action === "finish") return
    this.recorder.event({ type: "failure", attempt, failure: next.failure, decision: { action: "fail", reason: next.reason } })
    this.#error = new TrainingFailed(next.failure, attempt + 1, next.reason)
  }

  /**
   * The controller decided to restart: recorded (the failure and the onRestart callbacks, or the
   * resize asked for), and its choice between the surviving peers and the checkpoint (recoveryFor).
   */
  async restarting(next: Restart, attempt: number): Promise<Recovery> {
    // Result.restarts counts restarts after failures; a resize is in Result.resizes.
    if (next.cause.type === "failure") this.record.restarts++
    this.bounds = next.size
    this.record.lastCause = restartReason(next.cause)
    const recovery = recoveryFor(next.cause, this.cfg.recoverFrom, this.#bus.outage !== undefined, this.cfg.recoverFromWhy)
    this.#fallback = recovery.from === "checkpoint" ? recovery.reason : undefined
    if (next.cause.type === "failure") {
      const failure = next.cause.failure
      this.recorder.event({ type: "failure", attempt, failure, decision: { action: "restart", counted: next.counted } })
      await this.record.callbacks("onRestart", (cb) => cb.onRestart?.({ attempt: attempt + 1, failure }))
    } else {
      this.recorder.event({ type: "resize-requested", attempt, size: next.cause.size, reason: next.cause.reason, from: this.#store.latest()?.name ?? "the start" })
    }
    return recovery
  }

  #what(failure: GroupFailure): string {
    return `${failure.rank >= 0 ? `rank ${failure.rank} failed` : "the group failed"} (${failure.tag}: ${firstLine(failure.message)})`
  }

  #budget(counted: boolean): string {
    const { maxFailures } = this.cfg
    return counted
      ? ` (restart ${this.controller.countedFailures}${maxFailures >= 0 ? ` of ${maxFailures}` : ""})`
      : " (not counted toward maxFailures: an infrastructure failure)"
  }

  /**
   * Regroup: the survivors of a failure (once the bus is back) with replacements, or the running
   * workers with new ones (growth in place). The new, running generation, or undefined when it
   * cannot be done (then restart() goes to the checkpoint, saying why).
   */
  async regroup(next: Restart): Promise<Generation<CheckpointPayload> | undefined> {
    if (next.cause.type === "failure") {
      await this.waitForBus()
      const failure = next.cause.failure
      return this.#regroup({ failure, target: this.bounds.max, what: this.#what(failure), budget: this.#budget(next.counted), counted: next.counted })
    }
    // Growing in place: the running workers stay, the new ones replay from the checkpoint just
    // saved and join them.
    return this.#regroup({ target: this.bounds.max, what: next.cause.reason, budget: "", counted: false })
  }

  #regroup(why: Pick<RegroupContext, "failure" | "target" | "what" | "budget" | "counted">): Promise<Generation<CheckpointPayload> | undefined> {
    // The regroup sets the checkpoint its joiners resume from: it stays until the next restart,
    // whatever is saved meanwhile.
    return this.race(
      regroupSurvivors({
        ...why,
        cfg: this.cfg,
        cluster: this.cluster,
        system: this.#system,
        group: this.#group,
        controller: this.controller,
        request: this.request,
        saving: () => this.#saving,
        incident: this.record.incident,
        progress: this.progress,
        groupArgs: this.#liveArgs,
        peerStates: this.#peerStates,
        onSize: (attempt, size) => this.record.noteSize(attempt, size),
        latest: () => this.#store.latest()?.path ?? this.#resumePath,
        setResume: (p) => (this.#resumePath = p),
        fellBack: (reason) => (this.#fallback = reason),
        standbyReady: this.#refill.ready,
        takeStandby: (n) => this.#refill.take(n),
        formed: (g, joinsAtReport) => {
          const servers = this.#servers
          if (servers) {
            servers.generation = g
            // A server lost while the regroup formed (after it made the lost ones again): this generation fails at once.
            const [lost] = servers.down
            if (lost) this.#serverLost(g, lost[0], lost[1])
          }
          this.#refill.formed(g, joinsAtReport)
        },
        // (Without replicas a lost server fails the generation, which restarts from the checkpoint.)
        serversDown: () => (this.cfg.collective.parameterServer?.replicas === true ? [...(this.#servers?.down.keys() ?? [])] : []),
        serverDown: (k, ms) => this.#group.serverDown(k, ms),
        replaceServer: (k, numWorkers, group) => this.#replaceServer(k, numWorkers, group)
      })
    )
  }

  /** Restart: the group stops, and the next one starts from the latest checkpoint. */
  async restart(next: Restart, attempt: number): Promise<void> {
    if (next.cause.type === "failure") {
      const failure = next.cause.failure
      await this.#stopGroup("restarting the group")
      const from = this.#store.latest() ? this.#store.latest()!.name : "the start"
      const fallback = this.#fallback
      this.record.incident(
        "restart",
        `${this.#what(failure)}; restarting the group from ${from}${fallback !== undefined ? ` (not from the surviving peers: ${fallback})` : ""}${this.#budget(next.counted)}`,
        {
          type: "restart",
          attempt: attempt + 1,
          kind: failure.kind,
          counted: next.counted,
          from,
          recovery: "checkpoint",
          ...(fallback !== undefined ? { reason: fallback } : {})
        }
      )
    } else {
      this.recorder.event({ type: "resize-from-checkpoint", attempt, reason: this.#fallback ?? "unknown" })
      await this.#stopGroup("resizing the group")
    }
    this.#resumePath = this.#store.latest()?.path ?? this.#resumePath
  }

  /** The run stopped on an error: the run's abort (the bus, a signal) when there was one. */
  failed(e: Error): void {
    this.#error = this.abortError ?? e
  }

  /** Ends the run: the last checkpoint lands, the group, the actors, the cluster and the recorder close. */
  async close(): Promise<void> {
    if (this.#error) this.controller.abort(this.#error instanceof Interrupted ? "interrupted" : "errored")
    else if (this.controller.state === "finished") this.record.finishedShortHanded()
    await this.#saving
    await this.#teardown()
    process.removeListener("SIGINT", this.#onSignal)
    process.removeListener("SIGTERM", this.#onSignal)
  }

  /** The run directory's final files, the summary line, and the Result (or the error carrying it). */
  async result(): Promise<Result> {
    const error = this.#error
    const state = this.abortError instanceof Interrupted ? "interrupted" : error ? "failed" : "finished"
    const result = await this.record.result(this.#store, state, error, this.controller.countedFailures)
    if (error) throw withResult(error, result)
    return result
  }
}
