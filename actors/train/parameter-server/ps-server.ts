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
// When the workers are regrouped (a worker lost, the survivors going on; a replacement let in), the
// driver tells every server the new group's size: the shard keeps its parameters, version and
// optimizer state, and pushes of the group left behind are dropped.
// Replicas (two servers or more): each server keeps a replica of its predecessor's shard (server
// k - 1's, cyclically). A server sends its successor its whole state when it is initialised
// (`replicaInit`) and then every update it applies, before it answers the pushes that update
// resolves (`replicaUpdate`: the gradient applied, its learning rate and step; the successor
// replays it with the same optimizer code, so the replica is the shard bit for bit). When a server
// is lost, the driver starts a new one, its successor initialises it from the replica
// (`handOver`: any worker that got an answer of the lost server got it after the update was on its
// way to the replica), and its predecessor sends the new one its own replica (`replicateTo`).
import { ConfigError } from "../../../core/errors.ts"
import type { ResolvedCompressionConfig } from "../../../collectives/compression/config.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import { defineActor } from "../../runtime/actor.ts"
import { ServerProtocol, WorkerProtocol, type PsParams, type ServerArgs } from "../common/train-protocol.ts"
import { ShardServer, type ShardServerOptions, type ShardServerState } from "./shard.ts"
import { PushDecoder } from "../common/ps-push-codec.ts"
import { tierUpSooner } from "../../../core/tier-up.ts"
import type { FlatOptimizerSpec } from "../common/optim/flat-optimizers.ts"
import type { PsMode } from "../common/ps-state.ts"

/** The shard options an init (or a replica's init) carries. */
const optionsOf = (body: { mode: PsMode; numWorkers: number; staleness: number; backupWorkers: number; spec: Record<string, unknown>; weightDecay: number }): ShardServerOptions => ({
  mode: body.mode,
  numWorkers: body.numWorkers,
  staleness: body.staleness,
  backupWorkers: body.backupWorkers,
  spec: body.spec as unknown as FlatOptimizerSpec,
  weightDecay: body.weightDecay
})

/** optionsOf's inverse: what an init message says of the shard's options. */
const optionsBody = (o: ShardServerOptions) => ({
  mode: o.mode,
  numWorkers: o.numWorkers,
  staleness: o.staleness,
  backupWorkers: o.backupWorkers,
  spec: o.spec as unknown as Record<string, unknown>,
  weightDecay: o.weightDecay ?? 0
})

export const parameterServer = defineActor(ServerProtocol, (ctx) => {
  const args = ctx.args as ServerArgs
  let shard: ShardServer | undefined
  let options: ShardServerOptions | undefined
  let decoder: PushDecoder | undefined
  // The workers' group (generation) this server serves: a push or finish of an earlier one, sent
  // before a regroup and arriving after it, is dropped (its worker was paused and renumbered).
  let group = 0
  // Shards a regroup replaced: their waiting pushes are dropped, not refused.
  const regrouped = new WeakSet<ShardServer>()
  // This server's shard (a spare, started ahead with -1, learns it from the init that makes it a
  // lost server's replacement), and where its updates go (its successor's name; none with one
  // server). The replica this server keeps of its predecessor's shard, with what a server made
  // from it needs.
  let index = args.index
  let successor = args.successor
  let replica: { readonly index: number; readonly shard: ShardServer; readonly options: ShardServerOptions; readonly compression: unknown } | undefined
  let compression: unknown
  const toSuccessor = () => (successor !== undefined ? ctx.system.ref(ServerProtocol, successor) : undefined)
  const unsent = (what: string) => (e: unknown) => ctx.log.warn(`could not send ${what} to ${successor}: ${String(e)}`)
  // An update as it is applied: to the successor before any push it resolves is answered (the
  // tell is encoded and published at once, in order; the answers follow when the push promises settle).
  const onUpdate = (grad: Float32Array, learningRate: number, step: number): void => {
    const to = toSuccessor()
    if (to) void ctx.system.tellPromise(to, "replicaUpdate", { index, grad, learningRate, step }).catch(unsent("an update"))
  }
  const seedReplica = (): void => {
    const to = toSuccessor()
    if (!to || !shard || !options) return
    const body = { index, state: encodeMessage(shard.state()), ...optionsBody(options), ...(compression !== undefined ? { compression } : {}) }
    void ctx.system.tellPromise(to, "replicaInit", body).catch(unsent("the shard's state"))
  }
  // The process's CPU time per push since the last init: what one push occupies a server for.
  let cpu0 = process.cpuUsage()
  let pushes = 0
  const cpuMsPerPush = (): number => {
    const u = process.cpuUsage(cpu0)
    return (u.user + u.system) / 1000 / Math.max(1, pushes)
  }
  const need = (what: string): ShardServer => {
    if (!shard) throw new ConfigError({ field: `ps-server.${what}`, reason: `server ${index} has no parameters yet: rank 0 initialises it first` })
    return shard
  }
  // A server that takes a lost one's place (a spare, or a replacement started then) joins workers
  // whose code is optimized: its push path gets there sooner too, as a joining worker's step does.
  const tierUp = index < 0 || args.joining === true ? tierUpSooner() : undefined
  const optimizing = tierUp !== undefined ? ` (V8 optimizes after ${tierUp} calls)` : ""
  ctx.log.info(index < 0 ? `spare parameter server ready${optimizing}` : `parameter server ${index + 1}/${args.numServers} ready${optimizing}`)
  return {
    init: (body) => {
      const nextDecoder = new PushDecoder(body.compression as ResolvedCompressionConfig | undefined, body.params.length)
      const nextOptions: ShardServerOptions = { ...optionsOf(body), onUpdate }
      const next = new ShardServer(body.params, nextOptions)
      // A server made from a replica goes on with the workers at their steps (a step it applied already is dropped when pushed again).
      if (body.state) next.load(decodeMessage(body.state) as ShardServerState, { workers: body.keepApplied ? "regrouped" : "restart" })
      shard?.abort("re-initialised")
      if (body.index !== undefined) index = body.index
      if (body.successor !== undefined) successor = body.successor
      decoder = nextDecoder
      shard = next
      options = nextOptions
      compression = body.compression
      group = body.group ?? 0
      cpu0 = process.cpuUsage()
      pushes = 0
      seedReplica()
      return null
    },
    replicaInit: (body) => {
      const o = optionsOf({ ...body, numWorkers: Math.max(1, body.numWorkers) })
      const state = decodeMessage(body.state) as ShardServerState
      const r = new ShardServer(new Float32Array(state.params.length), o)
      r.load(state, { workers: "regrouped" })
      replica = { index: body.index, shard: r, options: o, compression: body.compression }
      return null
    },
    replicaUpdate: (body) => {
      // Updates of another shard than the replica's (a re-seed on its way) are not this replica's.
      if (replica?.index === body.index) replica.shard.replay(body.grad, body.learningRate, body.step)
      return null
    },
    handOver: async (body) => {
      if (!replica || replica.index !== body.index) {
        throw new ConfigError({ field: "ps-server.handOver", reason: `server ${index} keeps no replica of shard ${body.index}${replica ? ` (it keeps shard ${replica.index}'s)` : ""}` })
      }
      const st = replica.shard.state()
      await ctx.system.askPromise(
        ctx.system.ref(ServerProtocol, body.to),
        "init",
        {
          params: st.params,
          ...optionsBody({ ...replica.options, numWorkers: body.numWorkers, backupWorkers: Math.min(replica.options.backupWorkers, body.numWorkers - 1) }),
          state: encodeMessage(st),
          keepApplied: true,
          group: body.group,
          index: body.index,
          ...(body.successor !== undefined ? { successor: body.successor } : {}),
          ...(replica.compression !== undefined ? { compression: replica.compression } : {})
        },
        { timeoutMs: 30_000 }
      )
      ctx.log.info(`parameter server ${index + 1}/${args.numServers}: started ${body.to} from its replica of shard ${body.index} at version ${st.version}`)
      return null
    },
    replicateTo: (body) => {
      successor = body.to
      seedReplica()
      return null
    },
    regroup: (body) => {
      // Strategy auto's servers before it first moved to them: nothing to regroup (its move gives
      // them the group's size with the state).
      if (!shard) {
        group = body.group
        return null
      }
      const old = need("regroup")
      // Backup workers must be fewer than the workers: a group of n keeps at most n - 1.
      const backupWorkers = Math.min(options!.backupWorkers, body.numWorkers - 1)
      const next = new ShardServer(new Float32Array(old.length), { ...options!, numWorkers: body.numWorkers, backupWorkers })
      // The workers push their step in flight again (sync): a server that applied it already drops
      // it. (A worker killed between its pushes to two servers, or a lost server, leaves a step
      // applied on some servers only.)
      next.load(old.state(), { workers: "regrouped" })
      regrouped.add(old)
      old.abort("regrouped")
      shard = next
      options = { ...options!, numWorkers: body.numWorkers }
      group = body.group
      ctx.log.info(`parameter server ${index + 1}/${args.numServers}: regrouped for ${body.numWorkers} worker(s) at version ${next.version} (group ${body.group})`)
      return null
    },
    push: (body) => {
      const s = need("push")
      // A push sent by a worker of a group left behind (answered by nobody: its worker was paused).
      if ((body.group ?? 0) < group) return null
      pushes++
      const worker = ctx.system.ref(WorkerProtocol, body.replyTo)
      const answer = (reply: PsParams) =>
        void ctx.system.tellPromise(worker, "psParams", body.group !== undefined ? { ...reply, group: body.group } : reply).catch((e: unknown) => ctx.log.warn(`could not answer rank ${body.worker}: ${String(e)}`))
      const refuse = (e: unknown) =>
        answer({ server: index, step: body.step, params: new Float32Array(0), version: -1, staleness: 0, dropped: false, error: e instanceof Error ? e.message : String(e) })
      let grad: Float32Array
      try {
        // The decoder's buffer: the shard adds or applies it before push() returns and keeps none of it.
        grad = decoder ? decoder.decode(body) : body.grad
      } catch (e) {
        refuse(e)
        return null
      }
      s.push(body.worker, body.step, body.basedOn, grad, body.weight, body.learningRate, body.stepWeight).then(
        (r) =>
          answer({ server: index, step: body.step, params: r.params, version: r.version, staleness: r.staleness, dropped: r.dropped, cpuMsPerPush: cpuMsPerPush() }),
        // A push dropped by a regroup is answered by nobody: its worker was paused.
        (e: unknown) => (regrouped.has(s) ? undefined : refuse(e))
      )
      return null
    },
    state: () => encodeMessage(need("state").state()),
    pull: () => need("pull").pull(),
    finish: (body) => {
      if ((body.group ?? 0) < group) return null
      shard?.finish(body.worker)
      return null
    },
    away: (body) => {
      if ((body.group ?? 0) < group) return null
      shard?.away(body.worker)
      return null
    },
    stats: () => ({ ...(shard?.stats() ?? {}) }) as Record<string, number>
  }
})
