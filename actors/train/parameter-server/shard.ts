// One parameter-server shard (collectiveConfig.strategy "parameter-server"): a contiguous range of
// the flat parameter vector, the optimizer state of that range (a flat optimizer, the workers' own
// kind and hyper-parameters), and the rules for when a worker that pushed a gradient may go on.
// Pure logic: no I/O, no timers; the only clock is the injectable `now()` used for wait statistics.
// ps-server.ts wraps it in an actor.
//
// Modes (numWorkers N, backupWorkers b, staleness s):
//   sync   Gradients of step t are summed into one buffer, weighted by their sample counts. When
//          the step has its quota — the first N - b gradients of the step, or fewer when workers
//          have finished and every worker still running has pushed it — the update is the weighted
//          mean sum w_i g_i / sum w_i, one optimizer step, and every push of the step resolves with
//          the same parameters and version. A gradient of a step already applied (a backup
//          worker's late one, or one of an older step) is dropped: it resolves at once with the
//          current parameters and dropped: true. Only one step collects at a time: a worker cannot
//          push step t + 1 while step t still waits for gradients (its own push of t would not
//          have resolved), so a push of a later step than the collecting one is an error rather
//          than a second barrier that could deadlock with the first. When the pushes say how many
//          samples the whole step has (`stepWeight`: dp.fit's global batch, split unequally by
//          adaptive batching), the quota is also in samples: the first gradients holding at least
//          (N - b) / N of them. With equal batches that is the same quota; with unequal ones a small
//          batch's gradient that arrives first does not make the step on its own.
//   async  Each gradient is one optimizer step on its own (weight ignored), applied at once. A
//          step the worker pushed already is dropped (answered at once, dropped: true), not
//          refused: a push sent again (seen once in CI after a regroup) must not break the group.
//   ssp    As async, but the push resolves only once every running worker's clock (the steps it
//          has pushed: its last step + 1) is >= step + 1 - s, i.e. the pusher is at most s steps
//          ahead of the slowest. Clocks only rise; finished workers are not waited for.
//
// A worker may also be away for a while (away(): in a collective of its group outside the servers,
// such as strategy auto's decision rounds): until its next push a sync step does not wait for it,
// as for a finished one, so a worker still pushing does not wait for gradients that come only once
// it has joined that collective itself.
//
// Nothing waits forever: each waiting push resolves when its condition is met (finish() and away()
// re-check the conditions, since a finished or away worker no longer counts), or is rejected by
// abort(), after which every push is rejected at once.
//
// Copies: a pushed gradient is never kept (sync adds it into the step's buffer during push(); async
// and ssp step with it in place), so the caller may reuse it, or pass a view into a received
// message, as soon as push() returns. The step buffer is reused from step to step. The parameters
// handed out are one snapshot per version, made on first demand and shared by every result and
// pull() at that version: the server never writes it, and callers must not either.
import { ConfigError } from "../../../core/errors.ts"
import { createFlatOptimizer, type FlatOptimizer, type FlatOptimizerSpec, type FlatOptimizerState } from "../common/optim/flat-optimizers.ts"
import type { PsMode, ShardServerState } from "../common/ps-state.ts"

export type { PsMode, ShardServerState }


const MODES: readonly PsMode[] = ["sync", "async", "ssp"]

export interface ShardServerOptions {
  readonly mode: PsMode
  readonly numWorkers: number
  /** ssp: a worker more than this many steps ahead of the slowest waits. */
  readonly staleness: number
  /**
   * sync only: each step applies the first numWorkers - backupWorkers gradients to arrive and drops
   * the later ones of that step. Must be 0 in the other modes.
   */
  readonly backupWorkers: number
  /** The workers' optimizer, as flatOptimizerSpecOf reads it. */
  readonly spec: FlatOptimizerSpec
  /** Decoupled (AdamW-style) weight decay of every update; 0 or absent: none. */
  readonly weightDecay?: number
  /** Milliseconds, for the wait statistics only (default performance.now()). */
  readonly now?: () => number
  /**
   * Called with every update as it is applied, before any push it resolves is answered: the
   * gradient applied (sync: the step's weighted mean; async and ssp: the pushed gradient), the
   * learning rate it was applied with and its step. A replica of the shard (replay()) that takes
   * them in order stays bit for bit the same. The gradient is the shard's own buffer (or the
   * caller's): copy or encode it before returning.
   */
  readonly onUpdate?: (grad: Float32Array, learningRate: number, step: number) => void
}

export interface PushResult {
  /**
   * The shard's parameters to continue from: the snapshot at `version`, shared by every result and
   * pull() at that version and never written by the server afterwards (do not write it either).
   */
  readonly params: Float32Array
  /** The server's version (updates applied) those parameters are at. */
  readonly version: number
  /** How many updates were applied since the parameters this gradient was computed on (0 = fresh). */
  readonly staleness: number
  /** sync: whether this gradient was dropped (its step was already applied when it arrived). */
  readonly dropped: boolean
}


/** Counters since construction (load() keeps them). All numbers, so they can go out as a flat record. */
export interface ShardServerStats {
  /** Updates applied so far (the parameters' version). */
  readonly version: number
  /** Updates applied by this object (unlike version, not set by load()). */
  readonly updates: number
  /** Pushes taken (applied or dropped; not the ones rejected as bad input). */
  readonly received: number
  /** Gradients that went into an update. */
  readonly applied: number
  /** sync: gradients dropped (late for their step). */
  readonly dropped: number
  /** Over the applied gradients: the largest and the mean staleness. */
  readonly maxStaleness: number
  readonly meanStaleness: number
  /** Pushes that did not resolve at once (sync barrier or ssp bound), and the ms they waited in all. */
  readonly waits: number
  readonly waitMs: number
  /** Pushes waiting now. */
  readonly pending: number
  /** Workers that have finished. */
  readonly finished: number
}

/** Per worker: its clock, whether it finished, its waits and the ms it spent waiting. */
export interface ShardWorkerStats {
  readonly worker: number
  readonly clock: number
  readonly finished: boolean
  readonly waits: number
  readonly waitMs: number
}

/** The reason pending and later pushes are rejected with after abort(reason) (unless it is an Error). */
export class ShardAbortedError extends Error {
  override readonly name = "ShardAbortedError"
  readonly reason: unknown
  constructor(reason: unknown) {
    super(`the parameter-server shard was shut down${reason === undefined ? "" : `: ${String(reason)}`}`)
    this.reason = reason
  }
}

interface Waiter {
  readonly worker: number
  readonly step: number
  readonly basedOn: number
  /** ssp: fixed at push (applied then); sync: set when the step is applied. */
  staleness: number
  readonly since: number
  /** Still pending when push() returned. */
  waited: boolean
  readonly resolve: (r: PushResult) => void
  readonly reject: (e: unknown) => void
}

/** The sync step collecting gradients. */
interface SyncStep {
  readonly step: number
  /** sum of weight * gradient so far. */
  readonly sum: Float32Array
  weight: number
  readonly waiters: Waiter[]
  readonly taken: boolean[]
  learningRate: number | undefined
  /** The step's samples over every worker, when its pushes say (the quota is then in samples too). */
  stepWeight: number | undefined
}

const fmt = (v: unknown): string => (typeof v === "string" ? JSON.stringify(v) : ArrayBuffer.isView(v) ? `${v.constructor.name}(${(v as unknown as { length: number }).length})` : String(v))

const isCount = (v: unknown, min: number): v is number => typeof v === "number" && Number.isSafeInteger(v) && v >= min

const defaultNow = (): number => performance.now()

export class ShardServer {
  readonly mode: PsMode
  readonly numWorkers: number
  readonly staleness: number
  readonly backupWorkers: number
  /** Elements of this shard. */
  readonly length: number
  private readonly weightDecay: number
  private readonly optimizer: FlatOptimizer
  private readonly now: () => number
  private readonly onUpdate: ((grad: Float32Array, learningRate: number, step: number) => void) | undefined
  private readonly params: Float32Array
  private ver = 0
  private snap: Float32Array | null = null
  /** Per worker: the last step pushed (-1: none). */
  private readonly lastStep: number[]
  private readonly done: boolean[]
  /** Per worker: away (away()) until its next push. */
  private readonly gone: boolean[]
  private finishedCount = 0
  // sync
  private lastAppliedStep = -1
  private collecting: SyncStep | null = null
  private spare: Float32Array | null = null
  // ssp
  private sspWaiting: Waiter[] = []
  private aborted: { readonly error: unknown } | null = null
  // counters
  private updatesDone = 0
  private received = 0
  private applied = 0
  private dropped = 0
  private maxStale = 0
  private sumStale = 0
  private readonly waitsOf: number[]
  private readonly waitMsOf: number[]

  constructor(params: Float32Array, options: ShardServerOptions) {
    if (!(params instanceof Float32Array)) {
      throw new ConfigError({ field: "ps.params", reason: `the shard's initial parameters must be a Float32Array, got ${fmt(params)}` })
    }
    if (options === null || typeof options !== "object") {
      throw new ConfigError({ field: "ps", reason: `the shard options must be an object, got ${fmt(options)}` })
    }
    const { mode, numWorkers, staleness, backupWorkers } = options
    if (!(MODES as readonly unknown[]).includes(mode)) {
      throw new ConfigError({ field: "parameterServer.mode", reason: `must be one of ${MODES.join(", ")}; got ${fmt(mode)}` })
    }
    if (!isCount(numWorkers, 1)) {
      throw new ConfigError({ field: "ps.numWorkers", reason: `must be an integer >= 1, got ${fmt(numWorkers)}` })
    }
    if (!isCount(staleness, 0)) {
      throw new ConfigError({ field: "parameterServer.staleness", reason: `must be an integer >= 0, got ${fmt(staleness)}` })
    }
    if (!isCount(backupWorkers, 0)) {
      throw new ConfigError({ field: "backupWorkers", reason: `must be an integer >= 0, got ${fmt(backupWorkers)}` })
    }
    if (backupWorkers > 0 && mode !== "sync") {
      throw new ConfigError({
        field: "backupWorkers",
        reason: `backup workers only apply to parameterServer.mode "sync" (the ${mode} mode waits for no step quota); got ${backupWorkers} with mode "${mode}"`
      })
    }
    if (backupWorkers >= numWorkers) {
      throw new ConfigError({
        field: "backupWorkers",
        reason: `must be less than the number of workers (${numWorkers}): each step needs at least one gradient; got ${backupWorkers}`
      })
    }
    const wd = options.weightDecay ?? 0
    if (typeof wd !== "number" || !Number.isFinite(wd) || wd < 0) {
      throw new ConfigError({ field: "weightDecay", reason: `must be a finite number >= 0, got ${fmt(options.weightDecay)}` })
    }
    if (options.now !== undefined && typeof options.now !== "function") {
      throw new ConfigError({ field: "ps.now", reason: `must be a function returning milliseconds, got ${fmt(options.now)}` })
    }
    this.optimizer = createFlatOptimizer(options.spec, params.length)
    this.mode = mode
    this.numWorkers = numWorkers
    this.staleness = staleness
    this.backupWorkers = backupWorkers
    this.length = params.length
    this.weightDecay = wd
    this.now = options.now ?? defaultNow
    this.onUpdate = options.onUpdate
    this.params = params.slice()
    this.lastStep = new Array<number>(numWorkers).fill(-1)
    this.done = new Array<boolean>(numWorkers).fill(false)
    this.gone = new Array<boolean>(numWorkers).fill(false)
    this.waitsOf = new Array<number>(numWorkers).fill(0)
    this.waitMsOf = new Array<number>(numWorkers).fill(0)
  }

  /** Updates applied so far. */
  get version(): number {
    return this.ver
  }

  /**
   * A worker's gradient for this shard, computed on the parameters at version `basedOn` (the last
   * it received), at its step `step` (0, 1, 2, ...; rising), weighted by `weight` (its samples;
   * used by sync only, where it must be > 0). `learningRate`, when given, becomes the optimizer's
   * learning rate from this update on (sync: the last one given among the step's gradients).
   * `stepWeight` (sync): the step's samples over every worker, when the worker knows them; the
   * step's quota is then also (N - b) / N of them (see the modes above).
   * Resolves when the worker may go on (see the modes above); rejects with a ConfigError for bad
   * input (nothing is changed then), or with the abort reason.
   */
  push(worker: number, step: number, basedOn: number, grad: Float32Array, weight: number, learningRate?: number, stepWeight?: number): Promise<PushResult> {
    if (this.aborted) return Promise.reject(this.aborted.error)
    try {
      this.checkPush(worker, step, basedOn, grad, weight, learningRate, stepWeight)
    } catch (e) {
      return Promise.reject(e)
    }
    this.received++
    this.gone[worker] = false
    if (step <= this.lastStep[worker]!) {
      // Async / ssp: a step this worker pushed already (each push was applied on arrival) is
      // dropped, answered with the current parameters, as sync drops a late gradient: a push sent
      // again must not break the group. Sync refuses it (checkPush).
      this.dropped++
      return Promise.resolve({ params: this.snapshot(), version: this.ver, staleness: this.ver - basedOn, dropped: true })
    }
    this.lastStep[worker] = step
    let waiter: Waiter | undefined
    const promise = new Promise<PushResult>((resolve, reject) => {
      waiter = { worker, step, basedOn, staleness: 0, since: this.now(), waited: false, resolve, reject }
    })
    const w = waiter!
    try {
      if (this.mode === "sync") this.pushSync(w, grad, weight, learningRate, stepWeight)
      else this.pushApplied(w, grad, learningRate)
    } catch (e) {
      // Only an optimizer failure can land here (inputs were checked); pushSync has already
      // rejected the step's other waiters.
      w.reject(e)
      return promise
    }
    return promise
  }

  /** Current parameters (the shared snapshot, see PushResult.params) and version; no push. */
  pull(): { params: Float32Array; version: number } {
    return { params: this.snapshot(), version: this.ver }
  }

  /**
   * Worker `worker`'s loop ended: sync steps and ssp bounds stop waiting for it (pending pushes
   * whose condition now holds resolve). Idempotent. A finished worker cannot push again.
   */
  finish(worker: number): void {
    this.checkWorker(worker)
    if (this.done[worker]) return
    this.done[worker] = true
    this.finishedCount++
    if (this.aborted) return
    if (this.mode === "sync") this.applySyncIfReady()
    else if (this.mode === "ssp") this.releaseSsp()
  }

  /**
   * Worker `worker` is away until its next push (in a collective of its group outside the servers):
   * a sync step collecting now, or later, does not wait for its gradient, as for a finished worker's,
   * once every other worker still running has pushed it (pending pushes whose condition now holds
   * resolve). Async and ssp are not changed (ssp still bounds by its clock). Idempotent.
   */
  away(worker: number): void {
    this.checkWorker(worker)
    if (this.done[worker] || this.gone[worker]) return
    this.gone[worker] = true
    if (!this.aborted && this.mode === "sync") this.applySyncIfReady()
  }

  /**
   * Rejects every pending push with `reason` (an Error as is; anything else wrapped in a
   * ShardAbortedError), and every later push at once. pull(), state() and stats() still work.
   * Idempotent (the first reason stays).
   */
  abort(reason?: unknown): void {
    if (this.aborted) return
    const error = reason instanceof Error ? reason : new ShardAbortedError(reason)
    this.aborted = { error }
    const waiters = [...(this.collecting?.waiters ?? []), ...this.sspWaiting]
    if (this.collecting) this.spare = this.collecting.sum
    this.collecting = null
    this.sspWaiting = []
    for (const w of waiters) w.reject(error)
  }

  /** Whether abort() was called. */
  get isAborted(): boolean {
    return this.aborted !== null
  }

  /**
   * The shard's state for a checkpoint: copies (a writer may encode it later), taken between
   * updates. The gradients of a sync step still collecting are not part of it: after a restore the
   * workers push that step again.
   */
  state(): ShardServerState {
    const o = this.optimizer.state()
    const slots: Record<string, Float32Array> = {}
    for (const [k, v] of Object.entries(o.slots)) slots[k] = v.slice()
    return {
      params: this.params.slice(),
      version: this.ver,
      learningRate: this.optimizer.learningRate,
      optimizer: { kind: o.kind, slots, scalars: { ...o.scalars } },
      clocks: this.lastStep.map((s) => s + 1),
      lastAppliedStep: this.lastAppliedStep
    }
  }

  /**
   * Continues from a state() (values are copied in): parameters, version, learning rate and
   * optimizer state always. The workers' progress depends on `options.workers`:
   *  - "restart" (default): a resumed run, whose workers start their loops again from the
   *    checkpoint's step. Their clocks start again at 0 and the sync step tracking with them (the
   *    first step pushed after the load collects, whatever its number), so a worker that had pushed
   *    further than the checkpoint's step before it was taken is not refused, and the state's clocks
   *    need not match this shard's number of workers.
   *  - "continue": the same workers go on (a server replaced mid-run): the clocks and the last sync
   *    step applied are restored, so everything continues exactly as on the server that saved it.
   *  - "regrouped": the workers were regrouped (renumbered, their clocks start again) but go on at
   *    the steps they were at: the last sync step applied is kept, so a step pushed again that this
   *    shard applied already is dropped (answered with the current parameters), not applied twice.
   * Every worker counts as running again either way. ConfigError, with nothing changed, when the
   * state does not fit this shard, or while pushes are waiting (abort() them, or load before the
   * workers push).
   */
  load(state: ShardServerState, options?: { readonly workers?: "restart" | "continue" | "regrouped" }): void {
    if (this.pendingCount() > 0) {
      throw new ConfigError({
        field: "ps.state",
        reason: `cannot load a state while ${this.pendingCount()} push(es) wait on this shard; abort() them first or load before the workers push`
      })
    }
    const workers = options?.workers ?? "restart"
    if (workers !== "restart" && workers !== "continue" && workers !== "regrouped") {
      throw new ConfigError({ field: "ps.load.workers", reason: `must be "restart", "continue" or "regrouped", got ${fmt(workers)}` })
    }
    if (state === null || typeof state !== "object") {
      throw new ConfigError({ field: "ps.state", reason: `must be an object from ShardServer.state(), got ${fmt(state)}` })
    }
    const { params, version, learningRate, clocks, lastAppliedStep } = state
    if (!(params instanceof Float32Array) || params.length !== this.length) {
      throw new ConfigError({ field: "ps.state.params", reason: `must be a Float32Array of this shard's ${this.length} elements, got ${fmt(params)}` })
    }
    if (!isCount(version, 0)) throw new ConfigError({ field: "ps.state.version", reason: `must be an integer >= 0, got ${fmt(version)}` })
    if (typeof learningRate !== "number" || !Number.isFinite(learningRate)) {
      throw new ConfigError({ field: "ps.state.learningRate", reason: `must be a finite number, got ${fmt(learningRate)}` })
    }
    if (workers === "continue") {
      if (!Array.isArray(clocks) || clocks.length !== this.numWorkers) {
        throw new ConfigError({
          field: "ps.state.clocks",
          reason:
            `must hold one clock per worker (${this.numWorkers}) to continue the same workers, got ${Array.isArray(clocks) ? `${clocks.length}` : fmt(clocks)}` +
            ` (load with workers: "restart" for a run whose workers start again)`
        })
      }
      clocks.forEach((c, i) => {
        if (!isCount(c, 0)) throw new ConfigError({ field: `ps.state.clocks[${i}]`, reason: `must be an integer >= 0, got ${fmt(c)}` })
      })
    }
    if (workers !== "restart" && !isCount(lastAppliedStep, -1)) {
      throw new ConfigError({ field: "ps.state.lastAppliedStep", reason: `must be an integer >= -1, got ${fmt(lastAppliedStep)}` })
    }
    this.optimizer.load(state.optimizer) // checks everything before changing anything
    this.optimizer.learningRate = learningRate
    this.params.set(params)
    this.ver = version
    this.snap = null
    for (let i = 0; i < this.numWorkers; i++) {
      this.lastStep[i] = workers === "continue" ? clocks[i] - 1 : -1
      this.done[i] = false
      this.gone[i] = false
    }
    this.finishedCount = 0
    this.lastAppliedStep = workers === "restart" ? -1 : lastAppliedStep
  }

  /**
   * A replica's side: applies an update its primary applied (what the primary's onUpdate was given,
   * in the order given), so this shard's parameters, optimizer state, version and last sync step
   * stay the primary's bit for bit. No push waits on a replica; a ConfigError when the gradient
   * does not fit the shard.
   */
  replay(grad: Float32Array, learningRate: number, step: number): void {
    if (!(grad instanceof Float32Array) || grad.length !== this.length) {
      throw new ConfigError({ field: "ps.replica", reason: `an update must be a Float32Array of this shard's ${this.length} elements, got ${fmt(grad)}` })
    }
    if (typeof learningRate !== "number" || !Number.isFinite(learningRate) || !isCount(step, 0)) {
      throw new ConfigError({ field: "ps.replica", reason: `an update needs a finite learning rate and a step >= 0, got ${fmt(learningRate)} and ${fmt(step)}` })
    }
    this.applyUpdate(grad, learningRate, step)
    if (this.mode === "sync") this.lastAppliedStep = step
  }

  /** Counters (all numbers). */
  stats(): ShardServerStats {
    let waits = 0
    let waitMs = 0
    for (let i = 0; i < this.numWorkers; i++) {
      waits += this.waitsOf[i]
      waitMs += this.waitMsOf[i]
    }
    return {
      version: this.ver,
      updates: this.updatesDone,
      received: this.received,
      applied: this.applied,
      dropped: this.dropped,
      maxStaleness: this.maxStale,
      meanStaleness: this.applied === 0 ? 0 : this.sumStale / this.applied,
      waits,
      waitMs,
      pending: this.pendingCount(),
      finished: this.finishedCount
    }
  }

  /** Per-worker clocks and waits. */
  workerStats(): ShardWorkerStats[] {
    return this.lastStep.map((s, worker) => ({
      worker,
      clock: s + 1,
      finished: this.done[worker],
      waits: this.waitsOf[worker],
      waitMs: this.waitMsOf[worker]
    }))
  }

  // -------------------------------------------------------------------------------------------

  private pendingCount(): number {
    return (this.collecting?.waiters.length ?? 0) + this.sspWaiting.length
  }

  private snapshot(): Float32Array {
    if (this.snap === null) this.snap = this.params.slice()
    return this.snap
  }

  private checkWorker(worker: number): void {
    if (!isCount(worker, 0) || worker >= this.numWorkers) {
      throw new ConfigError({ field: "ps.worker", reason: `must be an integer in [0, ${this.numWorkers}) (the shard serves ${this.numWorkers} workers), got ${fmt(worker)}` })
    }
  }

  private checkPush(worker: number, step: number, basedOn: number, grad: Float32Array, weight: number, learningRate: number | undefined, stepWeight: number | undefined): void {
    this.checkWorker(worker)
    if (this.done[worker]) {
      throw new ConfigError({ field: "ps.worker", reason: `worker ${worker} has finished (its loop ended); it cannot push again` })
    }
    if (!isCount(step, 0)) throw new ConfigError({ field: "ps.step", reason: `worker ${worker}: must be an integer >= 0, got ${fmt(step)}` })
    const last = this.lastStep[worker]
    // (async and ssp drop such a push instead: push())
    if (step <= last && this.mode === "sync") {
      throw new ConfigError({
        field: "ps.step",
        reason: `worker ${worker} pushed step ${step} after step ${last}: a worker's steps must rise (each step is pushed once)`
      })
    }
    if (!isCount(basedOn, 0) || basedOn > this.ver) {
      throw new ConfigError({
        field: "ps.basedOn",
        reason: `worker ${worker} step ${step}: must be a version the shard has had, an integer in [0, ${this.ver}], got ${fmt(basedOn)}`
      })
    }
    if (!(grad instanceof Float32Array) || grad.length !== this.length) {
      throw new ConfigError({
        field: "ps.grad",
        reason: `worker ${worker} step ${step}: the gradient must be a Float32Array of this shard's ${this.length} elements, got ${fmt(grad)}`
      })
    }
    if (typeof weight !== "number" || !Number.isFinite(weight) || weight < 0 || (this.mode === "sync" && weight === 0)) {
      throw new ConfigError({
        field: "ps.weight",
        reason:
          `worker ${worker} step ${step}: must be a finite number ${this.mode === "sync" ? "> 0 (sync averages the step's gradients weighted by their samples)" : ">= 0"}, ` +
          `got ${fmt(weight)}`
      })
    }
    if (learningRate !== undefined && (typeof learningRate !== "number" || !Number.isFinite(learningRate) || learningRate < 0)) {
      throw new ConfigError({ field: "ps.learningRate", reason: `worker ${worker} step ${step}: must be a finite number >= 0, got ${fmt(learningRate)}` })
    }
    if (stepWeight !== undefined && (typeof stepWeight !== "number" || !Number.isFinite(stepWeight) || stepWeight < weight)) {
      throw new ConfigError({
        field: "ps.stepWeight",
        reason: `worker ${worker} step ${step}: the step's samples over every worker must be a finite number >= this gradient's weight (${fmt(weight)}), got ${fmt(stepWeight)}`
      })
    }
    const c = this.collecting
    if (this.mode === "sync" && c !== null && step > c.step) {
      throw new ConfigError({
        field: "ps.step",
        reason:
          `worker ${worker} pushed step ${step} while step ${c.step} still collects gradients (${c.waiters.length} of ${this.syncQuota()} in): ` +
          `in sync mode a worker pushes step t + 1 only after its push of step t resolved`
      })
    }
  }

  private record(w: Waiter): void {
    this.applied++
    this.sumStale += w.staleness
    if (w.staleness > this.maxStale) this.maxStale = w.staleness
  }

  private settle(w: Waiter, r: PushResult): void {
    if (w.waited) this.waitMsOf[w.worker] += Math.max(0, this.now() - w.since)
    w.resolve(r)
  }

  private markWaiting(w: Waiter): void {
    w.waited = true
    this.waitsOf[w.worker]++
  }

  private applyUpdate(grad: Float32Array, learningRate: number | undefined, step: number): void {
    if (learningRate !== undefined) this.optimizer.learningRate = learningRate
    this.optimizer.step(this.params, grad, this.weightDecay)
    this.ver++
    this.updatesDone++
    this.snap = null
    this.onUpdate?.(grad, this.optimizer.learningRate, step)
  }

  // ---- sync

  /** Gradients a sync step needs (applySyncIfReady also applies it with fewer when no running worker is left to push it). */
  private syncQuota(): number {
    return this.numWorkers - this.backupWorkers
  }

  private pushSync(w: Waiter, grad: Float32Array, weight: number, learningRate: number | undefined, stepWeight: number | undefined): void {
    const c0 = this.collecting
    if (w.step <= this.lastAppliedStep || (c0 !== null && w.step < c0.step)) {
      // Late: its step was applied (with the first N - b), or it is older than the one collecting.
      this.dropped++
      w.resolve({ params: this.snapshot(), version: this.ver, staleness: this.ver - w.basedOn, dropped: true })
      return
    }
    let c = c0
    if (c === null) {
      const sum = this.spare ?? new Float32Array(this.length)
      this.spare = null
      c = { step: w.step, sum, weight: 0, waiters: [], taken: new Array<boolean>(this.numWorkers).fill(false), learningRate: undefined, stepWeight: undefined }
      this.collecting = c
    }
    const sum = c.sum
    const n = this.length
    if (c.waiters.length === 0) for (let i = 0; i < n; i++) sum[i] = weight * grad[i]
    else for (let i = 0; i < n; i++) sum[i] += weight * grad[i]
    c.weight += weight
    c.taken[w.worker] = true
    if (learningRate !== undefined) c.learningRate = learningRate
    if (stepWeight !== undefined) c.stepWeight = Math.max(c.stepWeight ?? 0, stepWeight)
    c.waiters.push(w)
    this.applySyncIfReady()
    if (this.collecting === c) this.markWaiting(w)
  }

  /** Applies the collecting step if it has its quota, or if no running worker is left to push it. */
  private applySyncIfReady(): void {
    const c = this.collecting
    if (c === null) return
    const quota = this.syncQuota()
    // In samples too when the step's total is known (unequal batches): (N - b) / N of them.
    const enough = c.waiters.length >= quota && (c.stepWeight === undefined || c.weight >= ((c.stepWeight * quota) / this.numWorkers) * (1 - 1e-9))
    if (!enough) {
      for (let i = 0; i < this.numWorkers; i++) if (!this.done[i] && !this.gone[i] && !c.taken[i]) return
    }
    this.collecting = null
    const before = this.ver
    const sum = c.sum
    const inv = 1 / c.weight
    for (let i = 0; i < this.length; i++) sum[i] *= inv
    try {
      this.applyUpdate(sum, c.learningRate, c.step)
    } catch (e) {
      for (const w of c.waiters) w.reject(e)
      throw e
    } finally {
      this.spare = sum
    }
    this.lastAppliedStep = c.step
    const params = this.snapshot()
    for (const w of c.waiters) {
      w.staleness = before - w.basedOn
      this.record(w)
      this.settle(w, { params, version: this.ver, staleness: w.staleness, dropped: false })
    }
  }

  // ---- async and ssp

  private pushApplied(w: Waiter, grad: Float32Array, learningRate: number | undefined): void {
    w.staleness = this.ver - w.basedOn
    this.applyUpdate(grad, learningRate, w.step)
    this.record(w)
    if (this.mode === "async" || this.sspReady(w.step)) {
      w.resolve({ params: this.snapshot(), version: this.ver, staleness: w.staleness, dropped: false })
    } else {
      this.markWaiting(w)
      this.sspWaiting.push(w)
    }
    // This push raised its worker's clock, which may release others.
    if (this.mode === "ssp") this.releaseSsp()
  }

  /** Slowest running worker's clock >= step + 1 - staleness (no running worker: true). */
  private sspReady(step: number): boolean {
    const need = step + 1 - this.staleness
    for (let i = 0; i < this.numWorkers; i++) if (!this.done[i] && this.lastStep[i] + 1 < need) return false
    return true
  }

  private releaseSsp(): void {
    if (this.sspWaiting.length === 0) return
    const still: Waiter[] = []
    const go: Waiter[] = []
    for (const w of this.sspWaiting) (this.sspReady(w.step) ? go : still).push(w)
    if (go.length === 0) return
    this.sspWaiting = still
    const params = this.snapshot()
    for (const w of go) this.settle(w, { params, version: this.ver, staleness: w.staleness, dropped: false })
  }
}
