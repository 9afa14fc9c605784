// The worker actor: one process per rank. On `run` it loads tfjs with its backend, opens its own
// NATS connections for collectives (noEcho, so fan-out publishes are not echoed back; bulk data
// stays off the control connection), joins the group's communicator, imports the user's loop
// module and runs it with a TrainContext. It tells the controller when the loop returns or throws
// (with the remote stack), then stops; the controller decides what happens to the group. When the
// group breaks under it (another rank died), it parks and lets the controller regroup it with the
// other survivors (pause, snapshot, resume; group-session.ts) instead of dying with the group.
import type { NatsConnection } from "@nats-io/nats-core"
import { openConnection, SPAWNED_CONNECT_TIMEOUT_MS, type OpenedConnection } from "../../../core/connection-spec.ts"
import { pathToFileURL } from "node:url"
import * as path from "node:path"
import { connectionLocalAddress } from "../../../core/nats-internals/index.ts"
import { engineChoice, loadEngine, type BackendKind } from "../../../core/engine.ts"
import { fallbackKernelsUsed, onFallbackKernel } from "../../../core/kernels/fallback.ts"
import { describeKernels } from "../../../core/kernels/register.ts"

/** Unsubscribes the current run's notes about kernels on the cpu fallback (one run at a time per process). */
let stopFallbackNotes: (() => void) | undefined
import { ConfigError } from "../../../core/errors.ts"
import { ModuleNotAllowed } from "../../node/errors.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import { Communicator, describeTransport, type AllReduceAlgorithm, type DirectOptions } from "../../../collectives/communicator.ts"
import { GradientReducer } from "../../../collectives/gradient-reducer.ts"
import { blamedRanks } from "../../../collectives/errors.ts"
import { MeasuredDeadlines } from "../../../collectives/deadlines.ts"
import { parseCompressionConfig, type ResolvedCompressionConfig } from "../../../collectives/compression/index.ts"
import { watchBus } from "../../../core/bus-monitor.ts"
import { NATS_OUTAGE_TIMEOUT_MS } from "../../../core/defaults.ts"
import * as settings from "../../../core/settings.ts"
import { defineActor } from "../../runtime/actor.ts"
import { toWireFailure } from "../../runtime/envelope.ts"
import { ControllerProtocol, WorkerArgs, WorkerProtocol, type Placement } from "../common/train-protocol.ts"
import { TrainContext, type Checkpoint } from "./train-context.ts"
import { GroupSession, type LiveGroup } from "./group-session.ts"
import type { StepObserver } from "./data-parallel.ts"
import { spanEvent, tidOfBucket, TID_STEP, TID_WAITS, type TraceEvent } from "../common/observe/timeline.ts"
import { AutoGradientReducer, prepareAutoCollectives } from "./auto-config.ts"
import { PsClient } from "./ps-client.ts"

const PROGRESS_EVERY_MS = 250

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

export const trainWorker = defineActor(
  WorkerProtocol,
  (ctx) => {
    const args = ctx.args as WorkerArgs
    let started = false
    let session: GroupSession | undefined
    // The parameter-server strategy: the servers this rank pushes to (their answers come as psParams).
    const ps = args.servers && args.servers.length > 0 && args.parameterServer
      ? new PsClient({
          system: ctx.system,
          servers: args.servers,
          self: ctx.name,
          mode: args.parameterServer.mode,
          staleness: args.parameterServer.staleness,
          backupWorkers: args.parameterServer.backupWorkers,
          timeoutMs: args.parameterServer.timeoutMs,
          halfWire: args.collective.wireDtype === "float16",
          compression: parseCompressionConfig(args.collective.compression, "collectiveConfig.compression") as ResolvedCompressionConfig
        })
      : undefined
    const run = async (): Promise<void> => {
      const system = ctx.system
      const controller = system.ref(ControllerProtocol, args.controller)
      const place = (): Placement =>
        session?.placement ?? {
          attempt: args.attempt,
          rank: args.rank,
          worldSize: args.worldSize,
          localRank: args.localRank,
          localWorldSize: args.localWorldSize,
          nodeRank: args.nodeRank,
          nodes: args.nodes,
          group: args.group
        }
      // No wait without a deadline: a worker whose NATS stays away longer than
      // failureConfig.natsOutageTimeoutMs exits (the controller restarts the group once it can).
      const outageMs = args.natsOutageTimeoutMs ?? NATS_OUTAGE_TIMEOUT_MS
      const bus = watchBus(system.nc, {
        timeoutMs: outageMs,
        onDown: (o) => ctx.log.warn(`rank ${place().rank}: lost the NATS connection (${o.server}); exiting if it is not back within ${outageMs / 1000} s`),
        onUp: (o) => ctx.log.info(`rank ${place().rank}: the NATS connection is back after ${(o.ms / 1000).toFixed(1)} s`),
        onExpired: (o) => {
          ctx.log.error(`rank ${place().rank}: no NATS for ${(o.ms / 1000).toFixed(1)} s (failureConfig.natsOutageTimeoutMs ${outageMs}); exiting`)
          process.exit(75)
        }
      })
      let nc: NatsConnection | undefined
      let cnc: NatsConnection | undefined
      let dnc: NatsConnection | undefined
      let dataConn: Promise<NatsConnection> | undefined
      try {
        // Only a loop the agent checked (module-policy.ts) may be imported: the spawn request
        // declared it, and the args could name another. Checked first, before anything is loaded.
        const allowed = system.allowedImports
        if (allowed !== undefined && !allowed.includes(args.loopModule)) {
          throw new ModuleNotAllowed({ node: system.node, module: args.loopModule, reason: "the spawn request did not declare it, so the agent did not check it" })
        }
        const { tf, backend } = await loadEngine(args.backend as BackendKind | "auto")
        // The connection this process's agent gave it (servers and credentials, on stdin), with the
        // server the agent connected it to first: on a multi-machine cluster that is the node's own
        // nats-server, so collective traffic enters the cluster next to the worker (and
        // hierarchical/topology-aware choices see the real servers) instead of every rank dialling
        // the driver's address. The agent's other servers stay as fallbacks.
        const spec = system.connection
        if (spec === undefined) {
          throw new ConfigError({ field: "worker", reason: "a worker runs in a process its node agent spawned (it opens that process's connection spec); spawn it with spawnActor" })
        }
        const own = system.nc.getServer()
        const ownUrl = own && !/^[a-z]+:\/\//.test(own) ? `${spec.tls !== undefined ? "tls" : "nats"}://${own}` : own
        const open = (role: string) =>
          openConnection(spec, `gradwire ${system.job} rank ${args.rank} ${role}`, { noEcho: true, timeoutMs: SPAWNED_CONNECT_TIMEOUT_MS, ...(ownUrl ? { preferServers: [ownUrl] } : {}) })
        // Two connections: bulk data, and credits/acks, which must not queue behind this rank's own
        // outgoing megabytes (on one connection large all-reduces run at about half the speed).
        const opened = await Promise.allSettled([open("collectives"), open("collective control")])
        const failed = opened.find((o) => o.status === "rejected")
        if (failed) {
          for (const o of opened) if (o.status === "fulfilled") await o.value.nc.close().catch(() => {})
          throw failed.reason
        }
        ;[nc, cnc] = opened.map((o) => (o as PromiseFulfilledResult<OpenedConnection>).value.nc)
        const dataNc = nc
        const controlNc = cnc
        // The direct links (collectives/direct.ts): listen where this worker reaches the bus from
        // (the local address of its collective connection), unless GRADWIRE_DIRECT_HOST says
        // otherwise; TLS-PSK when the bus runs TLS.
        const transport = args.collective.transport ?? "auto"
        const direct: DirectOptions | undefined =
          transport === "nats" || args.collective.directSecret === undefined
            ? undefined
            : {
                transport,
                secret: Buffer.from(args.collective.directSecret, "hex"),
                host: settings.directHost.read() ?? connectionLocalAddress(dataNc),
                tls: spec.tls !== undefined
              }
        const compression = parseCompressionConfig(args.collective.compression, "collectiveConfig.compression")
        // Timeline events (only with runConfig.timeline), shipped to the controller in batches.
        const trace: TraceEvent[] = []
        const timeline = args.timeline
        let currentStep = 0
        // Collective deadlines from this rank's measured steps (collectives/deadlines.ts): the
        // measurements outlive a regroup, each new group warms up again; an explicit
        // collectiveConfig.timeoutMs is used as given.
        const deadlines = new MeasuredDeadlines(args.collective.timeoutFixed ? { fixedMs: args.collective.timeoutMs } : { capMs: args.collective.timeoutMs })
        let deadlinesExplained = false
        // The group of a placement: its communicator, and the reducer that picks the algorithm per
        // bucket from the probed links ('auto', auto-config.ts). Every member of a generation builds
        // it at the same point (start-up, or a regroup), so the probe's collectives line up.
        const build = async (p: Placement): Promise<{ comm: Communicator; reducer: GradientReducer }> => {
          deadlines.newGroup()
          const comm = await Communicator.create({
            nc: dataNc,
            controlNc,
            cluster: system.cluster,
            job: system.job,
            group: p.group,
            rank: p.rank,
            worldSize: p.worldSize,
            node: p.nodes[p.rank],
            timeoutMs: args.collective.timeoutMs,
            deadlines,
            ...(direct ? { direct } : {})
          })
          try {
            // "auto": which sizes the direct links carry faster, measured by the group (collectives).
            const measured = transport === "auto" && direct ? await comm.measureTransport() : undefined
            const transportText = describeTransport(comm.transport, measured)
            // Per-worker transport detail: explain.txt has it; the console only with verbose (GRADWIRE_LOG=debug).
            if (p.rank === 0 && direct) ctx.log.debug(transportText)
            const reducer = new AutoGradientReducer(comm, {
              ...(await prepareAutoCollectives({
                nc: dataNc, comm, cluster: system.cluster, job: system.job, algorithm: args.collective.algorithm, compression, log: ctx.log,
                ...(p.rank === 0
                  ? {
                      onExplain: (e, summary) =>
                        void system
                          .tellPromise(controller, "explain", { attempt: p.attempt, text: `${e.text}\n${transportText}`, json: { ...e.json, transport: { ...comm.transport, measured } }, summary })
                          .catch(() => {})
                    }
                  : {})
              })),
              wire: args.collective.wireDtype === "float16" ? "f16" : "f32",
              bucketBytes: args.collective.bucketSizeMiB * 1024 * 1024,
              firstBucketBytes: args.collective.firstBucketSizeMiB * 1024 * 1024,
              ...(timeline
                ? {
                    // A bucket's row: the whole bucket, then its compression (encodeMs, measured from
                    // the bucket's start) and the exchange that follows it, nested inside.
                    onBucket: (b) => {
                      const tid = tidOfBucket(b.bucket)
                      const info = { step: currentStep, bytes: b.bytes, algorithm: b.algorithm, encodeMs: b.encodeMs }
                      trace.push(spanEvent(`bucket ${b.bucket}`, b.startMs, b.endMs, tid, info, "allreduce"))
                      const split = Math.min(b.endMs, b.startMs + b.encodeMs)
                      if (b.encodeMs > 0) trace.push(spanEvent("compress", b.startMs, split, tid, { step: currentStep }, "allreduce"))
                      trace.push(spanEvent(`all-reduce (${b.algorithm})`, split, b.endMs, tid, { step: currentStep, bytes: b.bytes }, "allreduce"))
                    }
                  }
                : {})
            })
            return { comm, reducer }
          } catch (e) {
            await comm.close().catch(() => {})
            throw e
          }
        }
        const first = place()
        const initial = await build(first)
        const live = new GroupSession(
          { placement: first, ...initial },
          {
            build,
            close: (g: LiveGroup) => g.comm.close(),
            parked: (cause) => {
              const f = toWireFailure(cause)
              const p = place()
              const blamed = blamedRanks(cause).filter((r) => r !== p.rank)
              ctx.log.warn(`rank ${p.rank}: the group broke (${f.tag}: ${f.message.split("\n")[0]}); waiting to be regrouped`)
              void system
                .tellPromise(controller, "failed", { attempt: p.attempt, rank: p.rank, tag: f.tag, message: f.message, stack: f.stack, parked: true, ...(blamed.length ? { blamed: [...blamed] } : {}) })
                .catch(() => {})
            },
            fetchState: (attempt) => system.askPromise(controller, "peerState", { attempt }, { timeoutMs: 120_000 }),
            log: (line) => ctx.log.info(line)
          },
          args.join
        )
        session = live
        const flushTrace = (): void => {
          if (trace.length === 0) return
          const p = place()
          void system.tellPromise(controller, "trace", { attempt: p.attempt, rank: p.rank, events: trace.splice(0) }).catch(() => {})
        }
        let lastProgress = 0
        let processed = 0
        let computeMs = 0
        let commMs = 0
        let applyMs = 0
        // Every step's [step, forward/backward ms, all-reduce ms, apply ms, ms since the previous
        // step ended] since the last progress message: the report's and the dashboard's compute /
        // communication / waiting split, whether or not the timeline is on.
        let stepTimes: number[][] = []
        let lastStepEnd: number | undefined
        const observer: StepObserver = {
          phase: (name, start, end, step) => {
            currentStep = step
            if (name === "forward_backward") (live.group.reducer as AutoGradientReducer).noteCompute((computeMs = end - start))
            else if (name === "allreduce") commMs = end - start
            else if (name === "apply") applyMs = end - start
            else if (name === "step") {
              stepTimes.push([step, computeMs, commMs, applyMs, lastStepEnd === undefined ? 0 : Math.max(0, start - lastStepEnd)])
              lastStepEnd = end
              deadlines.noteStep(end - start)
              // Once derived (after the warm-up steps), rank 0 says the deadline: explain.txt and
              // the console; every rank logs its own.
              if (!deadlinesExplained && (deadlines.fixedMs !== undefined || deadlines.medianStepMs !== undefined)) {
                deadlinesExplained = true
                const p = place()
                const d = deadlines.describe()
                ctx.log.debug(`rank ${p.rank}: ${d.summary.replace(/^gradwire: /, "")}`)
                if (p.rank === 0) void system.tellPromise(controller, "explain", { attempt: p.attempt, text: d.text, json: d.json, summary: d.summary, part: "deadlines" }).catch(() => {})
              }
            }
            if (timeline) trace.push(spanEvent(name, start, end, TID_STEP, { step }))
          },
          wait: (name, start, end) => {
            if (timeline) trace.push(spanEvent(name, start, end, TID_WAITS, undefined, "wait"))
          }
        }
        // This rank's backend and kernels in explain.txt; a kernel that first runs on the cpu fallback
        // is said once, on the console and there.
        const explainKernels = (summary: string): void => {
          const p = place()
          const { text, json } = describeKernels(backend, p.rank, fallbackKernelsUsed(), engineChoice())
          void system.tellPromise(controller, "explain", { attempt: p.attempt, text, json, summary, part: "kernels", rank: p.rank }).catch(() => {})
        }
        explainKernels("")
        stopFallbackNotes?.()
        stopFallbackNotes = onFallbackKernel((kernel) => {
          const line = `rank ${place().rank}: kernel ${kernel} has no ${backend} implementation; it runs on the cpu backend's (slower: its inputs and outputs are copied)`
          ctx.log.warn(line)
          explainKernels(line)
        })
        const context = new TrainContext({
          tf,
          backend,
          session: live,
          seed: args.seed,
          adaptiveBatching: args.collective.adaptiveBatching === true,
          zeroStage: args.collective.zeroStage ?? 0,
          ...(args.collective.strategy ? { strategy: args.collective.strategy } : {}),
          ...(ps ? { ps } : {}),
          ...(ps && args.parameterServer?.auto
            ? {
                auto: {
                  numServers: ps.numServers,
                  explain: (text: string, json: Record<string, unknown>, summary: string) => {
                    ctx.log.info(summary)
                    const p = place()
                    void system.tellPromise(controller, "explain", { attempt: p.attempt, text, json, summary, part: "strategy" }).catch(() => {})
                  }
                }
              }
            : {}),
          halfWire: args.collective.wireDtype === "float16",
          ...(args.collective.localSgd ? { localSgd: args.collective.localSgd } : {}),
          ...(args.elastic ? { elastic: args.elastic } : {}),
          observer,
          ...(args.parityEvery !== undefined ? { parityEvery: args.parityEvery } : {}),
          warn: (line) => ctx.log.warn(line),
          onStep: (info) => {
            processed += info.samples
            const now = performance.now()
            // Throttled, except at an epoch's last step (a loop of its own trainStep calls has no epochs).
            if (now - lastProgress < PROGRESS_EVERY_MS && (info.stepsPerEpoch === 0 || info.step + 1 < info.stepsPerEpoch)) return
            lastProgress = now
            const steps = stepTimes
            stepTimes = []
            const p = place()
            const traffic = [dataNc.stats(), controlNc.stats()]
            const bytesSent = traffic.reduce((n, t) => n + t.outBytes, 0)
            const bytesReceived = traffic.reduce((n, t) => n + t.inBytes, 0)
            void system
              .tellPromise(controller, "progress", { attempt: p.attempt, rank: p.rank, ...info, samples: processed, computeMs, commMs, stepTimes: steps, bytesSent, bytesReceived })
              .catch(() => {})
            flushTrace()
          },
          sendReport: async (index, metrics, checkpoint: Checkpoint | undefined, extra?: Record<string, Uint8Array>) => {
            const p = place()
            const state = live.group.reducer.state()
            // Residuals, or a codec's own state (PowerSGD's, any custom codec's), keyed by its name.
            const hasState = Object.keys(state.residuals).length > 0 || Object.keys(state).some((k) => k !== "residuals" && state[k as keyof typeof state] !== undefined)
            // ZeRO: this rank's optimizer shard goes with every report; the round's checkpoint keeps it.
            // Parameter servers with a codec: this rank's residuals of its pushes, next to the reducer's.
            const pushResiduals = ps?.residuals() ?? {}
            const shardFiles = {
              ...context.prepared?.shardFiles(),
              ...extra,
              ...(Object.keys(pushResiduals).length > 0 ? { [pushResidualFile(p.rank)]: encodeMessage({ residuals: pushResiduals }) } : {})
            }
            const shards = Object.keys(shardFiles).length > 0 ? shardFiles : undefined
            flushTrace()
            const t0 = performance.now()
            const body = {
              attempt: p.attempt,
              rank: p.rank,
              index,
              metrics: { ...metrics, ...context.prepared?.batchingMetrics() },
              ...(checkpoint ? { checkpoint: { files: toBytes(checkpoint.files), metadata: { ...checkpoint.metadata } } } : {}),
              ...(hasState || shards ? { aux: { ...(hasState ? { [residualFile(p.rank)]: encodeMessage(state) } : {}), ...shards } } : {})
            }
            const send = () => system.askPromise(controller, "report", body, { timeoutMs: 120_000 })
            // A reply lost with the connection would leave report() waiting out its deadline: once
            // the connection dropped and came back meanwhile, the report goes again every second
            // until one is answered (the controller counts a rank's report of a round once; right
            // after a reconnect the controller's subscription may not be back yet).
            let pending = send()
            let resend: Promise<unknown> = bus.nextReconnect()
            for (;;) {
              const r = await Promise.race([pending.then(() => "replied" as const), resend.then(() => "again" as const)])
              if (r === "replied") break
              pending = Promise.any([pending, send()])
              resend = new Promise((resolve) => setTimeout(resolve, 1_000))
            }
            // report() returns once the controller holds every byte (the upload; writing to
            // storage happens in the background) and has this rank's metrics: the wait in report().
            if (timeline) {
              const bytes = checkpoint ? Object.values(checkpoint.files).reduce((n, f) => n + (typeof f === "string" ? f.length : f.byteLength), 0) : 0
              trace.push(spanEvent(checkpoint ? "checkpoint upload" : "report", t0, performance.now(), TID_WAITS, { report: index, ...(checkpoint ? { bytes } : {}) }, "wait"))
            }
          },
          fetchCheckpoint: async () => {
            const got = await system.askPromise(controller, "checkpoint", null, { timeoutMs: 120_000 })
            if (!got) return undefined
            // Error-feedback residuals belong to a rank of a group of one size: carried across
            // restarts at the same size, reset (started from zero) when the group was resized.
            const p = place()
            const savedSize = got.payload.metadata.worldSize
            const own = savedSize === undefined || savedSize === p.worldSize ? got.payload.files[residualFile(p.rank)] : undefined
            if (own) {
              try {
                live.group.reducer.restore(decodeMessage(own) as Parameters<GradientReducer["restore"]>[0])
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
            return { files: got.payload.files, metadata: got.payload.metadata, path: got.path, metrics: got.metrics }
          },
          // ctx.preparePipeline's links and groups: communicators over some of the ranks, on this
          // rank's collective connections, named within the generation's group.
          subgroup: (name, members) => {
            const p = place()
            return Communicator.create({
              nc: dataNc,
              controlNc,
              cluster: system.cluster,
              job: system.job,
              group: `${p.group}-${name}`,
              rank: members.indexOf(p.rank),
              worldSize: members.length,
              node: p.nodes[p.rank],
              timeoutMs: args.collective.timeoutMs,
              ...(direct ? { direct } : {})
            })
          },
          fetchDataset: (name) => system.askPromise(controller, "dataset", { name }, { timeoutMs: 120_000 }),
          // Object store datasets read over a connection of their own: parts are megabytes, which
          // must not queue in front of the collectives' or the control traffic.
          dataNats: () =>
            (dataConn ??= open("data").then((c) => {
              dnc = c.nc
              return c.nc
            })),
          ...(system.allowedImports !== undefined ? { allowedImports: system.allowedImports } : {})
        })
        const mod = (await import(moduleUrl(args.loopModule))) as Record<string, unknown>
        const fn = mod[args.loopExport]
        if (typeof fn !== "function") {
          const fns = Object.keys(mod).filter((k) => typeof mod[k] === "function")
          throw new ConfigError({
            field: "trainLoopPerWorker",
            reason: `export "${args.loopExport}" of ${args.loopModule} is not a function; functions it exports: ${fns.join(", ") || "none"}`
          })
        }
        await (fn as (config: unknown, ctx: TrainContext) => unknown)(args.loopConfig, context)
        await context.prepared?.finish()
        live.end("its loop returned")
        flushTrace()
        const p = place()
        await system.tellPromise(controller, "finished", { attempt: p.attempt, rank: p.rank, reports: context.reportCount })
      } catch (e) {
        session?.end("its loop failed")
        const f = toWireFailure(e)
        const p = place()
        ctx.log.error(`rank ${p.rank}: the training loop failed: ${f.tag}: ${f.message}`)
        const blamed = blamedRanks(e).filter((r) => r !== p.rank)
        await system
          .tellPromise(controller, "failed", { attempt: p.attempt, rank: p.rank, tag: f.tag, message: f.message, stack: f.stack, ...(blamed.length ? { blamed: [...blamed] } : {}) })
          .catch(() => {})
      } finally {
        ps?.abort("the loop ended")
        bus.stop()
        await session?.group.comm.close().catch(() => {})
        await nc?.flush().catch(() => {})
        await nc?.close().catch(() => {})
        await cnc?.close().catch(() => {})
        await dnc?.close().catch(() => {})
        await system.nc.flush().catch(() => {})
        ctx.stop({ drain: false, reason: "loop ended" })
      }
    }
    const position = () => ({ ops: 0, reports: 0, stepsSinceReport: 0, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 })
    return {
      run: () => {
        if (!started) {
          started = true
          void run()
        }
        return null
      },
      pause: (body) =>
        session ? session.pause(body.attempt) : { state: "unsupported" as const, position: position(), reason: "its loop has not started" },
      snapshot: async () => {
        if (!session) throw new ConfigError({ field: "snapshot", reason: "this worker has no group yet" })
        return session.snapshot()
      },
      resume: (body) => {
        if (!session) throw new ConfigError({ field: "resume", reason: "this worker has no group yet" })
        session.resume(body.placement, body.source)
        return null
      },
      psParams: (body) => {
        ps?.onParams(body)
        return null
      }
    }
  },
  { args: WorkerArgs }
)

export default trainWorker
