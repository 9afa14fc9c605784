// One worker's run (worker.ts starts it on `run`): everything the run shares (the collective
// connections, the direct links, the timeline, the measured deadlines, the group session, the
// step counters) in one object, with its steps in the order every rank takes them: watch the
// bus, connect (the loop module's check, the engine, the collective connections, the direct
// links), start the session (the first group: communicator, probe, reducer), explain the kernels,
// make the TrainContext, run the user's loop and tell the controller how it ended, then close.
// The order matters: every rank of a generation opens its connections, builds its group and runs
// the probe's collectives at the same points.
import type { NatsConnection } from "@nats-io/nats-core"
import { openConnection, SPAWNED_CONNECT_TIMEOUT_MS, type ConnectionSpec, type OpenedConnection } from "../../../core/connection-spec.ts"
import { fileURLToPath, pathToFileURL } from "node:url"
import * as path from "node:path"
import { connectionLocalAddress } from "../../../core/nats-internals/index.ts"
import { engineChoice, loadEngine, type BackendKind, type Tf } from "../../../core/engine.ts"
import { fallbackKernelsUsed, onFallbackKernel } from "../../../core/kernels/fallback.ts"
import { describeKernels } from "../../../core/kernels/register.ts"
import { isGpuBackend } from "../../../scheduler/gpu-backend.ts"
import { warmUpTraining } from "./warm-up.ts"
import { tierUpSooner } from "../../../core/tier-up.ts"
import { keepInBackground, raisedFromOutside } from "../../../core/priority.ts"
import { ConfigError } from "../../../core/errors.ts"
import { ModuleNotAllowed } from "../../node/errors.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import { Communicator, describeTransport, type DirectOptions } from "../../../collectives/communicator.ts"
import type { GradientReducer, GradientReducerOptions } from "../../../collectives/gradient-reducer.ts"
import { blamedRanks, isCallMismatch } from "../../../collectives/errors.ts"
import { MeasuredDeadlines, limitText, seconds } from "../../../collectives/deadlines.ts"
import { parseCompressionConfig } from "../../../collectives/compression/index.ts"
import { findAllReduceAlgorithm } from "../../../collectives/algorithms/index.ts"
import { watchBus, type BusMonitor } from "../../../core/bus-monitor.ts"
import { CONTROLLER_UNAVAILABLE_MS, NATS_OUTAGE_TIMEOUT_MS } from "../../../core/defaults.ts"
import * as settings from "../../../core/settings.ts"
import type { ActorContext } from "../../runtime/actor.ts"
import type { ActorRef, ActorSystem } from "../../runtime/system.ts"
import { toWireFailure } from "../../runtime/envelope.ts"
import { loopFailure } from "./loop-errors.ts"
import { setIdlePlace } from "../../runtime/heartbeat.ts"
import { RemoteFailure } from "../../runtime/errors.ts"
import { ControllerProtocol, loopMetadata, measurementsHandedOn, runFactsOf, type Admission, type LinkMeasurements, type Placement, type WarmUp, type WorkerArgs } from "../common/train-protocol.ts"
import type { ObservedTopology } from "../../../scheduler/topology.ts"
import { TrainContext, type Checkpoint, type TrainContextDeps } from "./train-context.ts"
import { GroupSession, type LiveGroup } from "./group-session.ts"
import type { StepObserver } from "./data-parallel.ts"
import { spanEvent, tidOfBucket, TID_STEP, TID_WAITS, type TraceEvent } from "../common/observe/timeline.ts"
import { AutoGradientReducer, PATH_TUNE_MAX_BYTES, picksFor, prepareAutoCollectives, rememberShape, tunesPaths } from "./auto-config.ts"
import type { PsClient } from "./ps-client.ts"

/** Unsubscribes the current run's notes about kernels on the cpu fallback (one run at a time per process). */
let stopFallbackNotes: (() => void) | undefined

const PROGRESS_EVERY_MS = 250
/** An epoch's first step is sent when the rank's previous progress is at least this old (a pause before the epoch). */
const EPOCH_START_AFTER_MS = 50

const residualFile = (rank: number) => `gradwire/rank-${rank}/reducer-state.msgpack`
/** A rank's error-feedback residuals of its compressed pushes to the parameter servers, per server range. */
const pushResidualFile = (rank: number) => `gradwire/rank-${rank}/ps-residuals.msgpack`

const moduleUrl = (spec: string): string => {
  if (spec.startsWith("file:") || spec.startsWith("data:")) return spec
  if (path.isAbsolute(spec)) return pathToFileURL(spec).href
  return spec
}

const toBytes = (files: Readonly<Record<string, Uint8Array | string>>): Record<string, Uint8Array> => {
  const out: Record<string, Uint8Array> = {}
  for (const [k, v] of Object.entries(files)) {
    if (typeof v === "string") out[k] = new TextEncoder().encode(v)
    else if (v instanceof Uint8Array) out[k] = v
    else throw new ConfigError({ field: `checkpoint.files["${k}"]`, reason: "a checkpoint file must be a Uint8Array or a string" })
  }
  return out
}

type BucketInfo = Parameters<NonNullable<GradientReducerOptions["onBucket"]>>[0]
type StepInfo = Parameters<NonNullable<TrainContextDeps["onStep"]>>[0]

/** The loop's module; where Node's type stripping cannot run it, a SyntaxError that says what to do. */
const importLoop = (module: string, node: string): Promise<Record<string, unknown>> =>
  (import(moduleUrl(module)) as Promise<Record<string, unknown>>).catch((e: unknown) => {
    if ((e as { code?: unknown })?.code === "ERR_MODULE_NOT_FOUND") {
      // Not a failure a restart mends: the file (or a package it imports) is not on this node.
      const missing = /Cannot find (?:module|package) '([^']+)'/.exec((e as Error).message)?.[1]
      const loopPath = module.startsWith("file:") ? fileURLToPath(module) : module
      throw new ConfigError({
        field: "trainLoopPerWorker",
        reason:
          missing === loopPath || missing === module
            ? `${loopPath} does not exist on node ${node}: every node that runs workers needs the loop module at this path (a shared filesystem, or the same checkout on each)`
            : `${loopPath} cannot be imported on node ${node}: ${(e as Error).message.split("\n")[0]} (install the package, or put the file, on every node that runs workers)`
      })
    }
    if ((e as { code?: unknown })?.code === "ERR_UNSUPPORTED_TYPESCRIPT_SYNTAX") {
      const err = new SyntaxError(
        `${(e as Error).message} (in ${module} or a module it imports): Node runs TypeScript by stripping its types, which leaves out ` +
          "enums, namespaces and constructor parameter properties: write those as plain objects and fields, compile the loop to JavaScript, " +
          "or start the driver (or the node's agent) with node --experimental-transform-types, which its workers then run with too"
      )
      err.stack = (e as Error).stack ?? err.stack
      throw err
    }
    throw e
  })

export class WorkerRun {
  /** This rank's group across regroups, once the first group is built (pause, snapshot and resume answer from it). */
  session: GroupSession | undefined
  /** What this rank's last group measured of its links (a regroup of the same nodes reuses it). */
  measured: LinkMeasurements | undefined
  readonly #ctx: ActorContext
  /** The spawn args; a standby worker's placement and join are its admission's (admit). */
  #args: WorkerArgs
  /** The engine loaded, the connections open, the loop module imported (prepare). */
  #prepared: Promise<WarmUp | undefined> | undefined
  /** The parameter-server strategy's client (the servers this rank pushes to), if any. */
  readonly #ps: PsClient | undefined
  readonly #system: ActorSystem
  // Set at the start of run(), in the order the run had them.
  #controller!: ActorRef<ControllerProtocol["kinds"]>
  #bus!: BusMonitor
  #nc: NatsConnection | undefined
  #cnc: NatsConnection | undefined
  #dnc: NatsConnection | undefined
  #dataConn: Promise<NatsConnection> | undefined
  // Set by connect(): the engine, the connection spec, the two collective connections, the links.
  #tf!: Tf
  #backend!: BackendKind
  #spec!: ConnectionSpec
  #ownUrl: string | undefined
  #dataNc!: NatsConnection
  #controlNc!: NatsConnection
  #transport!: NonNullable<WorkerArgs["collective"]["transport"]>
  #direct: DirectOptions | undefined
  #compression!: ReturnType<typeof parseCompressionConfig>
  // Timeline events (only with runConfig.timeline), shipped to the controller in batches.
  #trace: TraceEvent[] = []
  #timeline!: WorkerArgs["timeline"]
  #currentStep = 0
  #deadlines!: MeasuredDeadlines
  #deadlinesExplained = false
  #context!: TrainContext
  // What the progress messages carry (onStep) and the observer measures.
  #lastProgress = 0
  #processed = 0
  readonly #meanLoss = { epoch: -1, step: -1, sum: 0, samples: 0 }
  #computeMs = 0
  #commMs = 0
  #applyMs = 0
  // Every step's [step, forward/backward ms, all-reduce ms, apply ms, ms since the previous
  // step ended] since the last progress message: the report's and the dashboard's compute /
  // communication / waiting split, whether or not the timeline is on.
  #stepTimes: number[][] = []
  #lastStepEnd: number | undefined

  constructor(ctx: ActorContext, args: WorkerArgs, ps: PsClient | undefined) {
    this.#ctx = ctx
    this.#args = args
    this.#ps = ps
    this.#system = ctx.system
  }

  /**
   * What a worker does before it has a group: the engine, the collective connections, the loop
   * module imported. A standby worker does it while the group runs short-handed, so that when it
   * is let in (admit, then run) only the group and the loop's replay are left. Done once.
   */
  prepare(): Promise<WarmUp | undefined> {
    return (this.#prepared ??= (async () => {
      await this.#connect()
      await importLoop(this.#args.loopModule, this.#system.node)
      // A process joining a running group (a standby, a replacement) holds its warm peers to its
      // pace until its step's functions are optimized: from here on, before they are first called
      // (its warm-up included), V8 optimizes a function after GRADWIRE_TURBOFAN_AFTER calls, not
      // its own 3000 (core/tier-up.ts). A group that starts together keeps V8's count: there the
      // sooner compiles cost what they save (a short job's workers more).
      if (this.#args.group === "standby" || this.#args.join !== undefined) tierUpSooner()
      return this.#args.group === "standby" ? await this.#warmUp() : undefined
    })())
  }

  /**
   * A standby's warm-up on a host backend (warm-up.ts): the group it joins waits for its slowest
   * member, and a fresh process's first seconds of training steps are its slowest.
   */
  async #warmUp(): Promise<WarmUp | undefined> {
    const maxMs = settings.standbyWarmUpMs.read()
    if (maxMs <= 0 || (this.#backend !== "wasm" && this.#backend !== "cpu")) return undefined
    // Lowered throughout (its host's limit may have given the priority back while it prepared): on
    // cores the short group shares, it takes what the survivors leave idle. Starved, it takes
    // longer to make its steps (the short group runs meanwhile), up to its time; admitted
    // (worker.ts run), it takes its own priority back.
    const nice = settings.startNice.read()
    if (nice > 0) keepInBackground(nice, maxMs + 1_000)
    try {
      const r = await warmUpTraining(this.#tf, { maxMs, maxSteps: settings.standbyWarmUpSteps.read() })
      const raised = raisedFromOutside()
      this.#ctx.log.info(`standby warm-up: ${r.steps} training steps of a small model in ${Math.round(r.ms)} ms${raised ? " (raised from its lowered start by its agent: other work starved it)" : ""}`)
      return raised ? { ...r, raised } : r
    } catch (e) {
      // Only a head start: a standby that could not warm up joins cold, as it did before.
      this.#ctx.log.warn(`standby warm-up failed, joining without it: ${String(e).split("\n")[0]}`)
      return undefined
    }
  }

  /** A standby worker's place in the generation it is let into, and where it joins the survivors. */
  admit(a: Admission): void {
    const { join: _join, belowSize: _below, ...args } = this.#args
    this.#args = { ...args, ...a.placement, ...(a.join ? { join: a.join } : {}) }
  }

  /** The whole run: it tells the controller how the loop ended, and the actor stops after it. */
  async run(): Promise<void> {
    this.#controller = this.#system.ref(ControllerProtocol, this.#args.controller)
    this.#bus = this.#watchBus()
    try {
      await this.prepare()
      await this.#startSession()
      this.#watchKernels()
      this.#context = new TrainContext(this.#contextDeps())
      await this.#runLoop()
    } catch (e) {
      await this.#failed(e)
    } finally {
      await this.#close()
    }
  }

  /** The current placement: the session's, or the one this worker was spawned with. */
  readonly place = (): Placement =>
    this.session?.placement ?? {
      attempt: this.#args.attempt,
      rank: this.#args.rank,
      worldSize: this.#args.worldSize,
      localRank: this.#args.localRank,
      localWorldSize: this.#args.localWorldSize,
      nodeRank: this.#args.nodeRank,
      nodes: this.#args.nodes,
      group: this.#args.group,
      ...(this.#args.measured ? { measured: this.#args.measured } : {}),
      ...(this.#args.survivorRanks ? { survivorRanks: this.#args.survivorRanks } : {}),
      ...(this.#args.belowSize ? { belowSize: true } : {})
    }

  #watchBus(): BusMonitor {
    const ctx = this.#ctx
    // No wait without a deadline: a worker whose NATS stays away longer than
    // failureConfig.natsOutageTimeoutMs exits (the controller restarts the group once it can).
    const outageMs = this.#args.natsOutageTimeoutMs ?? NATS_OUTAGE_TIMEOUT_MS
    return watchBus(this.#system.nc, {
      timeoutMs: outageMs,
      onDown: (o) => ctx.log.warn(`rank ${this.place().rank}: lost the NATS connection (${o.server}); exiting if it is not back within ${outageMs / 1000} s`),
      onUp: (o) => ctx.log.info(`rank ${this.place().rank}: the NATS connection is back after ${(o.ms / 1000).toFixed(1)} s`),
      onExpired: (o) => {
        ctx.log.error(`rank ${this.place().rank}: no NATS for ${(o.ms / 1000).toFixed(1)} s (failureConfig.natsOutageTimeoutMs ${outageMs}); exiting`)
        process.exit(75)
      }
    })
  }

  /** The loop module's check, the engine, the two collective connections, the direct links, the deadlines. */
  async #connect(): Promise<void> {
    const system = this.#system
    const args = this.#args
    // Only a loop the agent checked (module-policy.ts) may be imported: the spawn request
    // declared it, and the args could name another. Checked first, before anything is loaded.
    const allowed = system.allowedImports
    if (allowed !== undefined && !allowed.includes(args.loopModule)) {
      throw new ModuleNotAllowed({ node: system.node, module: args.loopModule, reason: "the spawn request did not declare it, so the agent did not check it" })
    }
    const { tf, backend } = await loadEngine(args.backend as BackendKind | "auto")
    this.#tf = tf
    this.#backend = backend
    await this.#openCollectives()
    // The direct links (collectives/direct.ts): listen where this worker reaches the bus from
    // (the local address of its collective connection), unless GRADWIRE_DIRECT_HOST says
    // otherwise; TLS-PSK when the bus runs TLS.
    const transport = (this.#transport = args.collective.transport ?? "auto")
    this.#direct =
      transport === "nats" || args.collective.directSecret === undefined
        ? undefined
        : {
            transport,
            secret: Buffer.from(args.collective.directSecret, "hex"),
            host: settings.directHost.read() ?? connectionLocalAddress(this.#dataNc),
            tls: this.#spec.tls !== undefined
          }
    this.#compression = parseCompressionConfig(args.collective.compression, "collectiveConfig.compression")
    this.#timeline = args.timeline
    // Collective deadlines from this rank's measured steps (collectives/deadlines.ts): the
    // measurements outlive a regroup, each new group warms up again; an explicit
    // collectiveConfig.timeoutMs is used as given.
    this.#deadlines = new MeasuredDeadlines(args.collective.timeoutFixed ? { fixedMs: args.collective.timeoutMs } : { capMs: args.collective.timeoutMs })
  }

  /** A connection of this rank's own, on the agent's connection spec, preferring the agent's server. */
  #open(role: string): Promise<OpenedConnection> {
    return openConnection(this.#spec, `gradwire ${this.#system.job} rank ${this.#args.rank} ${role}`, {
      noEcho: true,
      timeoutMs: SPAWNED_CONNECT_TIMEOUT_MS,
      ...(this.#ownUrl ? { preferServers: [this.#ownUrl] } : {})
    })
  }

  async #openCollectives(): Promise<void> {
    const system = this.#system
    // The connection this process's agent gave it (servers and credentials, on stdin), with the
    // server the agent connected it to first: on a multi-machine cluster that is the node's own
    // nats-server, so collective traffic enters the cluster next to the worker (and
    // hierarchical/topology-aware choices see the real servers) instead of every rank dialling
    // the driver's address. The agent's other servers stay as fallbacks.
    const spec = system.connection
    if (spec === undefined) {
      throw new ConfigError({ field: "worker", reason: "a worker runs in a process its node agent spawned (it opens that process's connection spec); spawn it with spawnActor" })
    }
    this.#spec = spec
    const own = system.nc.getServer()
    this.#ownUrl = own && !/^[a-z]+:\/\//.test(own) ? `${spec.tls !== undefined ? "tls" : "nats"}://${own}` : own
    // Two connections: bulk data, and credits/acks, which must not queue behind this rank's own
    // outgoing megabytes (on one connection large all-reduces run at about half the speed).
    const opened = await Promise.allSettled([this.#open("collectives"), this.#open("collective control")])
    const failed = opened.find((o) => o.status === "rejected")
    if (failed) {
      for (const o of opened) if (o.status === "fulfilled") await o.value.nc.close().catch(() => {})
      throw failed.reason
    }
    ;[this.#nc, this.#cnc] = opened.map((o) => (o as PromiseFulfilledResult<OpenedConnection>).value.nc)
    this.#dataNc = this.#nc!
    this.#controlNc = this.#cnc!
  }

  /**
   * The group of a placement: its communicator, and the reducer that picks the algorithm per
   * bucket from the probed links ('auto', auto-config.ts). Every member of a generation builds
   * it at the same point (start-up, or a regroup), so the probe's collectives line up.
   * `signal`: the group is no longer wanted once aborted (a pause for another regroup while it
   * forms): its handshake gives up, or once formed its communicator is closed, failing the link
   * measurements and probe under way.
   */
  readonly #build = async (p: Placement, signal?: AbortSignal): Promise<{ comm: Communicator; reducer: GradientReducer }> => {
    const system = this.#system
    const args = this.#args
    // A regroup of nodes an earlier group measured hands every member those measurements: no rank
    // measures the direct links or probes the topology again (all of them skip, or none).
    const reused = p.measured
    // The parameter servers take this group's pushes from here on (the driver regrouped them first).
    if (this.#ps) {
      this.#ps.group = p.attempt
      // A regroup names the servers as they are now (a lost one replaced from its replica among them).
      if (p.servers) this.#ps.useServers(p.servers)
    }
    const direct = this.#direct && reused?.minBytes !== undefined ? { ...this.#direct, minBytes: reused.minBytes } : this.#direct
    this.#deadlines.newGroup()
    const comm = await Communicator.create({
      nc: this.#dataNc,
      controlNc: this.#controlNc,
      cluster: system.cluster,
      job: system.job,
      group: p.group,
      rank: p.rank,
      worldSize: p.worldSize,
      node: p.nodes[p.rank],
      timeoutMs: args.collective.timeoutMs,
      deadlines: this.#deadlines,
      // A peer the driver hears beating from its thread, its event loop held or its process busy, is waited for.
      peerLiveness: (ranks) => system.askPromise(this.#controller, "liveness", { attempt: p.attempt, ranks: [...ranks] }, { timeoutMs: 2_000 }),
      onWaitOn: (w) =>
        this.#ctx.log.warn(
          `rank ${p.rank}: ${w.op} waits past its deadline (${seconds(w.waitedMs)} so far) for rank(s) ${w.ranks.join(", ")}, alive and ` +
            `${w.doing === "held" ? "in one long synchronous computation" : "working outside the collectives"}; taken for hung after ` +
            limitText(w.hungAfterMs)
        ),
      ...(direct ? { direct } : {}),
      ...(signal ? { signal } : {})
    })
    const abandon = (): void => void comm.close().catch(() => {})
    signal?.addEventListener("abort", abandon, { once: true })
    try {
      if (signal?.aborted) abandon()
      // "auto": which sizes the direct links carry faster, measured by the group (collectives); with
      // an algorithm or compression picked by the cost model, the same timings fit the model's
      // direct links, so the calls that go direct are priced on them.
      const autoPick = args.collective.algorithm === "auto" || this.#compression === "auto"
      const measure = direct !== undefined && reused?.minBytes === undefined && (this.#transport === "auto" || (this.#transport === "direct" && autoPick))
      const measured = measure ? await comm.measureTransport() : undefined
      const directMinBytes = comm.transport.choice === "direct" ? 0 : comm.transport.minBytes
      // What algorithm 'auto' measured per group shape travels on (this rank's own history, or the
      // one a regroup handed every member); a shape measured before is taken as it was, the same
      // nodes in another rank order as a first measurement (picksFor).
      const history = reused?.tuned ?? this.measured?.tuned
      const known = picksFor(reused?.tuned, p.nodes)
      // What the next regroup is handed (with the nodes the reused measurements cover).
      this.measured = measurementsHandedOn(reused, p.nodes, direct ? comm.transport.minBytes : undefined, history)
      const transportText = describeTransport(comm.transport, measured, tunesPaths(comm) ? { pathsTunedBelow: PATH_TUNE_MAX_BYTES } : {})
      // Per-worker transport detail: explain.txt has it; the console only with verbose (GRADWIRE_LOG=debug).
      if (p.rank === 0 && direct) this.#ctx.log.debug(transportText)
      const reducer = new AutoGradientReducer(comm, {
        ...(await prepareAutoCollectives({
          nc: this.#dataNc, comm, cluster: system.cluster, job: system.job, algorithm: args.collective.algorithm, compression: this.#compression, log: this.#ctx.log,
          ...(reused?.observed !== undefined ? { observed: reused.observed as ObservedTopology } : {}),
          ...(measured !== undefined && measured.direct.length > 0 && Number.isFinite(directMinBytes)
            ? { direct: { algorithm: findAllReduceAlgorithm(measured.algorithm)!, timings: measured.direct, minBytes: directMinBytes, ...(measured.pairs ? { pairs: measured.pairs } : {}) } }
            : {}),
          onObserved: (observed) => (this.measured = { ...this.measured!, observed }),
          ...(p.rank === 0
            ? {
                onExplain: (e, summary) =>
                  void system
                    .tellPromise(this.#controller, "explain", { attempt: p.attempt, text: `${e.text}\n${transportText}`, json: { ...e.json, transport: { ...comm.transport, measured } }, summary })
                    .catch(() => {})
              }
            : {})
        })),
        ...(known ? { known } : {}),
        onTuned: (k) => (this.measured = { ...this.measured!, tuned: rememberShape(this.measured?.tuned, { nodes: p.nodes, ...k }) }),
        wire: args.collective.wireDtype === "float16" ? "f16" : "f32",
        bucketBytes: args.collective.bucketSizeMiB * 1024 * 1024,
        firstBucketBytes: args.collective.firstBucketSizeMiB * 1024 * 1024,
        ...(this.#timeline ? { onBucket: (b: BucketInfo) => this.#traceBucket(b) } : {})
      })
      return { comm, reducer }
    } catch (e) {
      await comm.close().catch(() => {})
      throw e
    } finally {
      signal?.removeEventListener("abort", abandon)
    }
  }

  /** A bucket's row: the whole bucket, then its compression (encodeMs, measured from the bucket's start) and the exchange that follows it, nested inside. */
  #traceBucket(b: BucketInfo): void {
    const trace = this.#trace
    const currentStep = this.#currentStep
    const tid = tidOfBucket(b.bucket)
    const info = { step: currentStep, bytes: b.bytes, algorithm: b.algorithm, encodeMs: b.encodeMs }
    trace.push(spanEvent(`bucket ${b.bucket}`, b.startMs, b.endMs, tid, info, "allreduce"))
    const split = Math.min(b.endMs, b.startMs + b.encodeMs)
    if (b.encodeMs > 0) trace.push(spanEvent("compress", b.startMs, split, tid, { step: currentStep }, "allreduce"))
    trace.push(spanEvent(`all-reduce (${b.algorithm})`, split, b.endMs, tid, { step: currentStep, bytes: b.bytes }, "allreduce"))
  }

  /** The first group (every rank builds it here) and the session that carries this rank across regroups. */
  async #startSession(): Promise<void> {
    const system = this.#system
    const ctx = this.#ctx
    const first = this.place()
    const initial = await this.#build(first)
    const live = new GroupSession(
      { placement: first, ...initial },
      {
        build: this.#build,
        close: (g: LiveGroup) => g.comm.close(),
        parked: (cause) => {
          const f = toWireFailure(cause)
          ctx.log.warn(`rank ${this.place().rank}: the group broke (${f.tag}: ${f.message.split("\n")[0]}); waiting to be regrouped`)
          void this.#tellFailed(cause, f, true)
        },
        fetchState: (attempt, files) => system.askPromise(this.#controller, "peerState", { attempt, ...(files ? { files: [...files] } : {}) }, { timeoutMs: 120_000, unavailableForMs: CONTROLLER_UNAVAILABLE_MS }),
        interrupt: () => this.#ps?.interrupt(),
        log: (line) => ctx.log.info(line)
      },
      this.#args.join
    )
    this.session = live
    // An idle rank asked for its stack (a peer's collective timed out waiting for it, gradwire stack) says where its loop is.
    setIdlePlace(() => this.session?.where({ idle: true }))
  }

  /** The session, once started (everything after startSession runs with one). */
  get #live(): GroupSession {
    return this.session!
  }

  #flushTrace(): void {
    if (this.#trace.length === 0) return
    const p = this.place()
    void this.#system.tellPromise(this.#controller, "trace", { attempt: p.attempt, rank: p.rank, events: this.#trace.splice(0) }).catch(() => {})
  }

  /** The data-parallel model's phases and waits: the step times, the deadlines' measurements, the timeline. */
  #observer(): StepObserver {
    return {
      phase: (name, start, end, step) => {
        this.#currentStep = step
        if (name === "forward_backward") (this.#live.group.reducer as AutoGradientReducer).noteCompute((this.#computeMs = end - start))
        else if (name === "allreduce") this.#commMs = end - start
        else if (name === "apply") this.#applyMs = end - start
        else if (name === "step") {
          this.#stepTimes.push([step, this.#computeMs, this.#commMs, this.#applyMs, this.#lastStepEnd === undefined ? 0 : Math.max(0, start - this.#lastStepEnd)])
          this.#lastStepEnd = end
          this.#deadlines.noteStep(end - start)
          this.#explainDeadlines()
        }
        if (this.#timeline) this.#trace.push(spanEvent(name, start, end, TID_STEP, { step }))
      },
      wait: (name, start, end) => {
        if (this.#timeline) this.#trace.push(spanEvent(name, start, end, TID_WAITS, undefined, "wait"))
      }
    }
  }

  /** Once derived (after the warm-up steps), rank 0 says the deadline: explain.txt and the console; every rank logs its own. */
  #explainDeadlines(): void {
    const deadlines = this.#deadlines
    if (!this.#deadlinesExplained && (deadlines.fixedMs !== undefined || deadlines.medianStepMs !== undefined)) {
      this.#deadlinesExplained = true
      const p = this.place()
      const d = deadlines.describe()
      this.#ctx.log.debug(`rank ${p.rank}: ${d.summary.replace(/^gradwire: /, "")}`)
      if (p.rank === 0) void this.#system.tellPromise(this.#controller, "explain", { attempt: p.attempt, text: d.text, json: d.json, summary: d.summary, part: "deadlines" }).catch(() => {})
    }
  }

  /** This rank's backend and kernels in explain.txt. */
  #explainKernels(summary: string): void {
    const p = this.place()
    // (the GPUs its placement gave it, which it may share with other workers: resourcesPerWorker.GPU < 1)
    const gpus = isGpuBackend(this.#backend) ? (this.#args.gpus ?? "") : ""
    const { text, json } = describeKernels(this.#backend, p.rank, fallbackKernelsUsed(), engineChoice(), gpus)
    void this.#system.tellPromise(this.#controller, "explain", { attempt: p.attempt, text, json, summary, part: "kernels", rank: p.rank }).catch(() => {})
  }

  /** The kernels now, and a kernel that first runs on the cpu fallback once, on the console and in explain.txt. */
  #watchKernels(): void {
    this.#explainKernels("")
    stopFallbackNotes?.()
    stopFallbackNotes = onFallbackKernel((kernel) => {
      const line = `rank ${this.place().rank}: kernel ${kernel} has no ${this.#backend} implementation; it runs on the cpu backend's (slower: its inputs and outputs are copied)`
      this.#ctx.log.warn(line)
      this.#explainKernels(line)
    })
  }

  /** What the TrainContext gets: the session, the strategy's settings, and this rank's ways to the controller and its links. */
  #contextDeps(): TrainContextDeps {
    const args = this.#args
    const ctx = this.#ctx
    const system = this.#system
    const ps = this.#ps
    return {
      tf: this.#tf,
      backend: this.#backend,
      session: this.#live,
      seed: args.seed,
      adaptiveBatching: args.collective.adaptiveBatching === true,
      zeroStage: args.collective.zeroStage ?? 0,
      ...(args.collective.zeroReplica ? { zeroReplica: true } : {}),
      ...(args.collective.strategy ? { strategy: args.collective.strategy } : {}),
      ...(ps ? { ps } : {}),
      ...(ps && args.parameterServer?.auto
        ? {
            auto: {
              numServers: ps.numServers,
              explain: (text: string, json: Record<string, unknown>, summary: string) => {
                ctx.log.info(summary)
                const p = this.place()
                void system.tellPromise(this.#controller, "explain", { attempt: p.attempt, text, json, summary, part: "strategy" }).catch(() => {})
              }
            }
          }
        : {}),
      halfWire: args.collective.wireDtype === "float16",
      ...(args.collective.localSgd ? { localSgd: args.collective.localSgd } : {}),
      ...(args.elastic ? { elastic: args.elastic } : {}),
      observer: this.#observer(),
      ...(args.parityEvery !== undefined ? { parityEvery: args.parityEvery } : {}),
      warn: (line) => ctx.log.warn(line),
      onStep: (info) => this.#onStep(info),
      sendReport: (index, metrics, checkpoint, extra) => this.#sendReport(index, metrics, checkpoint, extra),
      fetchCheckpoint: (omit) => this.#fetchCheckpoint(omit),
      // ctx.preparePipeline's links and groups: communicators over some of the ranks, on this
      // rank's collective connections, named within the generation's group.
      subgroup: (name, members) => this.#subgroup(name, members),
      fetchDataset: (name) => system.askPromise(this.#controller, "dataset", { name }, { timeoutMs: 120_000, unavailableForMs: CONTROLLER_UNAVAILABLE_MS }),
      // Object store datasets read over a connection of their own: parts are megabytes, which
      // must not queue in front of the collectives' or the control traffic.
      dataNats: () =>
        (this.#dataConn ??= this.#open("data").then((c) => {
          this.#dnc = c.nc
          return c.nc
        })),
      ...(system.allowedImports !== undefined ? { allowedImports: system.allowedImports } : {})
    }
  }

  /** A progress message to the controller, throttled, except at an epoch's last step (a loop of its own trainStep calls has no epochs). */
  #onStep(info: StepInfo): void {
    this.#processed += info.samples
    // The running mean a progress line shows: over the epoch so far (a new epoch, or its steps
    // counted again, starts it afresh), or, without epochs, since the last report() call. A step
    // replayed by a joining rank (no samples) is not one of its steps; a NaN loss is shown.
    const m = this.#meanLoss
    if (info.stepsPerEpoch > 0 && (info.epoch !== m.epoch || info.step < m.step)) m.sum = m.samples = 0
    m.epoch = info.epoch
    m.step = info.step
    if (info.samples > 0) {
      m.sum += info.loss * info.samples
      m.samples += info.samples
    }
    const now = performance.now()
    // An epoch's last step is always sent, and its first one after a pause (an evaluation between
    // epochs): the driver's samples/s counts an epoch from a rank's first point in it (progress.ts).
    const edge = info.stepsPerEpoch > 0 && (info.step + 1 === info.stepsPerEpoch || (info.step === 0 && now - this.#lastProgress >= EPOCH_START_AFTER_MS))
    if (now - this.#lastProgress < PROGRESS_EVERY_MS && !edge) return
    this.#lastProgress = now
    const steps = this.#stepTimes
    this.#stepTimes = []
    const p = this.place()
    const traffic = [this.#dataNc.stats(), this.#controlNc.stats()]
    const bytesSent = traffic.reduce((n, t) => n + t.outBytes, 0)
    const bytesReceived = traffic.reduce((n, t) => n + t.inBytes, 0)
    void this.#system
      .tellPromise(this.#controller, "progress", {
        attempt: p.attempt, rank: p.rank, ...info, samples: this.#processed, ...(m.samples > 0 ? { meanLoss: m.sum / m.samples } : {}), computeMs: this.#computeMs, commMs: this.#commMs, stepTimes: steps, bytesSent, bytesReceived
      })
      .catch(() => {})
    this.#flushTrace()
  }

  /** A report() call's message: the metrics, the checkpoint, this rank's compression state and shards; answered once the controller holds it. */
  async #sendReport(index: number, metrics: Record<string, unknown>, checkpoint: Checkpoint | undefined, extra?: Record<string, Uint8Array>): Promise<void> {
    // A loop without epochs: its progress line's mean loss starts again after each report.
    this.#meanLoss.sum = this.#meanLoss.samples = 0
    const context = this.#context
    const p = this.place()
    const state = this.#live.group.reducer.state()
    // Residuals, or a codec's own state (PowerSGD's, any custom codec's), keyed by its name.
    const hasState = Object.keys(state.residuals).length > 0 || Object.keys(state).some((k) => k !== "residuals" && state[k as keyof typeof state] !== undefined)
    // ZeRO: this rank's optimizer shard goes with every report; the round's checkpoint keeps it.
    // Parameter servers with a codec: this rank's residuals of its pushes, next to the reducer's.
    const pushResiduals = this.#ps?.residuals() ?? {}
    const shardFiles = {
      ...context.prepared?.shardFiles(),
      ...extra,
      ...(Object.keys(pushResiduals).length > 0 ? { [pushResidualFile(p.rank)]: encodeMessage({ residuals: pushResiduals }) } : {})
    }
    const shards = Object.keys(shardFiles).length > 0 ? shardFiles : undefined
    this.#flushTrace()
    const t0 = performance.now()
    const body = {
      attempt: p.attempt,
      rank: p.rank,
      index,
      metrics: { ...metrics, ...context.prepared?.batchingMetrics() },
      ...(checkpoint ? { checkpoint: { files: toBytes(checkpoint.files), metadata: { ...checkpoint.metadata } } } : {}),
      ...(hasState || shards ? { aux: { ...(hasState ? { [residualFile(p.rank)]: encodeMessage(state) } : {}), ...shards } } : {})
    }
    const send = () => this.#system.askPromise(this.#controller, "report", body, { timeoutMs: 120_000, unavailableForMs: CONTROLLER_UNAVAILABLE_MS })
    // A reply lost with the connection would leave report() waiting out its deadline: once
    // the connection dropped and came back meanwhile, the report goes again every second
    // until one is answered (the controller counts a rank's report of a round once; right
    // after a reconnect the controller's subscription may not be back yet).
    let pending = send()
    let resend: Promise<unknown> = this.#bus.nextReconnect()
    for (;;) {
      const r = await Promise.race([pending.then(() => "replied" as const), resend.then(() => "again" as const)])
      if (r === "replied") break
      pending = Promise.any([pending, send()])
      resend = new Promise((resolve) => setTimeout(resolve, 1_000))
    }
    // report() returns once the controller holds every byte (the upload; writing to
    // storage happens in the background) and has this rank's metrics: the wait in report().
    if (this.#timeline) {
      const bytes = checkpoint ? Object.values(checkpoint.files).reduce((n, f) => n + (typeof f === "string" ? f.length : f.byteLength), 0) : 0
      this.#trace.push(spanEvent(checkpoint ? "checkpoint upload" : "report", t0, performance.now(), TID_WAITS, { report: index, ...(checkpoint ? { bytes } : {}) }, "wait"))
    }
  }

  /** The checkpoint to resume from, with this rank's compression state and push residuals restored from it. */
  async #fetchCheckpoint(omit?: ReadonlyArray<string>): Promise<Checkpoint | undefined> {
    const ctx = this.#ctx
    const ps = this.#ps
    // A joiner says where the survivors are: it is given the checkpoint to meet them from.
    const joinAt = this.session?.joinAt()
    const request = omit && omit.length > 0 ? { omit: [...omit], ...(joinAt ? { joinAt } : {}) } : joinAt ? { joinAt } : null
    const got = await this.#system.askPromise(this.#controller, "checkpoint", request, { timeoutMs: 120_000, unavailableForMs: CONTROLLER_UNAVAILABLE_MS })
    if (!got) return undefined
    // A joiner counts its report() calls from the checkpoint's (the reply to its joinAt says).
    if (got.reports !== undefined) this.session?.resumedFromCheckpoint(got.reports)
    // Error-feedback residuals belong to a rank of a group of one size: carried across
    // restarts at the same size, reset (started from zero) when the group was resized.
    const p = this.place()
    const savedSize = runFactsOf(got.payload.metadata).worldSize
    const own = savedSize === undefined || savedSize === p.worldSize ? got.payload.files[residualFile(p.rank)] : undefined
    if (own) {
      try {
        this.#live.group.reducer.restore(decodeMessage(own) as Parameters<GradientReducer["restore"]>[0])
      } catch (e) {
        ctx.log.warn(`rank ${p.rank}: could not restore compression state from the checkpoint: ${String(e)}`)
      }
    }
    const pushed = ps && (savedSize === undefined || savedSize === p.worldSize) ? got.payload.files[pushResidualFile(p.rank)] : undefined
    if (pushed) {
      try {
        const taken = ps!.restoreResiduals((decodeMessage(pushed) as { residuals: Record<string, Float32Array> }).residuals)
        ctx.log.info(`rank ${p.rank}: ${taken > 0 ? `restored the error-feedback residuals of its pushes to ${taken} server(s)` : "the checkpoint's push residuals are of another number of servers: pushes start from zero residuals"}`)
      } catch (e) {
        ctx.log.warn(`rank ${p.rank}: could not restore the residuals of its pushes from the checkpoint (they start from zero): ${String(e)}`)
      }
    }
    return { files: got.payload.files, metadata: loopMetadata(got.payload.metadata), path: got.path, metrics: got.metrics, ...(omit && omit.length > 0 ? { omitted: [...omit] } : {}) }
  }

  #subgroup(name: string, members: ReadonlyArray<number>): Promise<Communicator> {
    const p = this.place()
    return Communicator.create({
      nc: this.#dataNc,
      controlNc: this.#controlNc,
      cluster: this.#system.cluster,
      job: this.#system.job,
      group: `${p.group}-${name}`,
      rank: members.indexOf(p.rank),
      worldSize: members.length,
      node: p.nodes[p.rank],
      timeoutMs: this.#args.collective.timeoutMs,
      ...(this.#direct ? { direct: this.#direct } : {})
    })
  }

  /** Imports the user's loop, runs it, finishes the prepared model and tells the controller it returned. */
  async #runLoop(): Promise<void> {
    const args = this.#args
    const context = this.#context
    const mod = await importLoop(args.loopModule, this.#system.node)
    const fn = mod[args.loopExport]
    if (typeof fn !== "function") {
      const fns = Object.keys(mod).filter((k) => typeof mod[k] === "function")
      throw new ConfigError({
        field: "trainLoopPerWorker",
        reason: `export "${args.loopExport}" of ${args.loopModule} is not a function; functions it exports: ${fns.join(", ") || "none"}`
      })
    }
    await (fn as (config: unknown, ctx: TrainContext) => unknown)(args.loopConfig, context)
    // reports the loop did not await reach the driver before this rank says it finished
    await context.reportsSent()
    // micro-batches accumulated that no update applied: dropped, and the driver says so (PyTorch
    // drops a loop's last no_sync() batches without a word)
    const left = context.prepared?.unappliedAccumulation
    await context.prepared?.finish()
    this.#live.end("its loop returned")
    this.#flushTrace()
    const p = this.place()
    await this.#system.tellPromise(this.#controller, "finished", {
      attempt: p.attempt,
      rank: p.rank,
      reports: context.reportCount,
      ...(left !== undefined && left.microBatches > 0 ? { unapplied: left } : {})
    })
  }

  /** The loop (or anything before it) failed: the controller hears it, with the ranks the error blames. */
  async #failed(e: unknown): Promise<void> {
    // A ConfigError the driver answered the loop's ask with (a dataset it was not given) is the
    // loop's ConfigError: not retried, where a RemoteFailure would be restarted as a loop error.
    const f = e instanceof RemoteFailure && e.tag === "ConfigError" ? { tag: e.tag, message: e.remoteMessage, stack: e.remoteStack } : loopFailure(e)
    // (the why goes into a regroup's event, where this rank is left out)
    this.session?.end(`its loop failed: ${f.tag}: ${f.message.split("\n")[0].slice(0, 300)}`)
    this.#ctx.log.error(`rank ${this.place().rank}: the training loop failed: ${f.tag}: ${f.message}`)
    await this.#tellFailed(e, f, false)
  }

  /**
   * Tells the controller this rank failed (`parked`: its group broke under it and it waits to be
   * regrouped), with the ranks `cause` blames, where its loop was, and whether its calls mismatched the others'.
   */
  #tellFailed(cause: unknown, f: { readonly tag: string; readonly message: string; readonly stack: string }, parked: boolean): Promise<void> {
    const p = this.place()
    const blamed = blamedRanks(cause).filter((r) => r !== p.rank)
    const where = this.session?.where()
    return this.#system
      .tellPromise(this.#controller, "failed", {
        attempt: p.attempt,
        rank: p.rank,
        tag: f.tag,
        message: f.message,
        stack: f.stack,
        ...(parked ? { parked: true } : {}),
        ...(blamed.length ? { blamed: [...blamed] } : {}),
        ...(isCallMismatch(cause) ? { mismatch: true } : {}),
        ...(where !== undefined ? { where } : {})
      })
      .catch(() => {})
  }

  /** On every path: the servers' client, the bus watch, the group, the connections; then the actor stops. */
  async #close(): Promise<void> {
    this.#ps?.abort("the loop ended")
    this.#bus.stop()
    await this.session?.group.comm.close().catch(() => {})
    await this.#nc?.flush().catch(() => {})
    await this.#nc?.close().catch(() => {})
    await this.#cnc?.close().catch(() => {})
    await this.#dnc?.close().catch(() => {})
    await this.#system.nc.flush().catch(() => {})
    this.#ctx.stop({ drain: false, reason: "loop ended" })
  }
}
