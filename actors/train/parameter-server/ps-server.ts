// A parameter server (collectiveConfig.strategy "parameter-server"): one actor process per shard of
// the flat parameter vector, spawned by the trainer on the group's nodes. Rank 0 initialises it
// with the shard's values and the workers' optimizer (or a checkpoint's state); workers then tell
// it their gradients (push) and it tells each one the shard's fresh parameters back (psParams) when
// the mode lets that worker go on: sync (a step's update applied; with backup workers the first
// N - b gradients of the step), async (at once) or ssp (once the slowest worker is at most
// `staleness` steps behind). The mailbox takes one message at a time and never waits: a push that
// must wait is answered later, by a tell, so the others' pushes keep arriving. The arithmetic is
// ps/shard.ts; a push compressed by a codec (collectiveConfig.compression) or sent as binary16 is
// decoded into one buffer reused from push to push (ps-push-codec.ts) before it gets there.
import { ConfigError } from "../../../core/errors.ts"
import type { ResolvedCompressionConfig } from "../../../collectives/compression/config.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import { defineActor } from "../../runtime/actor.ts"
import { ServerProtocol, WorkerProtocol, type PsParams, type ServerArgs } from "../common/train-protocol.ts"
import { ShardServer, type ShardServerState } from "./shard.ts"
import { PushDecoder } from "../common/ps-push-codec.ts"
import type { FlatOptimizerSpec } from "../common/optim/flat-optimizers.ts"

export const parameterServer = defineActor(ServerProtocol, (ctx) => {
  const args = ctx.args as ServerArgs
  let shard: ShardServer | undefined
  let decoder: PushDecoder | undefined
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
      const nextDecoder = new PushDecoder(body.compression as ResolvedCompressionConfig | undefined, body.params.length)
      shard?.abort("re-initialised")
      decoder = nextDecoder
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
      const refuse = (e: unknown) =>
        answer({ server: args.index, step: body.step, params: new Float32Array(0), version: -1, staleness: 0, dropped: false, error: e instanceof Error ? e.message : String(e) })
      let grad: Float32Array
      try {
        // The decoder's buffer: the shard adds or applies it before push() returns and keeps none of it.
        grad = decoder ? decoder.decode(body) : body.grad
      } catch (e) {
        refuse(e)
        return null
      }
      s.push(body.worker, body.step, body.basedOn, grad, body.weight, body.learningRate).then(
        (r) =>
          answer({ server: args.index, step: body.step, params: r.params, version: r.version, staleness: r.staleness, dropped: r.dropped, cpuMsPerPush: cpuMsPerPush() }),
        refuse
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
