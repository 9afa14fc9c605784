// A worker's side of the parameter-server strategy: the flat parameter vector cut into one
// contiguous range per server (optim/zero.ts's equal segments), a gradient pushed to every server
// at once (one tell each, the range's view: copied once, into the message) and the servers'
// fresh ranges gathered into one buffer, with a deadline on every wait. With a codec
// (collectiveConfig.compression) each range goes as the codec's message with an error-feedback
// residual per server range (ps-push-codec.ts). Rank 0 initialises the
// servers and saves and restores their state for checkpoints (one file per server, re-sharded to
// another number of servers on restore).
import { ConfigError } from "../../../core/errors.ts"
import type { ResolvedCompressionConfig } from "../../../collectives/compression/config.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import type { ActorSystem } from "../../runtime/system.ts"
import { ServerProtocol, type PsParams } from "../common/train-protocol.ts"
import { gatherRange, shardLayout, type ShardLayout } from "../common/optim/zero.ts"
import type { FlatOptimizerSpec, FlatOptimizerState } from "../common/optim/flat-optimizers.ts"
import type { PsMode, ShardServerState } from "../common/ps-state.ts"
import { PushEncoder, type PushStats } from "../common/ps-push-codec.ts"

export interface PsClientOptions {
  readonly system: ActorSystem
  /** Actor names of the servers, in shard order. */
  readonly servers: ReadonlyArray<string>
  /** This worker's actor name (where the servers tell the parameters). */
  readonly self: string
  readonly mode: PsMode
  readonly staleness: number
  readonly backupWorkers: number
  /** Deadline of every wait for a server. */
  readonly timeoutMs: number
  /** Gradients travel as binary16 (collectiveConfig.wireDtype "float16"); the servers accumulate in fp32. */
  readonly halfWire?: boolean
  /** collectiveConfig.compression: a codec for the pushes (absent or "none": uncompressed); it wins over halfWire. */
  readonly compression?: ResolvedCompressionConfig
}

/** A push-pull's outcome over all servers. */
export interface PushPull {
  /** The fresh flat parameters (a buffer the client reuses: valid until the next pushPull). */
  readonly params: Float32Array
  /** Updates applied since the parameters the gradient was computed on, the mean over servers. */
  readonly staleness: number
  /** Whether a server dropped this gradient (backup workers: it came after the step's quota). */
  readonly dropped: boolean
  /** The servers' version after it (updates applied), the least over the servers. */
  readonly version: number
  /** The busiest server's CPU ms per push (undefined: not reported). */
  readonly serverMs: number | undefined
}

/** Raised when a server does not answer in time or refuses a gradient. */
export class ParameterServerError extends Error {
  override readonly name = "ParameterServerError"
}

export const psShardFile = (k: number, s: number): string => `ps.shard-${k}-of-${s}.msgpack`
const PS_FILE = /^ps\.shard-(\d+)-of-(\d+)\.msgpack$/

interface Pending {
  readonly resolve: (m: PsParams) => void
  readonly reject: (e: Error) => void
}

export class PsClient {
  readonly options: PsClientOptions
  /**
   * The worker's group (its placement's generation), sent with every push: after a regroup the
   * servers drop pushes of an earlier group, and answers are matched to the group that pushed.
   */
  group = 0
  #layouts: ShardLayout[] = []
  #versions: number[] = []
  #params: Float32Array | undefined
  /** Requests beside the pushes in flight (stateFiles), which interrupt() fails. */
  readonly #asks = new Set<(e: Error) => void>()
  /** Answers awaited, by server then step. */
  readonly #pending = new Map<string, Pending>()
  #servers: string[]
  /** Each server range's payload: the codec's message and residual, binary16 bits, or the range itself. */
  readonly #encoder: PushEncoder

  constructor(options: PsClientOptions) {
    if (options.servers.length < 1) throw new ConfigError({ field: "collectiveConfig.parameterServer.numServers", reason: "needs at least one server" })
    this.options = options
    this.#servers = [...options.servers]
    this.#encoder = new PushEncoder({
      numServers: options.servers.length,
      halfWire: options.halfWire === true,
      ...(options.compression !== undefined ? { compression: options.compression } : {})
    })
  }

  /** Gradient bytes pushed: the last step's and the totals (ReducerStats' names). */
  get pushStats(): PushStats {
    return this.#encoder.stats
  }

  /** This rank's error-feedback residuals of its pushes, per server range (empty without a codec that keeps them). */
  residuals(): Record<string, Float32Array> {
    return this.#encoder.state()
  }

  /** Takes a checkpoint's residuals (those of this number of servers); returns how many were taken. */
  restoreResiduals(state: Readonly<Record<string, ArrayLike<number>>>): number {
    return this.#encoder.restore(state)
  }

  /** The servers' version at this rank's last pull or push answer, the least over the servers (0 before either). */
  get version(): number {
    return this.#versions.length === 0 ? 0 : Math.min(...this.#versions)
  }

  get numServers(): number {
    return this.options.servers.length
  }

  get mode(): PsMode {
    return this.options.mode
  }

  get backupWorkers(): number {
    return this.options.backupWorkers
  }

  #ref(k: number) {
    return this.options.system.ref(ServerProtocol, this.#servers[k]!)
  }

  /** After a lost server was replaced (the regroup's placement names the servers): push to these from now on. */
  useServers(names: ReadonlyArray<string>): void {
    if (names.length !== this.#servers.length) {
      throw new ConfigError({ field: "placement.servers", reason: `a regroup named ${names.length} parameter servers, this worker has ${this.#servers.length}: the number of servers stays for a run` })
    }
    this.#servers = [...names]
  }

  /** The servers' ranges of an n-element vector (every worker computes the same). */
  layout(n: number): ReadonlyArray<ShardLayout> {
    if (this.#layouts[0]?.total !== n) {
      this.#layouts = this.#servers.map((_, k) => shardLayout(n, this.numServers, k))
      this.#versions = this.#layouts.map(() => 0)
    }
    return this.#layouts
  }

  /**
   * Rank 0: gives every server its range of `flat` and the optimizer (or, with `states`, a
   * checkpoint's state per server); `as` overrides the mode (strategy "auto" switches between them).
   */
  async init(
    flat: Float32Array,
    spec: FlatOptimizerSpec,
    numWorkers: number,
    weightDecay: number,
    states?: ReadonlyArray<Uint8Array>,
    as?: { readonly mode: PsMode; readonly backupWorkers: number }
  ): Promise<void> {
    const layouts = this.layout(flat.length)
    await Promise.all(
      layouts.map((l, k) =>
        this.options.system.askPromise(
          this.#ref(k),
          "init",
          {
            params: flat.subarray(l.start, l.end),
            spec: spec as unknown as Record<string, unknown>,
            numWorkers,
            mode: as?.mode ?? this.options.mode,
            staleness: this.options.staleness,
            backupWorkers: as?.backupWorkers ?? this.options.backupWorkers,
            weightDecay,
            ...(states ? { state: states[k]! } : {}),
            group: this.group,
            ...(this.#encoder.codec && this.options.compression !== undefined ? { compression: this.options.compression } : {})
          },
          { timeoutMs: this.options.timeoutMs }
        )
      )
    )
  }

  /** The servers' current parameters, into a flat buffer (after an init or a restore). */
  async pull(n: number): Promise<Float32Array> {
    const layouts = this.layout(n)
    const out = (this.#params ??= new Float32Array(n))
    await Promise.all(
      layouts.map(async (l, k) => {
        const r = await this.options.system.askPromise(this.#ref(k), "pull", null, { timeoutMs: this.options.timeoutMs })
        out.set(r.params, l.start)
        this.#versions[k] = r.version
      })
    )
    return out
  }

  /** A server's answer to a push (WorkerProtocol.psParams). */
  onParams(m: PsParams): void {
    const key = `${m.group ?? 0}/${m.server}/${m.step}`
    const p = this.#pending.get(key)
    if (!p) return
    this.#pending.delete(key)
    if (m.error !== undefined) p.reject(new ParameterServerError(`parameter server ${m.server} refused rank's gradient of step ${m.step}: ${m.error}`))
    else p.resolve(m)
  }

  /**
   * Pushes this step's flat gradient (weighted by `weight` samples; `stepWeight`: the step's samples
   * over every worker, when known) and gathers the fresh parameters.
   */
  async pushPull(worker: number, step: number, grad: Float32Array, weight: number, learningRate: number | undefined, stepWeight?: number): Promise<PushPull> {
    const layouts = this.layout(grad.length)
    const out = (this.#params ??= new Float32Array(grad.length))
    let staleness = 0
    let dropped = false
    let version = Number.POSITIVE_INFINITY
    let serverMs: number | undefined
    const encoder = this.#encoder
    const group = this.group
    const pushed = Promise.all(
      layouts.map(async (l, k) => {
        const answer = new Promise<PsParams>((resolve, reject) => {
          const key = `${group}/${k}/${step}`
          const timer = setTimeout(() => {
            this.#pending.delete(key)
            reject(new ParameterServerError(`parameter server ${k} (${this.#servers[k]}) did not answer step ${step} within ${this.options.timeoutMs} ms`))
          }, this.options.timeoutMs)
          this.#pending.set(key, {
            resolve: (m) => {
              clearTimeout(timer)
              resolve(m)
            },
            reject: (e) => {
              clearTimeout(timer)
              reject(e)
            }
          })
        })
        await this.options.system.tellPromise(this.#ref(k), "push", {
          worker,
          replyTo: this.options.self,
          step,
          basedOn: this.#versions[k]!,
          // encoded before the tell (synchronously, server by server); its buffers are reused at
          // this range's next push, which comes after the server answered this one
          ...encoder.encode(k, grad.subarray(l.start, l.end), { rank: worker, step }),
          weight,
          ...(stepWeight !== undefined ? { stepWeight } : {}),
          ...(learningRate !== undefined ? { learningRate } : {}),
          group
        })
        const m = await answer
        out.set(m.params, l.start)
        this.#versions[k] = m.version
        version = Math.min(version, m.version)
        if (m.cpuMsPerPush !== undefined) serverMs = Math.max(serverMs ?? 0, m.cpuMsPerPush)
        staleness += m.staleness
        dropped ||= m.dropped
      })
    )
    encoder.endStep()
    await pushed
    return { params: out, staleness: staleness / layouts.length, dropped, version, serverMs }
  }

  /** Rank 0, for a checkpoint: every server's state, one file each (interrupt() fails it at once). */
  async stateFiles(): Promise<Record<string, Uint8Array>> {
    const files: Record<string, Uint8Array> = {}
    let stop: ((e: Error) => void) | undefined
    const interrupted = new Promise<never>((_, reject) => (stop = reject))
    this.#asks.add(stop!)
    try {
      await Promise.race([
        interrupted,
        Promise.all(
          this.#servers.map(async (_, k) => {
            files[psShardFile(k, this.numServers)] = await this.options.system.askPromise(this.#ref(k), "state", null, { timeoutMs: this.options.timeoutMs })
          })
        )
      ])
    } finally {
      this.#asks.delete(stop!)
    }
    return files
  }

  /**
   * Rank 0, on a restore: the servers' states from a checkpoint's files, re-cut when it was saved
   * with another number of servers (params and optimizer slots by range; the version is the
   * newest, worker clocks start again).
   */
  async restore(files: Readonly<Record<string, Uint8Array>>, n: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number): Promise<boolean> {
    const saved = psStatesOf(files)
    if (!saved) return false
    const layouts = this.layout(n)
    const states = layouts.map((l) => encodeMessage(recut(saved, l)))
    const flat = new Float32Array(n)
    for (const { range, state } of saved) flat.set(state.params, range[0])
    await this.init(flat, spec, numWorkers, weightDecay, states)
    return true
  }

  /**
   * Rank 0, when training switches to the servers (strategy "auto"): their ranges of the whole
   * parameters and optimizer state (what every rank held until now), in `mode`.
   */
  async takeOver(flat: Float32Array, optimizer: FlatOptimizerState, learningRate: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number, as: { readonly mode: PsMode; readonly backupWorkers: number }): Promise<void> {
    const whole: ShardServerState = { params: flat, version: 0, learningRate, optimizer, clocks: [], lastAppliedStep: -1 }
    const saved = [{ range: [0, flat.length] as const, state: whole }]
    const states = this.layout(flat.length).map((l) => encodeMessage(recut(saved, l)))
    await this.init(flat, spec, numWorkers, weightDecay, states, as)
  }

  /** The servers' whole state (parameters and optimizer state over the flat vector), for switching back to all-reduce. */
  async wholeState(n: number): Promise<{ readonly params: Float32Array; readonly optimizer: FlatOptimizerState }> {
    return psWholeState(await this.stateFiles(), n)
  }

  /** This worker's loop ended: the servers stop waiting for it. */
  finish(worker: number): Promise<void> {
    return this.#tellEvery("finish", worker)
  }

  /** This worker is away until its next push (in a collective outside the servers): sync steps do not wait for it meanwhile. */
  away(worker: number): Promise<void> {
    return this.#tellEvery("away", worker)
  }

  /** Tells every server `what` of this worker in this group (a server that does not answer is passed over). */
  async #tellEvery(what: "finish" | "away", worker: number): Promise<void> {
    await Promise.all(this.#servers.map((_, k) => this.options.system.tellPromise(this.#ref(k), what, { worker, group: this.group }).catch(() => {})))
  }

  /**
   * The group is being regrouped (the worker was asked to pause): every answer awaited fails now
   * (a sync step waiting for a lost worker's gradient would wait until its deadline; a state asked
   * of a lost server, until its ask's). The servers
   * drop those pushes when the driver regroups them.
   */
  interrupt(): void {
    this.abort("the group is being regrouped")
  }

  /** Rejects every wait (shutdown). */
  abort(reason: string): void {
    for (const p of this.#pending.values()) p.reject(new ParameterServerError(reason))
    this.#pending.clear()
    for (const stop of this.#asks) stop(new ParameterServerError(reason))
    this.#asks.clear()
  }
}

/** Whether a checkpoint holds parameter-server state. */
export const hasPsFiles = (files: Readonly<Record<string, unknown>>): boolean => Object.keys(files).some((f) => PS_FILE.test(f))

/** A checkpoint's parameter-server state as the whole flat parameters and optimizer state. */
export const psWholeState = (files: Readonly<Record<string, Uint8Array>>, n: number): { readonly params: Float32Array; readonly optimizer: FlatOptimizerState } => {
  const saved = psStatesOf(files)
  if (!saved) throw new ConfigError({ field: "checkpoint", reason: "it holds no parameter-server state" })
  const whole = recut(saved, shardLayout(n, 1, 0))
  return { params: whole.params, optimizer: whole.optimizer }
}

/** The parameter servers' states in a checkpoint, each with its range, or undefined when it has none. */
const psStatesOf = (files: Readonly<Record<string, Uint8Array>>): Array<{ range: readonly [number, number]; state: ShardServerState }> | undefined => {
  const names = Object.keys(files).filter((f) => PS_FILE.test(f))
  if (names.length === 0) return undefined
  const s = Number(PS_FILE.exec(names[0]!)![2])
  const out: Array<{ range: readonly [number, number]; state: ShardServerState }> = []
  let start = 0
  for (let k = 0; k < s; k++) {
    const bytes = files[psShardFile(k, s)]
    if (!bytes) throw new ConfigError({ field: "checkpoint", reason: `its parameter-server state is incomplete: ${psShardFile(k, s)} is missing (of ${s})` })
    const state = decodeMessage(bytes) as ShardServerState
    out.push({ range: [start, start + state.params.length], state })
    start += state.params.length
  }
  return out
}

/** The state of range `l` cut from saved servers' states (params and optimizer slots copied by range). */
const recut = (saved: ReadonlyArray<{ range: readonly [number, number]; state: ShardServerState }>, l: ShardLayout): ShardServerState => {
  const first = saved[0]!.state
  const take = (get: (st: ShardServerState) => Float32Array): Float32Array =>
    gatherRange(saved.map(({ range, state }) => ({ start: range[0], end: range[1], data: get(state) })), l.start, l.end)
  const slots: Record<string, Float32Array> = {}
  for (const name of Object.keys(first.optimizer.slots)) slots[name] = take((st) => st.optimizer.slots[name]!)
  return {
    ...first,
    params: take((st) => st.params),
    version: Math.max(...saved.map((x) => x.state.version)),
    optimizer: { ...first.optimizer, slots }
  } as ShardServerState
}
