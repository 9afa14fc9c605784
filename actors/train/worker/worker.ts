// The worker actor: one process per rank. On `run` it loads tfjs with its backend, opens its own
// NATS connections for collectives (noEcho, so fan-out publishes are not echoed back; bulk data
// stays off the control connection), joins the group's communicator, imports the user's loop
// module and runs it with a TrainContext. It tells the controller when the loop returns or throws
// (with the remote stack), then stops; the controller decides what happens to the group. When the
// group breaks under it (another rank died), it parks and lets the controller regroup it with the
// other survivors (pause, snapshot, resume; group-session.ts) instead of dying with the group.
// The run's state and its steps are in worker-run.ts; this file is the actor and its handlers.
import { ConfigError } from "../../../core/errors.ts"
import { foregroundPriority, inBackground, policyRestored } from "../../../core/priority.ts"
import { parseCompressionConfig, type ResolvedCompressionConfig } from "../../../collectives/compression/index.ts"
import { defineActor } from "../../runtime/actor.ts"
import { WorkerArgs, WorkerProtocol } from "../common/train-protocol.ts"
import { PsClient } from "./ps-client.ts"
import { WorkerRun } from "./worker-run.ts"

export const trainWorker = defineActor(
  WorkerProtocol,
  (ctx) => {
    const args = ctx.args as WorkerArgs
    let started = false
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
    // The run's state and steps (worker-run.ts); nothing runs until `run`.
    const worker = new WorkerRun(ctx, args, ps)
    const position = () => ({ ops: 0, reports: 0, stepsSinceReport: 0, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 })
    return {
      prepare: async () => {
        const warmUp = await worker.prepare()
        return warmUp ? { steps: warmUp.steps, ms: Math.round(warmUp.ms) } : null
      },
      run: (admission) => {
        if (!started) {
          started = true
          // A standby ran at a lower priority while it prepared (core/priority.ts): it joins at its own.
          if (inBackground()) {
            const warn = () => ctx.log.warn("could not raise this worker's CPU priority back as it joined its group: it may run slower than its peers")
            if (!foregroundPriority()) warn()
            else void policyRestored().then((ok) => ok || warn())
          }
          if (admission) worker.admit(admission)
          void worker.run()
        }
        return null
      },
      pause: async (body) => {
        // Not regrouped: a replacement let in that has not formed its first group yet is left out
        // (stopped) and made again, the survivors regrouped without it.
        if (!worker.session) return { state: "unsupported" as const, position: position(), reason: started ? "it was let in and had not formed its first group yet" : "its loop has not started" }
        const reply = await worker.session.pause(body.attempt, body.atReport === true)
        const measured = worker.measured
        return measured ? { ...reply, measured } : reply
      },
      snapshot: async () => {
        const session = worker.session
        if (!session) throw new ConfigError({ field: "snapshot", reason: "this worker has no group yet" })
        return session.snapshot()
      },
      resume: (body) => {
        const session = worker.session
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
