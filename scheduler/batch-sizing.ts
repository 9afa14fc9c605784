// Heterogeneity-aware batch sizing: gives each worker a share of the global batch proportional to
// its measured throughput, so fast and slow workers finish a step together, while the update stays
// large-batch SGD. Pure functions over numbers; the trainer measures and applies.
//
// Split: quotas q_i = clamp(lambda * t_i, min, max_i) with sum q_i = B (lambda found by bisection),
// then largest-remainder rounding (floors, then +1 to the largest fractional parts r_i, lower rank
// first on ties), so every b_i is floor(q_i) or ceil(q_i) and sum b_i = B exactly. The remainders
// are compared in step time, (1 - r_i) / t_i (the time one more sample adds), not in samples: that
// keeps the rounding from handing the extra sample to a slow worker and, with it, a needlessly
// slow step that a few percent of noise would later "fix" by re-balancing.
// Weights: rank i averages its gradient over its own b_i samples, so the all-reduce must weight by
// w_i = b_i / B: sum_i w_i * mean_i(g) = (1/B) * sum over all B samples = the large-batch gradient.
// Re-balancing uses the predicted step time T(b) = max_i b_i / t_i: rebalance only when
// T(current) / T(ideal) - 1 > threshold (and a cooldown has passed). Right after a re-balance the
// drift is ~0, so noise of a few percent never flips batches back and forth (hysteresis).
// Stragglers: per step, rank r is slow when median_t / t_r >= factor; flagged when slow in >= k of
// the last n steps, with the median of its ratio over those n steps.
import * as Result from "effect/Result"
import * as Schema from "effect/Schema"

export class BatchSizingError extends Schema.TaggedError<BatchSizingError>()("BatchSizingError", {
  field: Schema.String,
  reason: Schema.String
}) {
  override get message(): string {
    return `batch sizing: invalid ${this.field}: ${this.reason}`
  }
}

const fail = (field: string, reason: string) => Result.fail(new BatchSizingError({ field, reason }))

/** Exponentially weighted moving average; `alpha` is the weight of the new sample. */
export const ewma = (prev: number | undefined, sample: number, alpha = 0.3): number =>
  prev === undefined || !Number.isFinite(prev) ? sample : alpha * sample + (1 - alpha) * prev

/** Smooths a step's per-rank throughputs into the running estimate (non-finite samples keep the old value). */
export const smoothThroughput = (prev: readonly number[] | undefined, measured: readonly number[], alpha = 0.3): number[] =>
  measured.map((x, i) => {
    const old = prev?.[i]
    if (!Number.isFinite(x) || x < 0) return old ?? 0
    return ewma(old, x, alpha)
  })

export interface SplitOptions {
  /** Smallest per-worker batch (integer >= 0). Default 1. */
  readonly minPerWorker?: number
  /** Largest per-worker batch (e.g. what fits in a GPU's memory); one number or one per rank. */
  readonly maxPerWorker?: number | readonly number[]
}

const checkThroughputs = (t: readonly number[]): Result.Result<void, BatchSizingError> => {
  if (t.length === 0) return fail("throughputs", "no workers")
  for (let i = 0; i < t.length; i++) {
    const x = t[i]!
    if (!Number.isFinite(x) || x < 0) return fail(`throughputs[${i}]`, `must be a finite number >= 0 (samples/s), got ${x}`)
  }
  return Result.succeed(undefined)
}

/**
 * Splits `globalBatch` into per-worker integer batches proportional to `throughputs` (samples/s),
 * rounded for the least step time (the slowest worker's b_i / t_i): within 1 of each share, except
 * that a sample moves off a slow worker when a faster one finishes it sooner. Workers with
 * throughput 0 get the minimum; all zero means an equal split.
 */
export const splitBatch = (globalBatch: number, throughputs: readonly number[], options: SplitOptions = {}): Result.Result<number[], BatchSizingError> => {
  const p = throughputs.length
  const ok = checkThroughputs(throughputs)
  if (Result.isFailure(ok)) return Result.fail(ok.failure)
  if (!Number.isInteger(globalBatch) || globalBatch < 0) return fail("globalBatch", `must be an integer >= 0, got ${globalBatch}`)
  const lo = options.minPerWorker ?? 1
  if (!Number.isInteger(lo) || lo < 0) return fail("minPerWorker", `must be an integer >= 0, got ${lo}`)
  const maxOpt = options.maxPerWorker
  const hi: number[] = Array.from({ length: p }, (_, i) =>
    maxOpt === undefined ? Number.POSITIVE_INFINITY : typeof maxOpt === "number" ? maxOpt : (maxOpt[i] ?? Number.POSITIVE_INFINITY)
  )
  for (let i = 0; i < p; i++) {
    const h = hi[i]!
    if (h !== Number.POSITIVE_INFINITY && (!Number.isInteger(h) || h < lo)) {
      return fail(`maxPerWorker[${i}]`, `must be an integer >= minPerWorker (${lo}), got ${h}`)
    }
  }
  if (globalBatch < lo * p) {
    return fail("globalBatch", `${globalBatch} is less than ${p} workers x minPerWorker ${lo}; raise the global batch, lower minPerWorker or use fewer workers`)
  }
  const cap = hi.reduce((s, h) => s + h, 0)
  if (globalBatch > cap) {
    return fail("globalBatch", `${globalBatch} is more than the workers' maxPerWorker allow in total (${cap}); lower the global batch or raise maxPerWorker`)
  }
  const sumT = throughputs.reduce((s, x) => s + x, 0)
  const w = sumT > 0 ? throughputs : throughputs.map(() => 1)
  const quota = (lambda: number) => w.map((x, i) => Math.min(hi[i]!, Math.max(lo, lambda * x)))
  const total = (lambda: number) => quota(lambda).reduce((s, x) => s + x, 0)
  // total(lambda) is nondecreasing in lambda; bracket then bisect for total = B.
  let a = 0
  let b = 1
  while (total(b) < globalBatch && b < 1e300) b *= 2
  for (let it = 0; it < 200 && b - a > 1e-12 * b; it++) {
    const m = (a + b) / 2
    if (total(m) < globalBatch) a = m
    else b = m
  }
  const q = quota(b)
  const out = q.map((x, i) => Math.min(hi[i]!, Math.max(lo, Math.floor(x + 1e-9))))
  let rest = globalBatch - out.reduce((s, x) => s + x, 0)
  // Largest remainder, measured in step time: the +1s go where one more sample costs the least
  // time, (1 - r_i) / t_i, so rounding never makes a slow worker the straggler when a fast one
  // could absorb the sample. With equal throughputs this is the plain largest-remainder order.
  const rem = q.map((x, i) => x - out[i]!)
  // Rounded to 9 digits so that costs equal up to round-off tie exactly (a consistent sort order);
  // zero-throughput workers (only at their minimum) come last.
  const cost = rem.map((r, i) => (w[i]! > 0 ? Number(((1 - r) / w[i]!).toPrecision(9)) : Number.POSITIVE_INFINITY))
  const order = cost
    .map((_, i) => i)
    .sort((i, j) => (cost[i]! === cost[j]! ? rem[j]! - rem[i]! || i - j : cost[i]! < cost[j]! ? -1 : 1))
  // |rest| < p in exact arithmetic; the loops also absorb bisection round-off.
  while (rest > 0) {
    let moved = false
    for (const i of order) {
      if (rest === 0) break
      if (out[i]! < hi[i]!) {
        out[i]!++
        rest--
        moved = true
      }
    }
    if (!moved) break
  }
  while (rest < 0) {
    let moved = false
    for (const i of [...order].reverse()) {
      if (rest === 0) break
      if (out[i]! > lo) {
        out[i]!--
        rest++
        moved = true
      }
    }
    if (!moved) break
  }
  // Then the step time, which is what the split is for: while the slowest worker's last sample
  // would finish sooner on another worker, move it there. Rounding within 1 of the shares can leave
  // a slow worker one sample too many (3 instead of 2 at 10 samples/s costs 100 ms) when a fast
  // one could take it; and without this, noise moving a share across an integer would flip the
  // within-1 split between a good and a bad one, and the balancer would chase that. Each move
  // strictly shortens the sorted vector of per-worker times, so this ends; it keeps the order
  // (a faster worker never gets fewer samples) and reaches the least possible step time.
  if (sumT > 0) {
    for (let guard = 0; guard < globalBatch + p; guard++) {
      let slow = -1
      let fast = -1
      for (let i = 0; i < p; i++) {
        if (w[i]! <= 0) continue
        if (out[i]! > lo && (slow < 0 || out[i]! * w[slow]! > out[slow]! * w[i]!)) slow = i
        if (out[i]! < hi[i]! && (fast < 0 || (out[i]! + 1) * w[fast]! < (out[fast]! + 1) * w[i]!)) fast = i
      }
      if (slow < 0 || fast < 0 || fast === slow || !((out[fast]! + 1) * w[slow]! < out[slow]! * w[fast]!)) break
      out[slow]!--
      out[fast]!++
    }
  }
  return Result.succeed(out)
}

/** All-reduce weights for per-worker batches: w_i = b_i / sum b (a weighted mean = large-batch SGD). */
export const gradientWeights = (batches: readonly number[]): { readonly counts: readonly number[]; readonly total: number; readonly weights: readonly number[] } => {
  const total = batches.reduce((s, b) => s + b, 0)
  return { counts: [...batches], total, weights: batches.map((b) => (total > 0 ? b / total : 0)) }
}

/** Predicted compute time of a step, ms: the slowest worker's b_i / t_i. */
export const predictedStepMs = (batches: readonly number[], throughputs: readonly number[]): number => {
  let worst = 0
  for (let i = 0; i < batches.length; i++) {
    const b = batches[i]!
    const t = throughputs[i]!
    if (b === 0) continue
    worst = Math.max(worst, t > 0 ? (1000 * b) / t : Number.POSITIVE_INFINITY)
  }
  return worst
}

export interface BalancerOptions extends SplitOptions {
  /** Rebalance when the predicted step time exceeds the ideal split's by more than this fraction. Default 0.1. */
  readonly threshold?: number
  /** Steps to wait after a re-balance before the next one. Default 0. */
  readonly cooldownSteps?: number
  /** A drift above this re-balances even within the cooldown (a worker that slowed for good). Default: none. */
  readonly urgentDrift?: number
  /** EWMA weight of a new throughput sample. Default 0.3. */
  readonly alpha?: number
  /**
   * A split's predicted step time in ms, to judge a re-balance by (the threshold compares the
   * current split's with the ideal one's). Default: the slowest rank's batch / smoothed throughput,
   * which overstates a change where steps have a fixed cost (a small batch's step is not
   * proportionally shorter): pass the ranks' fitted step times there.
   */
  readonly stepMs?: (batches: readonly number[]) => number
}

export interface BalancerState {
  readonly globalBatch: number
  readonly batches: readonly number[]
  /** EWMA of each rank's throughput (samples/s); undefined before the first measurement. */
  readonly throughput: readonly number[] | undefined
  readonly stepsSinceRebalance: number
  readonly rebalances: number
}

export interface BalancerStep {
  readonly state: BalancerState
  readonly rebalanced: boolean
  /** T(current) / T(ideal) - 1 under the smoothed throughputs (before re-balancing). */
  readonly drift: number
  /** The split the smoothed throughputs call for. */
  readonly ideal: readonly number[]
}

/** Starts with an equal split (nothing measured yet). */
export const initialBalancer = (globalBatch: number, numWorkers: number, options: SplitOptions = {}): Result.Result<BalancerState, BatchSizingError> => {
  if (!Number.isInteger(numWorkers) || numWorkers < 1) return fail("numWorkers", `must be an integer >= 1, got ${numWorkers}`)
  const split = splitBatch(globalBatch, new Array<number>(numWorkers).fill(1), options)
  if (Result.isFailure(split)) return Result.fail(split.failure)
  return Result.succeed({ globalBatch, batches: split.success, throughput: undefined, stepsSinceRebalance: 0, rebalances: 0 })
}

/**
 * Feeds one step's measured throughputs (samples/s per rank: batch_i / compute time_i, from warm-up
 * steps or training) and returns the batches for the next step.
 */
export const observeThroughput = (state: BalancerState, measured: readonly number[], options: BalancerOptions = {}): Result.Result<BalancerStep, BatchSizingError> => {
  if (measured.length !== state.batches.length) {
    return fail("measured", `${measured.length} throughputs for ${state.batches.length} workers; give one per rank`)
  }
  const throughput = smoothThroughput(state.throughput, measured, options.alpha ?? 0.3)
  const idealR = splitBatch(state.globalBatch, throughput, options)
  if (Result.isFailure(idealR)) return Result.fail(idealR.failure)
  const ideal = idealR.success
  const predict = options.stepMs ?? ((b: readonly number[]) => predictedStepMs(b, throughput))
  const tIdeal = predict(ideal)
  const tNow = predict(state.batches)
  const drift = tIdeal > 0 && Number.isFinite(tIdeal) ? tNow / tIdeal - 1 : tNow > tIdeal ? Number.POSITIVE_INFINITY : 0
  const threshold = options.threshold ?? 0.1
  const cooldown = options.cooldownSteps ?? 0
  const steps = state.stepsSinceRebalance + 1
  const urgent = options.urgentDrift !== undefined && drift > options.urgentDrift
  const rebalanced = drift > threshold && (steps > cooldown || urgent) && ideal.some((b, i) => b !== state.batches[i])
  return Result.succeed({
    state: {
      globalBatch: state.globalBatch,
      batches: rebalanced ? ideal : state.batches,
      throughput,
      stepsSinceRebalance: rebalanced ? 0 : steps,
      rebalances: state.rebalances + (rebalanced ? 1 : 0)
    },
    rebalanced,
    drift,
    ideal
  })
}

export interface StragglerOptions {
  /** Steps looked at (n). Default 20. */
  readonly window?: number
  /** Slow steps within the window needed to flag a rank (k). Default ceil(0.75 * window). */
  readonly minSlowSteps?: number
  /** A rank is slow in a step when the median throughput is >= factor x its own. Default 1.5. */
  readonly factor?: number
}

export interface Straggler {
  readonly rank: number
  /** Median over the window of (median throughput / this rank's throughput). */
  readonly ratio: number
  readonly slowSteps: number
  readonly window: number
}

/**
 * Ranks persistently slower than the rest. `history[step][rank]` is throughput (samples/s), oldest
 * first; only the last `window` steps count. Throughput rather than step time, because with
 * heterogeneity-aware batches every rank's step takes about the same time by design.
 */
export const detectStragglers = (history: readonly (readonly number[])[], options: StragglerOptions = {}): Straggler[] => {
  const n = Math.max(1, Math.floor(options.window ?? 20))
  const k = Math.max(1, Math.floor(options.minSlowSteps ?? Math.ceil(0.75 * n)))
  const factor = options.factor ?? 1.5
  const steps = history.slice(-n)
  if (steps.length === 0) return []
  const p = Math.max(...steps.map((s) => s.length))
  const ratios: number[][] = Array.from({ length: p }, () => [])
  const slow = new Array<number>(p).fill(0)
  for (const s of steps) {
    const valid = s.filter((x) => Number.isFinite(x) && x >= 0)
    if (valid.length < 2) continue
    const sorted = [...valid].sort((a, b) => a - b)
    const mid = sorted.length >> 1
    const med = sorted.length % 2 === 1 ? sorted[mid]! : (sorted[mid - 1]! + sorted[mid]!) / 2
    if (!(med > 0)) continue
    s.forEach((x, r) => {
      if (!Number.isFinite(x) || x < 0) return
      const ratio = x > 0 ? med / x : Number.POSITIVE_INFINITY
      ratios[r]!.push(ratio)
      if (ratio >= factor) slow[r]!++
    })
  }
  const out: Straggler[] = []
  for (let r = 0; r < p; r++) {
    if (slow[r]! < k) continue
    const rs = [...ratios[r]!].sort((a, b) => a - b)
    const mid = rs.length >> 1
    const ratio = rs.length % 2 === 1 ? rs[mid]! : (rs[mid - 1]! + rs[mid]!) / 2
    out.push({ rank: r, ratio, slowSteps: slow[r]!, window: steps.length })
  }
  return out
}

/** Stragglers as flat metrics for report(): { "straggler/rank3": 1.8 }. */
export const stragglerMetrics = (stragglers: readonly Straggler[]): Record<string, number> =>
  Object.fromEntries(stragglers.map((s) => [`straggler/rank${s.rank}`, Number(s.ratio.toFixed(3))]))
