// dp.fit(): the epoch loop of the data-parallel model. This rank's shard (in-memory rows, or a
// stream) is cut into steps (per-rank batches, slices of a global batch split by measured
// throughput, micro-batches for gradient accumulation), each step goes through the model's
// trainStep, and the epoch's metrics are summed over the ranks. With recovery from peers it follows
// regroups (the epoch goes on at the furthest survivor's point, cut for the new group) and joins (a
// joining rank skips what the survivors trained and takes their state where they are).
import type { Tf } from "../../../core/engine.ts"
import { shardIndicesWeighted } from "../../../core/datasets.ts"
import { isStreamingSource } from "../../../core/data/stream.ts"
import { ConfigError } from "../../../core/errors.ts"
import { batchTensors, classesOf, fitBatch, streamEpoch, type FitSource, type ShardSource } from "./batches.ts"
import { HeteroBatcher } from "./hetero-batching.ts"
import { PeerRecoveryMisaligned } from "./group-session.ts"
import type { GradientSync, RecoveryCursor, StepObserver } from "./gradient-sync.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type LayersModel = import("@tensorflow/tfjs").LayersModel
type Tensor = import("@tensorflow/tfjs").Tensor

/** Step index of a cursor's position in an epoch cut into `steps` steps (= steps at the metric sum). */
const stepAt = (c: RecoveryCursor, steps: number): number =>
  c.stepInEpoch >= c.stepsPerEpoch ? steps : Math.min(steps, Math.round((c.stepInEpoch / Math.max(1, c.stepsPerEpoch)) * steps))

export interface StepResult {
  /** This rank's mean loss on its batch. */
  readonly loss: number
  readonly samples: number
  /** Correct predictions in the batch (classification losses only). */
  readonly correct?: number
}

export interface EpochResult {
  readonly epoch: number
  /** Mean loss over every rank's samples in the epoch. */
  readonly loss: number
  /** Accuracy over every rank's samples (classification losses only). */
  readonly accuracy?: number
  readonly samples: number
  readonly steps: number
  readonly seconds: number
}

export type FitOptions = FitCommonOptions &
  (
    | {
        /** Per-rank batch size. */
        readonly batchSize: number
        readonly globalBatchSize?: undefined
      }
    | {
        /**
         * Global batch per step, split over the ranks (hetero-batching.ts): in proportion to each
         * rank's measured throughput with collectiveConfig.adaptiveBatching, else equally.
         * floor(dataset size / globalBatchSize) steps per epoch on every rank.
         */
        readonly globalBatchSize: number
        readonly batchSize?: undefined
      }
  )

export interface FitCommonOptions {
  readonly epochs: number
  /** Seed of the per-epoch shuffles (same on every rank). Default 0. */
  readonly seed?: number
  /** First epoch (for a resumed run). Default 0. */
  readonly initialEpoch?: number
  /** Called after every epoch with metrics averaged over ranks. */
  readonly onEpochEnd?: (result: EpochResult) => void | Promise<void>
  /** Called after every step. */
  readonly onStep?: (step: StepResult & { epoch: number; index: number }) => void | Promise<void>
  /**
   * Gradient accumulation: every step runs this many micro-batches of the batch size, adds up
   * their gradients locally and exchanges them once (one all-reduce per k micro-batches): the same
   * update as a k-times larger batch. Default 1.
   */
  readonly accumulationSteps?: number
}

export interface TrainStepOptions {
  /**
   * Compute this batch's gradients and add them up locally, without exchanging or applying them
   * (no communication): the next trainStep() without it exchanges the sum of all accumulated
   * batches and updates once, as if they had been one batch (weighted by their sample counts).
   */
  readonly accumulate?: boolean
}

/** What the fit loop needs of the data-parallel model. */
export interface FitHost {
  readonly tf: tfjs
  readonly sync: GradientSync
  readonly model: LayersModel
  readonly classification: boolean
  readonly observer: StepObserver | undefined
  /** Forward/backward ms of the last step (the batcher's throughput). */
  readonly lastComputeMs: number
  trainStep(x: Tensor, y: Tensor, options: TrainStepOptions): Promise<StepResult>
  lossTargets(y: Tensor, numClasses: number): Tensor
  /** A per-rank batch size as this group uses it (elastic groups). */
  rankBatch(batchSize: number): number
}

/** The loop's position and batching, which the model reads (steps, the learning-rate rule, regroups, metrics). */
export class FitLoop {
  readonly #host: FitHost
  inFit = false
  epoch = 0
  stepInEpoch = 0
  stepsPerEpoch = 0
  /** The nominal global batch of an update (for the learning-rate rule). */
  fitGlobalBatch: number | undefined
  batcher: HeteroBatcher | undefined
  /** The recovery generation dp.fit() last saw, and the operation after which batch exchanges count again. */
  #seenGeneration = 0
  #freshAfterOps = -1

  constructor(host: FitHost) {
    this.#host = host
  }

  /**
   * Trains over this rank's shard for some epochs; the metrics handed to onEpochEnd cover all ranks.
   * The shard is in-memory rows, or a stream (a file dataset, a worker-side loader) whose rows are
   * read in the background and whose position checkpoints keep (core/data/stream.ts).
   * With recovery from peers it also follows regroups: after one the epoch goes on at the furthest
   * survivor's point, cut for the new group (exact with globalBatchSize; with a per-rank batchSize the
   * rest of the epoch is re-sharded at the same fraction); a joining rank skips the epochs and steps
   * the survivors already trained, without computing them, and takes their state where they are.
   */
  async fit(source: FitSource, opts: FitOptions): Promise<EpochResult[]> {
    const tf = this.#host.tf
    if (isStreamingSource(source) && opts.globalBatchSize !== undefined) {
      throw new ConfigError({ field: "fit.globalBatchSize", reason: "a streamed dataset (files, a loader) is read in per-rank parts: give batchSize (per rank) instead" })
    }
    if (opts.globalBatchSize !== undefined) {
      if (!isStreamingSource(source)) this.#prepareBatcher(source, opts.globalBatchSize)
    } else if (!(opts.batchSize >= 1) || !Number.isInteger(opts.batchSize)) {
      throw new ConfigError({ field: "fit.batchSize", reason: `must be an integer >= 1, got ${opts.batchSize}` })
    }
    const k = opts.accumulationSteps ?? 1
    if (!Number.isInteger(k) || k < 1) throw new ConfigError({ field: "fit.accumulationSteps", reason: `must be an integer >= 1, got ${String(opts.accumulationSteps)}` })
    const numClasses = classesOf(source, (this.#host.model.outputs[0]?.shape.at(-1) as number | null) ?? 0)
    const recovery = this.#host.sync.recovery
    const results: EpochResult[] = []
    this.inFit = true
    try {
      for (let epoch = opts.initialEpoch ?? 0; epoch < opts.epochs; epoch++) {
        const started = performance.now()
        this.epoch = epoch
        this.#streamRegroup(source, this.#observeRegroup(source, opts), epoch)
        let { steps, rowsOf } = this.#epochRows(source, opts, epoch)
        this.stepsPerEpoch = steps
        const target = recovery?.joinTarget
        if (target && (!target.inFit || epoch > target.epoch)) {
          throw new PeerRecoveryMisaligned({
            reason: `this joining rank is at epoch ${epoch} of dp.fit(), the survivors ${target.inFit ? `at epoch ${target.epoch}` : "outside dp.fit()"}`
          })
        }
        if (target && epoch < target.epoch) {
          // The survivors trained this epoch: skip it whole (nothing computed, nothing exchanged).
          this.stepInEpoch = steps
          results.push({ epoch, loss: Number.NaN, samples: 0, steps: 0, seconds: 0 })
          continue
        }
        // Sums over the epoch: loss * samples, correct predictions, samples.
        const totals = new Float32Array(3)
        let i = target ? stepAt(target, steps) : 0
        const joinHere = async (): Promise<void> => {
          await recovery!.join()
          this.#observeRegroup(source, opts, target!.ops)
          ;({ steps, rowsOf } = this.#epochRows(source, opts, epoch))
          this.stepsPerEpoch = steps
        }
        if (target && i < steps) {
          this.#streamRegroup(source, target, epoch)
          await joinHere()
        }
        while (i < steps) {
          this.stepInEpoch = i
          // A step's micro-batches (one without accumulation): all but the last are only accumulated.
          const micro = rowsOf(i)
          let r: StepResult = { loss: 0, samples: 0 }
          let stepSamples = 0
          for (let j = 0; j < micro.length; j++) {
            const batchRows = micro[j]!
            const batch = await fitBatch(source, batchRows)
            const { x, y, yLoss } = batchTensors(this.#host.tf as unknown as Tf, batch, this.#host.classification, (t) => this.#host.lossTargets(t, numClasses))
            try {
              r = await this.#host.trainStep(x, yLoss, { accumulate: j < micro.length - 1 })
            } finally {
              tf.dispose([x, y, yLoss])
            }
            totals[1] += r.correct ?? 0
            totals[0] += r.loss * r.samples
            totals[2] += r.samples
            stepSamples += r.samples
          }
          const index = i++
          // A regroup during this step: the group and this rank's share changed, and the epoch goes
          // on where the furthest survivor was, cut for the new group.
          const c = this.#observeRegroup(source, opts)
          if (c) {
            this.#streamRegroup(source, c, epoch)
            ;({ steps, rowsOf } = this.#epochRows(source, opts, epoch))
            this.stepsPerEpoch = steps
            if (c.inFit && c.epoch === epoch) i = Math.min(steps, stepAt(c, steps) + (recovery!.ops - c.ops))
          }
          // Every member's batch-size exchanges start again after the regroup's operation.
          if (!recovery || recovery.ops - 1 > this.#freshAfterOps) await this.batcher?.afterStep(stepSamples, this.#host.lastComputeMs)
          await opts.onStep?.({ ...r, epoch, index })
        }
        this.stepInEpoch = steps
        if (target && recovery?.joinTarget) await joinHere()
        const w0 = performance.now()
        await this.#host.sync.sum(totals)
        this.#host.observer?.wait?.("epoch metrics all-reduce", w0, performance.now())
        const result: EpochResult = {
          epoch,
          loss: totals[0] / Math.max(1, totals[2]),
          ...(this.#host.classification ? { accuracy: totals[1] / Math.max(1, totals[2]) } : {}),
          samples: totals[2],
          steps,
          seconds: (performance.now() - started) / 1000
        }
        results.push(result)
        await opts.onEpochEnd?.(result)
      }
    } finally {
      this.inFit = false
      this.fitGlobalBatch = undefined
    }
    return results
  }

  /**
   * Notices a regroup (or a join) since the last look: a fresh batch split for the new group (its
   * exchanges count from the regroup's operation on every member) and, once, the furthest survivor's
   * position, which the caller moves its epoch cursor to.
   */
  #observeRegroup(source: FitSource, opts: FitOptions, joinedAtOps?: number): RecoveryCursor | undefined {
    const recovery = this.#host.sync.recovery
    if (!recovery || recovery.generation === this.#seenGeneration) return undefined
    this.#seenGeneration = recovery.generation
    if (opts.globalBatchSize !== undefined && !isStreamingSource(source)) this.#prepareBatcher(source, opts.globalBatchSize, true)
    const c = recovery.takeCursor()
    this.#freshAfterOps = c?.ops ?? joinedAtOps ?? recovery.ops - 1
    return c
  }

  /**
   * A streamed dataset's position is exact through a checkpoint (it is saved with it and re-planned
   * for another world size), but a regroup in the middle of an epoch would pair the survivors' step
   * in flight with rows of another plan: the group restarts from the latest checkpoint instead.
   */
  #streamRegroup(source: FitSource, c: RecoveryCursor | undefined, epoch: number): void {
    if (!isStreamingSource(source) || !c || !c.inFit || c.epoch !== epoch || c.stepInEpoch >= c.stepsPerEpoch) return
    throw new PeerRecoveryMisaligned({
      reason: `the group changed at epoch ${epoch}, step ${c.stepInEpoch} of ${c.stepsPerEpoch}, of a streamed dataset, whose position is exact only at a checkpoint`
    })
  }

  #prepareBatcher(source: ShardSource, globalBatch: number, fresh = false): void {
    const p = this.#host.sync.worldSize
    if (!Number.isInteger(globalBatch) || globalBatch < p || globalBatch > source.dataset.size) {
      throw new ConfigError({
        field: "fit.globalBatchSize",
        reason: `must be an integer between the number of workers (${p}) and the dataset size (${source.dataset.size}), got ${globalBatch}`
      })
    }
    if (!fresh && this.batcher?.globalBatch === globalBatch) return
    const allGather = this.#host.sync.allGather?.bind(this.#host.sync)
    this.batcher = new HeteroBatcher({
      rank: this.#host.sync.rank,
      worldSize: p,
      globalBatch,
      adaptive: this.#host.sync.adaptiveBatching === true && allGather !== undefined,
      allGather: allGather ?? (async (b) => b)
    })
  }

  /** An epoch's steps and each step's rows for this rank: per-rank batches, or slices of the global batch. */
  #epochRows(source: FitSource, opts: FitOptions, epoch: number): { steps: number; rowsOf: (step: number) => number[][] } {
    const batcher = this.batcher
    const k = opts.accumulationSteps ?? 1
    if (isStreamingSource(source)) {
      // Streamed: this rank's rows left in the epoch (its part of the plan), taken in order.
      const bs = this.#host.rankBatch(opts.batchSize as number)
      this.fitGlobalBatch = bs * this.#host.sync.worldSize * k
      return streamEpoch(source.openEpoch(epoch, this.#host.sync.rank, this.#host.sync.worldSize), bs, k)
    }
    if (opts.globalBatchSize === undefined || !batcher) {
      const rows = source.rows(epoch)
      const bs = this.#host.rankBatch(opts.batchSize as number)
      this.fitGlobalBatch = bs * this.#host.sync.worldSize * k
      const slice = (m: number): number[] => Array.prototype.slice.call(rows, m * bs, (m + 1) * bs) as number[]
      // Step i: micro-batches i*k .. i*k+k-1 (the epoch's last step may have fewer).
      return {
        steps: Math.ceil(rows.length / (bs * k)),
        rowsOf: (i) => Array.from({ length: Math.min(k, Math.ceil(rows.length / bs) - i * k) }, (_, j) => slice(i * k + j))
      }
    }
    const B = opts.globalBatchSize
    this.fitGlobalBatch = B * k
    const size = source.dataset.size
    const seed = opts.seed ?? (source as { seed?: number }).seed ?? 0
    const perm = shardIndicesWeighted(size, 0, [size], seed, epoch)
    return {
      steps: Math.floor(size / (B * k)),
      rowsOf: (i) => {
        const { offset, size: n } = batcher.slice()
        return Array.from({ length: k }, (_, j) => Array.from(perm.subarray((i * k + j) * B + offset, (i * k + j) * B + offset + n)))
      }
    }
  }

}
