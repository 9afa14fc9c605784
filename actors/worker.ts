// The worker actor: one process per rank. On `run` it loads tfjs with its backend, opens its own
// NATS connection for collectives (noEcho, so fan-out publishes are not echoed back; bulk data
// stays off the control connection), joins the group's communicator, imports the user's loop
// module and runs it with a TrainContext. It tells the controller when the loop returns or throws
// (with the remote stack), then stops; the controller decides what happens to the group.
import { connect } from "@nats-io/transport-node"
import { credsAuthenticator, type NatsConnection } from "@nats-io/nats-core"
import * as fs from "node:fs"
import { pathToFileURL } from "node:url"
import * as path from "node:path"
import { loadEngine, type BackendKind } from "../core/engine.ts"
import { ConfigError } from "../core/errors.ts"
import { makeDataset } from "../core/datasets.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { Communicator, type AllReduceAlgorithm } from "../collectives/communicator.ts"
import { GradientReducer } from "../collectives/gradient-reducer.ts"
import { parseCompressionConfig, type ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import { defineActor } from "./actor.ts"
import { toWireFailure } from "./envelope.ts"
import { ControllerProtocol, WorkerArgs, WorkerProtocol } from "./train-protocol.ts"
import { TrainContext, type Checkpoint } from "./train-context.ts"
import type { StepObserver } from "./data-parallel.ts"

const PROGRESS_EVERY_MS = 250

const residualFile = (rank: number) => `gradwire/rank-${rank}/reducer-state.msgpack`

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
    const run = async (): Promise<void> => {
      const system = ctx.system
      const controller = system.ref(ControllerProtocol, args.controller)
      const { attempt, rank } = args
      let nc: NatsConnection | undefined
      let comm: Communicator | undefined
      try {
        const { tf, backend } = await loadEngine(args.backend as BackendKind | "auto")
        const c = args.connection
        nc = await connect({
          servers: [...c.servers],
          name: `gradwire ${system.job} rank ${rank} collectives`,
          noEcho: true,
          maxReconnectAttempts: -1,
          reconnectTimeWait: 250,
          ...(c.user !== undefined ? { user: c.user, pass: c.password ?? "" } : {}),
          ...(c.token !== undefined ? { token: c.token } : {}),
          ...(c.creds !== undefined ? { authenticator: credsAuthenticator(fs.readFileSync(c.creds)) } : {})
        })
        comm = await Communicator.create({
          nc,
          cluster: system.cluster,
          job: system.job,
          group: args.group,
          rank,
          worldSize: args.worldSize,
          node: args.nodes[rank],
          timeoutMs: args.collective.timeoutMs
        })
        const compression = parseCompressionConfig(args.collective.compression, "collectiveConfig.compression")
        const trace: unknown[] = []
        const observer: StepObserver | undefined = args.timeline
          ? { phase: (name, start, end, step) => void trace.push({ name, ph: "X", ts: start * 1000, dur: (end - start) * 1000, args: { step } }) }
          : undefined
        const reducer = new GradientReducer(comm, {
          algorithm: args.collective.algorithm as AllReduceAlgorithm,
          compression: (compression === "auto" ? "none" : compression) as ResolvedCompressionConfig,
          wire: args.collective.wireDtype === "float16" ? "f16" : "f32",
          bucketBytes: args.collective.bucketSizeMiB * 1024 * 1024,
          firstBucketBytes: args.collective.firstBucketSizeMiB * 1024 * 1024,
          ...(args.timeline
            ? {
                onBucket: (b) =>
                  void trace.push({
                    name: `allreduce bucket ${b.bucket}`,
                    ph: "X",
                    ts: b.startMs * 1000,
                    dur: (b.endMs - b.startMs) * 1000,
                    args: { bytes: b.bytes, algorithm: b.algorithm, encodeMs: b.encodeMs }
                  })
              }
            : {})
        })
        const flushTrace = (): void => {
          if (trace.length === 0) return
          void system.tellPromise(controller, "trace", { attempt, rank, events: trace.splice(0) }).catch(() => {})
        }
        let lastProgress = 0
        let processed = 0
        let computeMs = 0
        let commMs = 0
        const context = new TrainContext({
          tf,
          backend,
          rank,
          worldSize: args.worldSize,
          localRank: args.localRank,
          localWorldSize: args.localWorldSize,
          nodeRank: args.nodeRank,
          attempt,
          seed: args.seed,
          communicator: comm,
          reducer,
          observer: {
            phase: (name, start, end, step) => {
              if (name === "forward_backward") computeMs = end - start
              else if (name === "allreduce") commMs = end - start
              observer?.phase?.(name, start, end, step)
            }
          },
          onStep: (info) => {
            processed += info.samples
            const now = performance.now()
            if (now - lastProgress < PROGRESS_EVERY_MS && info.step + 1 < info.stepsPerEpoch) return
            lastProgress = now
            void system
              .tellPromise(controller, "progress", { attempt, rank, ...info, samples: processed, computeMs, commMs })
              .catch(() => {})
            flushTrace()
          },
          sendReport: async (index, metrics, checkpoint: Checkpoint | undefined) => {
            const state = reducer.state()
            const hasState = Object.keys(state.residuals).length > 0 || state.powersgd !== undefined
            flushTrace()
            await system.askPromise(
              controller,
              "report",
              {
                attempt,
                rank,
                index,
                metrics,
                ...(checkpoint ? { checkpoint: { files: toBytes(checkpoint.files), metadata: { ...checkpoint.metadata } } } : {}),
                ...(hasState ? { aux: { [residualFile(rank)]: encodeMessage(state) } } : {})
              },
              { timeoutMs: 120_000 }
            )
          },
          fetchCheckpoint: async () => {
            const got = await system.askPromise(controller, "checkpoint", null, { timeoutMs: 120_000 })
            if (!got) return undefined
            const own = got.payload.files[residualFile(rank)]
            if (own) {
              try {
                reducer.restore(decodeMessage(own) as Parameters<GradientReducer["restore"]>[0])
              } catch (e) {
                ctx.log.warn(`rank ${rank}: could not restore compression state from the checkpoint: ${String(e)}`)
              }
            }
            return { files: got.payload.files, metadata: got.payload.metadata, path: got.path, metrics: got.metrics }
          },
          fetchDataset: async (name) => {
            const d = await system.askPromise(controller, "dataset", { name }, { timeoutMs: 120_000 })
            return makeDataset(d.x, d.y, d.featureShape, d.numClasses)
          }
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
        flushTrace()
        await system.tellPromise(controller, "finished", { attempt, rank, reports: context.reportCount })
      } catch (e) {
        const f = toWireFailure(e)
        ctx.log.error(`rank ${rank}: the training loop failed: ${f.tag}: ${f.message}`)
        await system.tellPromise(controller, "failed", { attempt, rank, tag: f.tag, message: f.message, stack: f.stack }).catch(() => {})
      } finally {
        await comm?.close().catch(() => {})
        await nc?.flush().catch(() => {})
        await nc?.close().catch(() => {})
        await system.nc.flush().catch(() => {})
        ctx.stop({ drain: false, reason: "loop ended" })
      }
    }
    return {
      run: () => {
        if (!started) {
          started = true
          void run()
        }
        return null
      }
    }
  },
  { args: WorkerArgs }
)

export default trainWorker
