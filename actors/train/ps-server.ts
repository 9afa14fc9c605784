// A parameter server (collectiveConfig.strategy "parameter-server"): one actor process per shard of
// the flat parameter vector, spawned by the trainer on the group's nodes. Rank 0 initialises it
// with the shard's values and the workers' optimizer (or a checkpoint's state); workers then tell
// it their gradients (push) and it tells each one the shard's fresh parameters back (psParams) when
// the mode lets that worker go on: sync (a step's update applied; with backup workers the first
// N - b gradients of the step), async (at once) or ssp (once the slowest worker is at most
// `staleness` steps behind). The mailbox takes one message at a time and never waits: a push that
// must wait is answered later, by a tell, so the others' pushes keep arriving. The arithmetic is
// ps/shard.ts.
import { ConfigError } from "../../core/errors.ts"
import { decodeHalf } from "../../collectives/float16.ts"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"
import { defineActor } from "../runtime/actor.ts"
import { ServerProtocol, WorkerProtocol, type PsParams, type ServerArgs } from "./train-protocol.ts"
import { ShardServer, type ShardServerState } from "./ps/shard.ts"
import type { FlatOptimizerSpec } from "./optim/flat-optimizers.ts"

export const parameterServer = defineActor(ServerProtocol, (ctx) => {
  const args = ctx.args as ServerArgs
  let shard: ShardServer | undefined
  // The process's CPU time per push since the last init: what one push occupies a server for.
  let cpu0 = process.cpuUsage()
  let pushes = 0
  const cpuMsPerPush = (): number => {
    const u = process.cpuUsage(cpu0)
    return (u.user + u.system) / 1000 / Math.max(1, pushes)
  }
  const need = (what: string): ShardServer => {
    if (!shard) throw new ConfigError({ field: `ps-server.${what}`, reason: `server ${args.index} has no parameters yet: rank 0 initialises it first` })
    return shard
  }
  ctx.log.info(`parameter server ${args.index + 1}/${args.numServers} ready`)
  return {
    init: (body) => {
      shard?.abort("re-initialised")
      shard = new ShardServer(body.params, {
        mode: body.mode,
        numWorkers: body.numWorkers,
        staleness: body.staleness,
        backupWorkers: body.backupWorkers,
        spec: body.spec as unknown as FlatOptimizerSpec,
        weightDecay: body.weightDecay
      })
      if (body.state) shard.load(decodeMessage(body.state) as ShardServerState)
      cpu0 = process.cpuUsage()
      pushes = 0
      return null
    },
    push: (body) => {
      const s = need("push")
      pushes++
      const worker = ctx.system.ref(WorkerProtocol, body.replyTo)
      const answer = (reply: PsParams) =>
        void ctx.system.tellPromise(worker, "psParams", reply).catch((e: unknown) => ctx.log.warn(`could not answer rank ${body.worker}: ${String(e)}`))
      let grad = body.grad
      if (body.half) {
        grad = new Float32Array(body.half.length)
        decodeHalf(body.half, grad)
      }
      s.push(body.worker, body.step, body.basedOn, grad, body.weight, body.learningRate).then(
        (r) =>
          answer({ server: args.index, step: body.step, params: r.params, version: r.version, staleness: r.staleness, dropped: r.dropped, cpuMsPerPush: cpuMsPerPush() }),
        (e: unknown) =>
          answer({ server: args.index, step: body.step, params: new Float32Array(0), version: -1, staleness: 0, dropped: false, error: e instanceof Error ? e.message : String(e) })
      )
      return null
    },
    state: () => encodeMessage(need("state").state()),
    pull: () => need("pull").pull(),
    finish: (body) => {
      shard?.finish(body.worker)
      return null
    },
    stats: () => ({ ...(shard?.stats() ?? {}) }) as Record<string, number>
  }
})
