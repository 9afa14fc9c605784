// Heterogeneity-aware batching for DataParallelModel.fit({ globalBatchSize }): every step the
// global batch B is split into per-rank batches b_i (sum b_i = B) proportional to each rank's
// measured throughput (scheduler/batch-sizing.ts splitBatch / observeThroughput). The gradient
// all-reduce is already weighted by sample counts, so the update is the large-batch SGD update
// whatever the split.
//
// Data. Each epoch has one permutation of the whole dataset (same seed on every rank); step s
// takes the global batch perm[s*B, (s+1)*B) and rank i its slice [off_i, off_i + b_i) of it
// (off_i = b_0 + ... + b_{i-1}): per-rank shares proportional to the batch sizes, as
// shardIndicesWeighted cuts an epoch, but re-cut per step so a re-balance can happen mid-epoch.
// Every rank runs floor(N / B) steps per epoch (the remainder is dropped), so ranks stay in step.
//
// Agreement. Each rank's mean batch, mean forward+backward milliseconds and mean whole milliseconds
// per step are exchanged with an all-gather of three floats per rank at the same steps on every
// rank: every step during warm-up, then every `exchangeEvery` steps (the means over the steps since
// the last exchange).
// Every rank then runs the same deterministic computation on the same bits, so all hold the same
// split. Stragglers: detectStragglers over the exchanged throughputs (batch / time).
//
// Step time is affine in the batch, t_i(b) = a_i + c_i b: a step has costs that do not shrink with
// the batch (kernel launches, the optimizer's update, a CPU quota's wait for its next period).
// Splitting by raw throughput (b / t) feeds back: a slow rank given a small batch shows an even
// lower throughput, gets a smaller batch still, and the split drifts to 127/1 (a cgroup-throttled
// worker in bench hetero). Once a rank has measured steps at batches at least 15% apart, a and c
// are fitted (least squares over its last FIT_POINTS exchanges) and the split is the one that
// equalises the fitted times (a fixed point of the proportional split with each rank's
// throughput taken at its own batch); until then a = 0. A re-balance is judged by those fitted
// times (a change they price within the threshold is not made), and the k-th waits 2^(k-1) - 1
// exchanges after the one before (at most 15), unless the split is predicted 50% off: the split
// settles instead of following each noisy measurement, and still follows a rank that slows for good.
//
// No rows. A rank at one row can still hold every step back: on a quarter core its share of the
// exchange and the update waits for its quota, and its one row's forward+backward eats that quota
// (bench hetero at 4x: 127/1 ran 5916 samples/s, 128/0 7752). Costs outside forward+backward are
// not in the fit, so where a rank sits at one row, or at half its equal share or less (a fixed cost
// outside the fit settles it at a few rows where none would be faster), the batcher tries it with
// none (allowZero: the all-reduce, whose update every rank applies alike, the rank taking part in
// the exchange with nothing, sample weight 0; local SGD, whose rounds weight each rank's delta by
// its samples),
// compares the group's whole step time (each rank's wall time per step, the slowest, exchanged
// with the rest) over the next TRIAL_EXCHANGES exchanges against as many before (medians: on a CPU
// quota one exchange's steps move 2x and more), and keeps it only 10% faster, else goes back and
// tries again after 8 exchanges, then 16, 32, up to ZERO_RECHECK. A rank left without rows is
// tried with one again every ZERO_RECHECK exchanges, kept where that is 10% faster. Strategy
// "auto" allows it while it runs one of those two (allowZero asked at every exchange); should it
// stop allowing it, every rank without rows gets one back at the next exchange. Where one rank
// holds every row, the all-reduce sends that rank's gradient to the rest instead of reducing it
// with their zeros (StrategyHost.soleHolder, GradientReducer's holder).
import * as Result from "effect/Result"
import {
  detectStragglers,
  initialBalancer,
  observeThroughput,
  splitBatch,
  stragglerMetrics,
  type BalancerState,
  type Straggler
} from "../../../scheduler/batch-sizing.ts"
import { median } from "../../../scheduler/cost-model.ts"

export interface HeteroBatcherOptions {
  readonly rank: number
  readonly worldSize: number
  readonly globalBatch: number
  /** false: an equal split, never re-balanced (the baseline). */
  readonly adaptive: boolean
  /** Three floats per rank (mean batch, mean forward+backward ms and mean whole ms per step), gathered in rank order on every rank. */
  readonly allGather: (buf: Float32Array) => Promise<Float32Array>
  /** Steps that exchange throughput every step. Default 3. */
  readonly warmupSteps?: number
  /** After warm-up, exchange every this many steps. Default 5. */
  readonly exchangeEvery?: number
  /** Re-balance when the predicted step time is this fraction above the ideal split's. Default 0.1. */
  readonly threshold?: number
  /**
   * Whether a rank may be given no rows (see the header); false by default. A function is asked at
   * every exchange (it must answer the same on every rank there): where it says no, a rank without
   * rows gets one back.
   */
  readonly allowZero?: boolean | (() => boolean)
}

/** Exchanges per rank the affine step-time fit uses (the latest). */
const FIT_POINTS = 8
/** Exchanges the cooldown after re-balances grows to (it doubles with each). */
const MAX_COOLDOWN = 15
/** A predicted slow-down that re-balances within the cooldown. */
const URGENT_DRIFT = 0.5
/** A fit needs batches this far apart (relative to their mean). */
const FIT_SPREAD = 0.15
/** How much faster (whole step time) a trial of a rank with no rows, or with one again, must be to stay. */
const ZERO_MARGIN = 0.1
/** Exchanges until a rank without rows is tried with one, and the most a rank whose trial without rows lost waits to be tried again. */
export const ZERO_RECHECK = 64
/** Exchanges a trial runs, and the exchanges at the split before it that it is compared with (their medians). */
export const TRIAL_EXCHANGES = 3
/** Exchanges until a rank whose first trial without rows lost is tried again (doubling after each loss, up to ZERO_RECHECK). */
const ZERO_RETRY = 8

/** A rank's step time t(b) = a + c b, in ms, from its (batch, ms) points; undefined when they cannot tell. */
export const fitStepTime = (points: ReadonlyArray<readonly [number, number]>): { readonly a: number; readonly c: number } | undefined => {
  if (points.length < 2) return undefined
  const n = points.length
  const mb = points.reduce((s, p) => s + p[0], 0) / n
  const mt = points.reduce((s, p) => s + p[1], 0) / n
  const bs = points.map((p) => p[0])
  if (!(mb > 0) || (Math.max(...bs) - Math.min(...bs)) / mb < FIT_SPREAD) return undefined
  let cov = 0
  let vb = 0
  for (const [b, t] of points) {
    cov += (b - mb) * (t - mt)
    vb += (b - mb) * (b - mb)
  }
  const c = cov / vb
  if (!(c > 0) || !Number.isFinite(c)) return undefined
  const a = mt - c * mb
  // No negative fixed cost: then the proportional model through the points' totals.
  return a >= 0 ? { a, c } : { a: 0, c: points.reduce((s, p) => s + p[1], 0) / points.reduce((s, p) => s + p[0], 0) }
}

/**
 * Throughputs (samples/s) at which a proportional split gives equal fitted step times: each rank's
 * b / t(b) at its batch of that split, found by iterating split -> throughputs from `start`.
 */
export const affineThroughputs = (
  globalBatch: number,
  models: ReadonlyArray<{ readonly a: number; readonly c: number }>,
  start: readonly number[]
): number[] => {
  let batches = [...start]
  let thr = models.map((m, i) => throughputAt(m, batches[i]!))
  for (let k = 0; k < 8; k++) {
    const next = splitBatch(globalBatch, thr)
    if (Result.isFailure(next)) break
    batches = next.success
    thr = models.map((m, i) => throughputAt(m, batches[i]!))
  }
  return thr
}

const throughputAt = (m: { readonly a: number; readonly c: number }, b: number): number => (1000 * Math.max(b, 1)) / (m.a + m.c * Math.max(b, 1))

export class HeteroBatcher {
  readonly #o: HeteroBatcherOptions
  #state: BalancerState
  #steps = 0
  #samples = 0
  #ms = 0
  #wallMs = 0
  #wallSteps = 0
  #stepsSinceExchange = 0
  #exchanges = 0
  /** Ranks given no rows, with the exchange from which each is tried with one row again. */
  readonly #zeroed = new Map<number, number>()
  /** Ranks whose trial without rows lost, with the exchange from which they may be tried again and how many lost. */
  readonly #zeroLost = new Map<number, { readonly from: number; readonly losses: number }>()
  /** A trial under way: a rank given no rows (or one again), the split and step time before it, the step times with it. */
  #trial: { readonly rank: number; readonly toZero: boolean; readonly previous: readonly number[]; readonly beforeMs: number; readonly walls: number[]; exchanges: number } | undefined
  /** The group's step time at each exchange since the split was last set. */
  #splitWalls: number[] = []
  /** Per rank: (mean batch, mean ms per step) of its latest exchanges. */
  readonly #points: Array<Array<readonly [number, number]>> = []
  readonly #history: number[][] = []
  #stragglers: Straggler[] = []
  /** Per rank, its latest exchange's mean forward+backward ms and whole ms per step (NaN: not known). */
  #latest: Array<{ readonly computeMs: number; readonly stepMs: number }> = []
  /** Since a re-balance for a rank that changed speed, until every rank is fitted again. */
  #changed = false

  constructor(o: HeteroBatcherOptions) {
    this.#o = o
    const init = initialBalancer(o.globalBatch, o.worldSize)
    if (Result.isFailure(init)) throw init.failure
    this.#state = init.success
  }

  get globalBatch(): number {
    return this.#o.globalBatch
  }

  get batches(): readonly number[] {
    return this.#state.batches
  }

  /** This rank's rows of the step's global batch: [offset, offset + size) of it. */
  slice(): { offset: number; size: number } {
    const b = this.#state.batches
    let offset = 0
    for (let i = 0; i < this.#o.rank; i++) offset += b[i]!
    return { offset, size: b[this.#o.rank]! }
  }

  get stragglers(): readonly Straggler[] {
    return this.#stragglers
  }

  /**
   * After every step, on every rank (same steps): feeds the measurement, maybe re-balances.
   * `computeMs` is the step's forward+backward, `wallMs` the whole step's time on this rank (NaN
   * where it is not known, as at an epoch's first step).
   */
  async afterStep(samples: number, computeMs: number, wallMs = Number.NaN): Promise<void> {
    this.#steps++
    this.#samples += samples
    this.#ms += Math.max(computeMs, 1e-3)
    if (Number.isFinite(wallMs) && wallMs > 0) {
      this.#wallMs += wallMs
      this.#wallSteps++
    }
    this.#stepsSinceExchange++
    if (!this.#o.adaptive || this.#o.worldSize <= 1) return
    const warm = this.#o.warmupSteps ?? 3
    const every = Math.max(1, this.#o.exchangeEvery ?? 5)
    if (this.#steps > warm && (this.#steps - warm) % every !== 0) return
    const n = this.#stepsSinceExchange
    const mine = Float32Array.of(this.#samples / n, this.#ms / n, this.#wallSteps > 0 ? this.#wallMs / this.#wallSteps : Number.NaN)
    this.#samples = 0
    this.#ms = 0
    this.#wallMs = 0
    this.#wallSteps = 0
    this.#stepsSinceExchange = 0
    this.#exchanges++
    const gathered = await this.#o.allGather(mine)
    const p = this.#o.worldSize
    const raw: number[] = []
    // The group's step time over these steps: its slowest rank's wall time (NaN where none knows it).
    let groupMs = Number.NaN
    for (let i = 0; i < p; i++) {
      const b = gathered[3 * i]!
      const t = gathered[3 * i + 1]!
      const wall = gathered[3 * i + 2]!
      if (Number.isFinite(wall) && !(wall <= groupMs)) groupMs = wall
      const pts = (this.#points[i] ??= [])
      // A rank given no rows measured no forward+backward: its fit stays what it was, and it counts
      // (for the stragglers) at the throughput it had when it last had rows.
      if (!(b > 0)) {
        raw.push(this.#history.findLast((h) => Number.isFinite(h[i]))?.[i] ?? Number.NaN)
        continue
      }
      raw.push((1000 * b) / Math.max(t, 1e-3))
      pts.push([b, t])
      if (pts.length > FIT_POINTS) pts.shift()
    }
    this.#history.push(raw)
    this.#latest = Array.from({ length: p }, (_, i) => ({ computeMs: gathered[3 * i]! > 0 ? gathered[3 * i + 1]! : Number.NaN, stepMs: gathered[3 * i + 2]! }))
    this.#stragglers = detectStragglers(this.#history, { window: 10, minSlowSteps: 3 })
    const allowZero = typeof this.#o.allowZero === "function" ? this.#o.allowZero() : this.#o.allowZero === true
    if (!allowZero && this.#state.batches.includes(0)) {
      this.#rowsBack()
      return
    }
    if (this.#trial) {
      if (Number.isFinite(groupMs)) this.#trial.walls.push(groupMs)
      // (Ended after twice its exchanges whatever it measured: no step time, no change kept.)
      if (this.#trial.walls.length >= TRIAL_EXCHANGES || ++this.#trial.exchanges >= 2 * TRIAL_EXCHANGES) this.#endTrial()
      return
    }
    // Each rank's fitted step time (proportional through its latest point until batches differ enough).
    // (Proportional through the latest points' totals where they cannot tell a fixed cost.)
    let fitted = 0
    const models = this.#points.map((pts) => {
      const fit = fitStepTime(pts)
      if (fit) {
        fitted++
        return fit
      }
      const recent = pts.slice(-3)
      return { a: 0, c: Math.max(recent.reduce((s, p) => s + p[1], 0), 1e-3) / Math.max(recent.reduce((s, p) => s + p[0], 0), 1) }
    })
    // Ranks without rows keep none: 0 throughput, and a split that may give 0.
    const effective = affineThroughputs(this.#o.globalBatch, models, this.#state.batches.map((b) => Math.max(b, 1))).map((t, i) => (this.#zeroed.has(i) ? 0 : t))
    // A re-balance is judged by the fitted step times: with a fixed cost per step, moving a few
    // rows to or from a rank with a small batch changes its step little, which the proportional
    // prediction would overstate (and re-balance on every noisy measurement).
    const stepMs = (batches: readonly number[]): number => Math.max(...models.map((m, i) => (batches[i]! > 0 ? m.a + m.c * batches[i]! : 0)))
    // Settling: after the k-th re-balance the next waits 2^k - 1 exchanges (at most 15), unless
    // the current split is predicted 50% slower than the ideal one (a rank slowed down for good).
    const cooldownSteps = Math.min(2 ** this.#state.rebalances - 1, MAX_COOLDOWN)
    const next = observeThroughput(this.#state, effective, {
      threshold: this.#o.threshold ?? 0.1,
      stepMs,
      cooldownSteps,
      urgentDrift: URGENT_DRIFT,
      ...(this.#zeroed.size > 0 ? { minPerWorker: 0 } : {}),
      ...(fitted === p || this.#changed || this.#zeroed.size > 0 ? { alpha: 1 } : {})
    })
    if (Result.isSuccess(next)) {
      this.#state = next.success.state
      if (next.success.rebalanced) this.#splitWalls = []
      else if (Number.isFinite(groupMs)) this.#splitWalls.push(groupMs)
      // A rank that changed speed for good: its earlier points describe the old speed.
      // (And no smoothing either until every rank is fitted again.)
      if (next.success.rebalanced && next.success.drift > URGENT_DRIFT) {
        for (const pts of this.#points) pts.splice(0, pts.length - 1)
        this.#changed = true
      } else if (fitted === p) this.#changed = false
      // The steps just measured ran the split as it still is: a trial may start from it.
      if (allowZero && this.#splitWalls.length >= TRIAL_EXCHANGES) this.#maybeTry(median(this.#splitWalls.slice(-TRIAL_EXCHANGES)))
    }
  }

  /** Sets the split (a trial's, or the one before it), counted as a re-balance. */
  #setBatches(batches: readonly number[]): void {
    this.#state = { ...this.#state, batches: [...batches], stepsSinceRebalance: 0, rebalances: this.#state.rebalances + 1 }
    this.#splitWalls = []
  }

  /** No rank may be left without rows any more (allowZero says no): each gets one row back from the largest batch, trials and records of them dropped. */
  #rowsBack(): void {
    const next = [...this.#state.batches]
    for (let r = 0; r < next.length; r++) {
      if (next[r] !== 0) continue
      next[next.indexOf(Math.max(...next))]! -= 1
      next[r] = 1
    }
    this.#trial = undefined
    this.#zeroed.clear()
    this.#zeroLost.clear()
    this.#setBatches(next)
  }

  /**
   * Starts a trial: a rank at a small share given none (one row, or at most half its equal share:
   * the fit sees only forward+backward, so a rank whose fixed cost per step lies outside it, a
   * quarter core's share of the exchange and update, settles at a few rows where none would be
   * faster), or a rank without rows given one again, its rows to or from the largest batch.
   */
  #maybeTry(groupMs: number): void {
    const batches = this.#state.batches
    const largest = batches.indexOf(Math.max(...batches))
    const small = Math.max(1, Math.floor(this.#o.globalBatch / (2 * batches.length)))
    for (let r = 0; r < batches.length; r++) {
      if (r === largest) continue
      const zeroedUntil = this.#zeroed.get(r)
      const toZero = zeroedUntil === undefined
      if (toZero ? !(batches[r]! >= 1 && batches[r]! <= small) || (this.#zeroLost.get(r)?.from ?? 0) > this.#exchanges : batches[r] !== 0 || zeroedUntil > this.#exchanges) continue
      const next = [...batches]
      next[r] = toZero ? 0 : 1
      next[largest]! += toZero ? batches[r]! : -1
      this.#trial = { rank: r, toZero, previous: batches, beforeMs: groupMs, walls: [], exchanges: 0 }
      this.#setBatches(next)
      return
    }
  }

  /** Ends the trial under way by the group's step time with it: kept where 10% faster, else the split before it again. */
  #endTrial(): void {
    const { rank, toZero, previous, beforeMs, walls } = this.#trial!
    this.#trial = undefined
    const kept = walls.length > 0 && median(walls) < beforeMs * (1 - ZERO_MARGIN)
    if (toZero && kept) {
      this.#zeroed.set(rank, this.#exchanges + ZERO_RECHECK)
      this.#zeroLost.delete(rank)
    } else if (!toZero && kept) this.#zeroed.delete(rank)
    else {
      if (toZero) {
        const losses = (this.#zeroLost.get(rank)?.losses ?? 0) + 1
        this.#zeroLost.set(rank, { from: this.#exchanges + Math.min(ZERO_RETRY * 2 ** (losses - 1), ZERO_RECHECK), losses })
      } else this.#zeroed.set(rank, this.#exchanges + ZERO_RECHECK)
      this.#setBatches(previous)
    }
  }

  /**
   * For report(): each rank's batch, re-balances, stragglers ("straggler/rank3": ratio), and each
   * rank's whole ms per step and its forward+backward ms of it at the latest exchange
   * ("step_ms/rank0", "compute_ms/rank0"; the rest of a step is its exchange, update and waits).
   */
  metrics(): Record<string, number> {
    const out: Record<string, number> = {}
    this.#state.batches.forEach((b, i) => (out[`batch/rank${i}`] = b))
    this.#latest.forEach((l, i) => {
      if (Number.isFinite(l.stepMs)) out[`step_ms/rank${i}`] = Number(l.stepMs.toFixed(3))
      if (Number.isFinite(l.computeMs)) out[`compute_ms/rank${i}`] = Number(l.computeMs.toFixed(3))
    })
    out["batch/rebalances"] = this.#state.rebalances
    out["stragglers"] = this.#stragglers.length
    return { ...out, ...stragglerMetrics(this.#stragglers) }
  }
}
