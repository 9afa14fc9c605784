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
// Agreement. Throughput (samples / forward+backward seconds) is exchanged with an all-gather of
// one float per rank at the same steps on every rank: every step during warm-up, then every
// `exchangeEvery` steps (the mean over the steps since the last exchange). Every rank then runs
// the same deterministic observeThroughput on the same bits, so all hold the same split.
// Stragglers: detectStragglers over the exchanged throughputs.
import { Result } from "effect"
import {
  detectStragglers,
  initialBalancer,
  observeThroughput,
  stragglerMetrics,
  type BalancerState,
  type Straggler
} from "../../scheduler/batch-sizing.ts"

export interface HeteroBatcherOptions {
  readonly rank: number
  readonly worldSize: number
  readonly globalBatch: number
  /** false: an equal split, never re-balanced (the baseline). */
  readonly adaptive: boolean
  /** One float per rank, gathered in rank order on every rank. */
  readonly allGather: (buf: Float32Array) => Promise<Float32Array>
  /** Steps that exchange throughput every step. Default 3. */
  readonly warmupSteps?: number
  /** After warm-up, exchange every this many steps. Default 5. */
  readonly exchangeEvery?: number
  /** Re-balance when the predicted step time is this fraction above the ideal split's. Default 0.1. */
  readonly threshold?: number
}

export class HeteroBatcher {
  readonly #o: HeteroBatcherOptions
  #state: BalancerState
  #steps = 0
  #samples = 0
  #seconds = 0
  readonly #history: number[][] = []
  #stragglers: Straggler[] = []

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

  /** After every step, on every rank (same steps): feeds the measurement, maybe re-balances. */
  async afterStep(samples: number, computeMs: number): Promise<void> {
    this.#steps++
    this.#samples += samples
    this.#seconds += Math.max(computeMs, 1e-3) / 1000
    if (!this.#o.adaptive || this.#o.worldSize <= 1) return
    const warm = this.#o.warmupSteps ?? 3
    const every = Math.max(1, this.#o.exchangeEvery ?? 5)
    if (this.#steps > warm && (this.#steps - warm) % every !== 0) return
    const mine = Float32Array.of(this.#samples / this.#seconds)
    this.#samples = 0
    this.#seconds = 0
    const all = Array.from(await this.#o.allGather(mine))
    this.#history.push(all)
    const next = observeThroughput(this.#state, all, { threshold: this.#o.threshold ?? 0.1 })
    if (Result.isSuccess(next)) this.#state = next.success.state
    this.#stragglers = detectStragglers(this.#history, { window: 10, minSlowSteps: 3 })
  }

  /** For report(): each rank's batch, re-balances, stragglers ("straggler/rank3": ratio). */
  metrics(): Record<string, number> {
    const out: Record<string, number> = {}
    this.#state.batches.forEach((b, i) => (out[`batch/rank${i}`] = b))
    out["batch/rebalances"] = this.#state.rebalances
    out["stragglers"] = this.#stragglers.length
    return { ...out, ...stragglerMetrics(this.#stragglers) }
  }
}
