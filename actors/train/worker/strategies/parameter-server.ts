// Strategy "parameter-server": the servers (ps-server.ts, one process per shard of the flat
// parameters) hold the parameters and the optimizer state; every step a worker pushes its gradient
// and pulls the fresh parameters (ps-client.ts), in parameterServer.mode "sync" (with backup workers:
// the slowest gradients of a step are dropped), "async" or "ssp" (bounded staleness). Strategy
// "auto" runs the same worker side in the mode it moves to (backup, ssp, async).
import { ConfigError } from "../../../../core/errors.ts"
import { decodeMessage, encodeMessage } from "../../../../core/wire.ts"
import type { StrategyName } from "../../../../scheduler/strategy-choice.ts"
import type { ParameterServers } from "../gradient-sync.ts"
import { flatOptimizerSpecOf, type FlatOptimizerSpec } from "../../common/optim/flat-optimizers.ts"
import { checkPushCompression } from "../../common/ps-push-codec.ts"
import { defineStrategy, type Exchanged, type StepExchange, type StrategyConfigInput, type StrategyHost, type StrategyWorker } from "./strategy.ts"

/** The workers' optimizer as the servers run it. */
export const psSpecOf = (host: StrategyHost): FlatOptimizerSpec => flatOptimizerSpecOf(host.optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0])

/** Strategy "auto" on the servers: the mode it runs, and the group step and step counter when training moved there (their version was 0 then). */
export interface AutoMode {
  readonly mode: Extract<StrategyName, "backup" | "ssp" | "async">
  readonly globalBase: number
  readonly syncBase: number
}

/** A survivor's group-step count in its state (a joiner goes on from it: ParameterServerWorker.adopted). */
export const PS_COUNT_FILE = "ps-count.msgpack"

/** A rank's last answer from the servers: their version, the group step it made, and how each version counted then (perUpdate / p of a group step). */
interface Seen {
  readonly auto: AutoMode | undefined
  readonly version: number
  readonly global: number
  readonly perUpdate: number
  readonly p: number
}

/** Seen as a survivor's state carries it: strategy auto's mode and base say which count it is. */
interface SeenState {
  readonly version: number
  readonly global: number
  readonly perUpdate: number
  readonly p: number
  readonly mode: AutoMode["mode"] | undefined
  readonly base: number | undefined
}

export class ParameterServerWorker implements StrategyWorker {
  readonly name: string = "parameter-server"
  readonly replicated = false
  readonly ps: ParameterServers
  readonly spec: FlatOptimizerSpec
  readonly #host: StrategyHost
  /** Strategy "auto": the mode it moved to; undefined: the configured mode, for the whole run. */
  auto: AutoMode | undefined
  /** Staleness counters of this rank's steps. */
  readonly #staleness = { sum: 0, max: 0, steps: 0, dropped: 0 }
  /** The busiest server's CPU ms per push, as the servers last reported it (strategy "auto" prices them by it). */
  serverMs: number | undefined
  /** An async or SSP push is in flight (stepApplied). */
  #sending = false

  constructor(host: StrategyHost) {
    if ((host.sync.zeroStage ?? 0) > 0) {
      throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: "the parameter servers hold the optimizer state already: use zeroStage 0 with strategy \"parameter-server\"" })
    }
    this.#host = host
    this.ps = host.sync.ps!
    this.spec = psSpecOf(host)
  }

  get viaServers(): boolean {
    return true
  }

  /**
   * Rank 0 gives the servers the (broadcast) weights and the optimizer; every rank waits until they
   * have them. A rank joining a regrouped group does nothing here: the servers run already, and it
   * takes their parameters when it joins (adopted()).
   */
  async init(files?: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const h = this.#host
    const ps = this.ps
    if (h.sync.recovery?.joinTarget !== undefined) return
    if (h.sync.rank === 0) {
      const restored = files ? await ps.restore(files, h.parameterCount, this.spec, h.sync.worldSize, h.weightDecay) : false
      if (!restored) await ps.init(await h.readFlatParams(), this.spec, h.sync.worldSize, h.weightDecay)
    }
    // A barrier: nobody pushes (or pulls) before rank 0 set the servers up.
    await h.sync.sum(new Float32Array(1))
    if (files) h.assignFlat(await ps.pull(h.parameterCount))
  }

  inPlace(): boolean {
    return false
  }

  /** The servers apply the gradient (as the mode says) and hand back their fresh parameters. */
  async exchange(flat: Float32Array, x: StepExchange): Promise<Exchanged> {
    const h = this.#host
    const ps = this.ps
    const auto = this.auto
    const t1 = performance.now()
    // Under "auto" a mode runs exactly as when chosen by hand (the same learning rate per update).
    const p = h.sync.worldSize
    const oneByOne = this.#oneByOne
    // A regroup under the push (recovery from peers): sync servers dropped the step's gradients, so
    // it is pushed again in the new group (computed again, as the all-reduce does); async and SSP
    // servers applied it on arrival, so the step is done and this rank took a survivor's state.
    // Async and SSP apply each push as one optimizer step of its own: a rank whose batch adaptive
    // batching made larger or smaller than its equal share (dp.fit's global batch over the ranks)
    // pushes its gradient scaled by that ratio, so a push moves the parameters in proportion to the
    // samples it carries (a one-row batch's noisy gradient no longer takes a full step); with equal
    // batches the factor is 1. Sync weights the step's mean by samples already, and its quota counts
    // them (stepWeight).
    const share = x.globalSamples !== undefined && oneByOne ? (x.samples * p) / x.globalSamples : 1
    const scaled = (g: Float32Array): Float32Array => {
      if (share !== 1) for (let i = 0; i < g.length; i++) g[i]! *= share
      return g
    }
    let grad = scaled(flat)
    let sentAt: number | undefined
    let r: Awaited<ReturnType<ParameterServers["pushPull"]>>
    // The push is numbered when it is sent: a regroup that parked this rank before it may have
    // moved its step counter (it took the furthest survivor's state, and sends this push as that
    // survivor's step in flight: group-session.ts #rejoin), and the servers' SSP bound compares it
    // with the others' numbers.
    const numberedAt = h.step
    const push = () => {
      // In flight from here: a regroup now finds the step made (applied as the servers receive it).
      this.#sending = oneByOne
      return ps.pushPull(h.sync.rank, x.step + (h.step - numberedAt), grad, x.samples, h.learningRate, oneByOne ? undefined : x.globalSamples)
    }
    try {
      for (;;) {
        const got = h.sync.serverOperation ? await h.sync.serverOperation(push, oneByOne) : await push()
        if (got === "adopted") return { adopted: true, onServers: true, commMs: performance.now() - t1 }
        if (got !== "again") {
          r = got
          break
        }
        grad = scaled(await x.recompute())
        sentAt = performance.now()
      }
    } finally {
      this.#sending = false
    }
    if (r.serverMs !== undefined) this.serverMs = r.serverMs
    // The group's progress from the servers' version; under "auto" with backup workers outside
    // dp.fit() a rank whose gradient came late goes on at the step the servers collect, not
    // behind it. Inside dp.fit() every rank pushes every step of its own (decisions come at the
    // same step count on every rank, and the fast ones wait there for a step only the slow one
    // can still complete).
    // (A group regrouped below its backup workers + 1 keeps at most p - 1 of them: ps-server.ts.)
    // A version counts perUpdate / p of a group step at the group's size when it was made: after a
    // regroup (another p) the count goes on from this rank's group step at its first answer, where
    // counting every version at the new size had put a shrunk group's ranks ahead of the versions
    // made once it grew back (auto's decision clock then stood still until the versions caught up,
    // and a loop could end before its decision round).
    const perUpdate = this.#perUpdate(p)
    if (this.#countPending) {
      this.#countFrom = { auto, version: r.version, global: h.global }
      this.#countPending = false
    }
    // Without a regroup since the servers started (or auto moved there), from their version 0.
    const from = this.#countFrom !== undefined && this.#countFrom.auto === auto ? this.#countFrom : { version: 0, global: auto?.globalBase ?? 0 }
    h.global = Math.max(h.global, from.global + ((r.version - from.version) * perUpdate) / p)
    this.#seen = { auto, version: r.version, global: h.global, perUpdate, p }
    if (auto?.mode === "backup" && !h.inFit) h.step = Math.max(h.step, auto.syncBase + r.version)
    const commMs = performance.now() - t1
    const st = this.#staleness
    st.sum += r.staleness
    st.max = Math.max(st.max, r.staleness)
    st.steps++
    if (r.dropped) st.dropped++
    return { commMs, onServers: true, ...(sentAt !== undefined ? { sentAt } : {}), apply: () => h.assignFlat(r.params) }
  }

  /** In an async or SSP push: the servers apply the gradient as it arrives, so a regroup counts the step as done (DataParallelModel.snapshot). */
  get stepApplied(): boolean {
    return this.#sending
  }

  /** After a regroup: the servers' parameters, the newest there are (async servers went on applying the others' pushes), and the group step at their version. */
  async adopted(files?: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const h = this.#host
    h.assignFlat(await this.ps.pull(h.parameterCount))
    // The group step at the servers' version now. A survivor goes on from its last answer: the
    // versions since then were made by the old group and count at its size. The taken state's step
    // counter alone (DataParallelModel.adopt) is the furthest survivor's own steps: a survivor that
    // ran ahead of the others (async ranks part by up to an epoch) put every rank's count ahead,
    // which then stood still until the versions caught up (a rank's count gained 2 over an epoch of
    // 15 steps at 3 workers). A joiner goes on from the count in the state it took (snapshotFiles),
    // made when the survivors stopped for the regroup: the versions since then (the new group's,
    // made while the joiner caught up) count at the new size; from that state's step counter it
    // had lost them (9 group steps behind the survivors).
    const version = this.ps.version
    const own = this.#seen?.auto === this.auto ? this.#seen : undefined
    const taken = own === undefined ? this.#seenIn(files) : undefined
    const p = h.sync.worldSize
    const from = own ?? (taken ? { ...taken, perUpdate: this.#perUpdate(p), p } : undefined)
    if (from !== undefined && version >= from.version) {
      h.global = from.global + ((version - from.version) * from.perUpdate) / from.p
      this.#countFrom = { auto: this.auto, version, global: h.global }
      this.#countPending = false
    } else this.#countPending = true
  }

  /** How many gradients a version of the servers holds in a group of `p` (a version counts perUpdate / p of a group step). */
  #perUpdate(p: number): number {
    return this.#oneByOne ? 1 : p - Math.min(p - 1, this.auto ? 1 : this.ps.backupWorkers)
  }

  /** Whether the servers apply each push on arrival (async, SSP) rather than a step's quota of them (sync). */
  get #oneByOne(): boolean {
    const auto = this.auto
    return auto ? auto.mode === "ssp" || auto.mode === "async" : this.ps.mode !== "sync"
  }

  /** What a survivor's state says of its count (snapshotFiles), where it counted in this rank's mode. */
  #seenIn(files: Readonly<Record<string, Uint8Array>> | undefined): Seen | undefined {
    const f = files?.[PS_COUNT_FILE]
    if (f === undefined) return undefined
    const c = decodeMessage(f) as SeenState
    return c.mode === this.auto?.mode && c.base === this.auto?.globalBase ? { auto: this.auto, version: c.version, global: c.global, perUpdate: c.perUpdate, p: c.p } : undefined
  }

  /** A survivor's count, for a joiner taking its state (adopted). */
  snapshotFiles(): Record<string, Uint8Array> {
    const seen = this.#seen
    if (seen === undefined || seen.auto !== this.auto) return {}
    const state: SeenState = { version: seen.version, global: seen.global, perUpdate: seen.perUpdate, p: seen.p, mode: seen.auto?.mode, base: seen.auto?.globalBase }
    return { [PS_COUNT_FILE]: encodeMessage(state) }
  }

  /** Where the group step is counted from since the last regroup (exchange), for the mode `auto` (the object: a move starts anew). */
  #countFrom: { readonly auto: AutoMode | undefined; readonly version: number; readonly global: number } | undefined
  /** A regroup was adopted: the next answer starts #countFrom. */
  #countPending = false
  /** This rank's last answer: the servers' version, the group step it made, and how each version counted then (exchange). */
  #seen: Seen | undefined

  /** Tells the servers this rank's loop ended (sync and ssp steps stop waiting for it). */
  async finish(): Promise<void> {
    await this.ps.finish(this.#host.sync.rank)
  }

  /** Tells the servers this rank is away until its next push (sync steps do not wait for it meanwhile). */
  async away(): Promise<void> {
    await this.ps.away(this.#host.sync.rank)
  }

  /** The servers hold the parameters and the optimizer state: one file per server (asked again of the new servers after a lost one). */
  async checkpointFiles(): Promise<Record<string, Uint8Array>> {
    const request = this.#host.sync.serverRequest
    return request ? request(() => this.ps.stateFiles()) : this.ps.stateFiles()
  }

  /** Rank 0 sets the servers up from the checkpoint (from the restored weights when it has no server state); every rank continues from the servers' parameters. */
  async restore(files: Readonly<Record<string, Uint8Array>>): Promise<boolean> {
    await this.init(files)
    // The group step goes on from the checkpoint's (DataParallelModel.restoreOptimizer set it) at the
    // servers' version now: counted from version 0 instead, it stood still until the versions caught
    // up with it (every version again on servers set up fresh from the weights, at version 0).
    this.#countFrom = { auto: this.auto, version: this.ps.version, global: this.#host.global }
    this.#countPending = false
    return true
  }

  /**
   * Updates between the parameters a gradient was computed on and its application (mean and max
   * over this rank's steps so far), gradients dropped (backup workers), and the gradient bytes of
   * this rank's last step's pushes (every server's) and as dense fp32: ReducerStats' wireBytes /
   * denseBytes (ctx.communicationStats()) for the pushes.
   */
  metrics(): Record<string, number> {
    const st = this.#staleness
    const pushed = this.ps.pushStats
    return {
      "ps/staleness": st.sum / Math.max(1, st.steps),
      "ps/staleness_max": st.max,
      "ps/dropped": st.dropped,
      ...(pushed && pushed.steps > 0 ? { "ps/wire_bytes": pushed.wireBytes, "ps/dense_bytes": pushed.denseBytes } : {})
    }
  }
}

/** The servers hold the optimizer state (no ZeRO), and pushes carry a codec's byte message of a flat range (ps-push-codec.ts). */
export const checkServersConfig = ({ strategy, zeroStage, compression }: StrategyConfigInput): void => {
  if (zeroStage > 0) throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: "the parameter servers hold the optimizer state already: use zeroStage 0 with strategy \"parameter-server\"" })
  // PowerSGD and "auto" cannot be pushed.
  checkPushCompression(compression as Parameters<typeof checkPushCompression>[0], strategy)
}

/** The bench's configuration of the servers in one mode (ssp with staleness 2). */
const psBench = (servers: number, mode: "sync" | "async" | "ssp", extra: Record<string, unknown> = {}): Record<string, unknown> => ({
  strategy: "parameter-server",
  parameterServer: { numServers: servers, mode, ...(mode === "ssp" ? { staleness: 2 } : {}) },
  ...extra
})

export const parameterServer = defineStrategy({
  name: "parameter-server",
  hint: "parameter servers hold the parameters and the optimizer; workers push gradients and pull parameters (modes sync with backup workers, async, ssp)",
  servers: true,
  validate: checkServersConfig,
  peersCannot: () => undefined,
  autoCandidates: ["backup", "ssp", "async"],
  benchVariants: [
    { name: "PS sync", collective: (s) => psBench(s, "sync") },
    { name: "PS sync, 1 backup", collective: (s) => psBench(s, "sync", { backupWorkers: 1 }) },
    { name: "PS async", collective: (s) => psBench(s, "async"), accuracyTarget: true },
    { name: "PS SSP (s=2)", collective: (s) => psBench(s, "ssp"), accuracyTarget: true }
  ],
  create: (host) => new ParameterServerWorker(host)
})
