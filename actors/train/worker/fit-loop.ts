// dp.fit(): the epoch loop of the data-parallel model. This rank's shard (in-memory rows, or a
// stream) is cut into steps (per-rank batches, slices of a global batch split by measured
// throughput, micro-batches for gradient accumulation), each step goes through the model's
// trainStep, and the epoch's metrics are summed over the ranks. With recovery from peers it follows
// regroups (the epoch goes on at the furthest survivor's point, cut for the new group; a streamed
// epoch's untrained rows are planned again for it) and joins (a joining rank skips what the
// survivors trained and takes their state where they are).
import type { Tf } from "../../../core/engine.ts"
import { shardIndicesWeighted } from "../../../core/datasets.ts"
import { isStreamingSource, type StreamingSource } from "../../../core/data/stream.ts"
import { replanRegroup, rowsLeft, stepsBeforePlan } from "../../../core/data/plan.ts"
import { ConfigError } from "../../../core/errors.ts"
import { batchTensors, classesOf, fitBatch, streamEpoch, type FitSource, type ShardSource } from "./batches.ts"
import { HeteroBatcher } from "./hetero-batching.ts"
import { PeerRecoveryMisaligned } from "./group-session.ts"
import { strategyOf, type GradientSync, type RecoveryCursor, type StepObserver } from "./gradient-sync.ts"
import type { StreamCursor } from "../common/train-protocol.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type LayersModel = import("@tensorflow/tfjs").LayersModel
type Tensor = import("@tensorflow/tfjs").Tensor

/** The strategies under which dp.fit()'s batcher may leave a rank without rows (hetero-batching.ts allowZero). */
const ROWS_FREE: ReadonlySet<string> = new Set(["allreduce", "local-sgd"])

/** Group operations of one training step: ZeRO's reduction and all-gather, or one reduction. */
const opsPerStep = (sync: { readonly zeroStage?: number }): number => ((sync.zeroStage ?? 0) > 0 ? 2 : 1)

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
  /**
   * Seed of the per-epoch shuffles of an in-memory shard (same on every rank). Default: the
   * Trainer's seed. A streamed dataset is shuffled by the Trainer's seed alone (a ConfigError here).
   */
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
  /**
   * A weight per class for the training loss, as Keras's class_weight: `{ [classId]: weight }` or an
   * array by class; a class not named weighs 1. Each row's loss is multiplied by its class's weight
   * and the batch's mean taken. Needs a classification loss named in compile().
   */
  readonly classWeight?: Readonly<Record<number, number>> | ReadonlyArray<number>
}

export interface TrainStepOptions {
  /**
   * A weight per row of the batch (a tensor or numbers, as Keras's sample_weight): the loss is the
   * mean of each row's loss times its weight. Needs a loss named in compile().
   */
  readonly sampleWeight?: import("@tensorflow/tfjs").Tensor | ArrayLike<number>
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
  /**
   * A step with no rows: this rank's part of the group's exchange, adding nothing (sample weight 0).
   * `idle`: the batcher gave it no rows (under local SGD an inner step with nothing to apply); else
   * a joiner's part in the step the survivors redo (nothing under local SGD).
   */
  emptyStep(idle: boolean): Promise<void>
  lossTargets(y: Tensor, numClasses: number): Tensor
  /** A per-rank batch size as this group uses it (elastic groups). */
  rankBatch(batchSize: number): number
  /** The strategy running now (strategy "auto": the one it moved to; ZeRO runs as "allreduce"). */
  readonly strategyNow: string
}

/** Epoch results a rank keeps (its position carries them to a joiner, whose replay skips those epochs). */
export const EPOCHS_KEPT = 64

/** The loop's position and batching, which the model reads (steps, the learning-rate rule, regroups, metrics). */
export class FitLoop {
  readonly #host: FitHost
  inFit = false
  /** dp.fit() has run on this rank (a loop of dp.fit() calls, not a hand-written one). */
  fitUsed = false
  epoch = 0
  stepInEpoch = 0
  stepsPerEpoch = 0
  /** The nominal global batch of an update (for the learning-rate rule). */
  fitGlobalBatch: number | undefined
  /** A streamed epoch: the plan it was opened with and the rows per micro-batch (a regroup plans the rest again from it). */
  stream: StreamCursor | undefined
  /** The group's figures of the last epochs dp.fit() trained, [epoch, loss, accuracy or NaN, samples, steps] (Position.epochs). */
  readonly epochLog: Array<[number, number, number, number, number]> = []
  /** dp.fit()'s accumulation steps and, for a planned stream, its rows per epoch (stepBase's terms). */
  #accumulation = 1
  #streamRows: number | undefined
  batcher: HeteroBatcher | undefined
  /** The recovery generation dp.fit() last saw, and the operation after which batch exchanges count again. */
  #seenGeneration = 0
  #freshAfterOps = -1

  constructor(host: FitHost) {
    this.#host = host
  }

  /**
   * Steps of the epoch a streamed dataset's open plan was made after (a resume or a regroup
   * mid-epoch planned the rest again, and its steps count from 0): the step numbers the loop's
   * onStep and the progress line show count on from there, not again from 0. 0 otherwise.
   */
  get stepBase(): number {
    const s = this.stream
    return this.inFit && s && this.#streamRows !== undefined ? stepsBeforePlan(s.plan, this.#streamRows, s.batch, this.#accumulation) : 0
  }

  /** stepBase for the plan of a regroup's cursor (the step a joiner redoes with the survivors). */
  #baseOf(c: { readonly stream?: StreamCursor }): number {
    return c.stream && this.#streamRows !== undefined ? stepsBeforePlan(c.stream.plan, this.#streamRows, c.stream.batch, this.#accumulation) : 0
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
    if (isStreamingSource(source) && opts.seed !== undefined) {
      // (its mid-epoch positions in checkpoints are of the order the stream's own seed makes)
      throw new ConfigError({
        field: "fit.seed",
        reason: "a streamed dataset (files, a loader) is shuffled by the Trainer's seed, which its saved positions follow: give new Trainer({ seed }) instead"
      })
    }
    if (opts.globalBatchSize !== undefined) {
      if (!isStreamingSource(source)) this.#prepareBatcher(source, opts.globalBatchSize)
    } else if (!(opts.batchSize >= 1) || !Number.isInteger(opts.batchSize)) {
      throw new ConfigError({ field: "fit.batchSize", reason: `must be an integer >= 1, got ${opts.batchSize}` })
    }
    const k = opts.accumulationSteps ?? 1
    if (!Number.isInteger(k) || k < 1) throw new ConfigError({ field: "fit.accumulationSteps", reason: `must be an integer >= 1, got ${String(opts.accumulationSteps)}` })
    this.#accumulation = k
    this.#streamRows = isStreamingSource(source) ? source.rowsPerEpoch : undefined
    const numClasses = classesOf(source, (this.#host.model.outputs[0]?.shape.at(-1) as number | null) ?? 0)
    const recovery = this.#host.sync.recovery
    const results: EpochResult[] = []
    this.inFit = true
    this.fitUsed = true
    try {
      for (let epoch = opts.initialEpoch ?? 0; epoch < opts.epochs; epoch++) {
        const started = performance.now()
        this.epoch = epoch
        // A regroup noticed here, with the furthest survivor already in this epoch's first step:
        // that step is this rank's to do too, on the plan the old group opened (#oldPlanOf), and
        // the re-plan waits for it.
        const early = this.#observeRegroup(source, opts)
        // A streamed regroup's re-plan that waits for the step the group redoes (this rank does it on the old plan first).
        let pending = early && this.#streamRegroup(source, early, epoch) ? early : undefined
        let { steps, rowsOf } = this.#epochRows(source, opts, epoch, pending && this.#oldPlanOf(pending))
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
          // Its figures are the group's, where the survivors kept them (their position's log), so
          // that a loop deciding on dp.fit()'s result decides as they did; else NaN, none trained here.
          const logged = target.epochs?.find((e) => e[0] === epoch)
          if (logged) this.epochLog.push([epoch, logged[1]!, logged[2]!, logged[3]!, logged[4]!])
          results.push(
            logged
              ? { epoch, loss: logged[1]!, ...(this.#host.classification ? { accuracy: logged[2]! } : {}), samples: logged[3]!, steps: logged[4]!, seconds: 0 }
              : { epoch, loss: Number.NaN, samples: 0, steps: 0, seconds: 0 }
          )
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
        if (target && isStreamingSource(source) && target.stepInEpoch < target.stepsPerEpoch) {
          // Joining a streamed epoch: the survivors' rows of the step they redo were planned
          // without this rank, which takes part in it with none; then the rest is planned again
          // for the new group, this rank included.
          this.#streamRegroup(source, target, epoch)
          await joinHere()
          await this.#host.emptyStep(false)
          ;({ steps, rowsOf } = this.#replanStream(source, opts, target, epoch))
          this.stepsPerEpoch = steps
          i = 0
          // It is this rank's step too: the loop's step callback runs as on the survivors (which
          // may report there), with no rows (loss NaN, samples 0, as a replayed step's).
          await opts.onStep?.({ loss: Number.NaN, samples: 0, epoch, index: this.#baseOf(target) + target.stepInEpoch })
        } else if (target && i < steps) await joinHere()
        // When this rank's previous step (its batcher's measurement included) ended; none at an
        // epoch's start (the epoch's end, its metrics and callbacks, are not a step's work).
        let lastStepEnd: number | undefined
        while (i < steps) {
          this.stepInEpoch = i
          // A step's micro-batches (one without accumulation): all but the last are only accumulated.
          const micro = rowsOf(i)
          let r: StepResult = { loss: 0, samples: 0 }
          let stepSamples = 0
          // Given no rows (the batcher left this rank out: hetero-batching.ts allowZero): its part
          // of the step's exchange, adding nothing, and the same update as every rank.
          const idle = micro.length > 0 && micro.every((m) => m.length === 0)
          if (idle) {
            await this.#host.emptyStep(true)
            r = { loss: Number.NaN, samples: 0 }
          }
          for (let j = 0; j < (idle ? 0 : micro.length); j++) {
            const batchRows = micro[j]!
            const batch = await fitBatch(source, batchRows)
            const { x, y, yLoss } = batchTensors(this.#host.tf as unknown as Tf, batch, this.#host.classification, (t) => this.#host.lossTargets(t, numClasses))
            try {
              r = await this.#host.trainStep(x, yLoss, { accumulate: j < micro.length - 1, ...(batch.w ? { sampleWeight: batch.w } : {}) })
            } finally {
              tf.dispose([x, y, yLoss])
            }
            totals[1] += r.correct ?? 0
            totals[0] += r.loss * r.samples
            totals[2] += r.samples
            stepSamples += r.samples
          }
          const index = i++
          // (its number in the epoch, on the plan it was taken from: a regroup below may plan again)
          const stepNumber = this.stepBase + index
          // A regroup during this step: the group and this rank's share changed, and the epoch goes
          // on where the furthest survivor was, cut for the new group.
          const c = this.#observeRegroup(source, opts)
          if (c && isStreamingSource(source)) {
            // The furthest survivor redid step c.stepInEpoch in the new group; a rank behind it
            // (it took that survivor's state for this step) does that step next, on the old plan.
            if (this.#streamRegroup(source, c, epoch)) {
              pending = c
              // Taking the survivor's state put its data position back (train-context.ts adopt),
              // which closes the open plan: the step still to do here is read from the old one.
              if (index < c.stepInEpoch) ({ steps, rowsOf } = this.#epochRows(source, opts, epoch, this.#oldPlanOf(c)))
            }
          } else if (c) {
            ;({ steps, rowsOf } = this.#epochRows(source, opts, epoch))
            this.stepsPerEpoch = steps
            // Steps this rank made in the new group since the furthest survivor's position: this one
            // where it redid it there, none where that survivor's state held it (ZeRO makes two
            // group operations a step: the reduction and the all-gather). At most this step: the
            // regroup came in it, and strategy auto's decision round, a group operation before the
            // step, is not one (survivors parked in it that counted it skipped a step of the epoch,
            // and a rank that joined there did not: their loops then broke apart).
            if (c.inFit && c.epoch === epoch) i = Math.min(steps, stepAt(c, steps) + Math.min(1, Math.round((recovery!.ops - c.ops) / opsPerStep(this.#host.sync))))
          }
          if (pending && index >= pending.stepInEpoch && isStreamingSource(source)) {
            ;({ steps, rowsOf } = this.#replanStream(source, opts, pending, epoch))
            this.stepsPerEpoch = steps
            pending = undefined
            i = 0
          }
          // Every member's batch-size exchanges start again after the regroup's operation.
          // The step's whole time on this rank (its exchange and update, the batch's preparation,
          // the step callback), which the batcher compares splits by where its model cannot tell.
          const wallMs = lastStepEnd === undefined || c ? Number.NaN : performance.now() - lastStepEnd
          if (!recovery || recovery.ops - 1 > this.#freshAfterOps) await this.batcher?.afterStep(stepSamples, idle ? 0 : this.#host.lastComputeMs, wallMs)
          lastStepEnd = performance.now()
          await opts.onStep?.({ ...r, epoch, index: stepNumber })
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
        this.epochLog.push([epoch, result.loss, result.accuracy ?? Number.NaN, result.samples, result.steps])
        if (this.epochLog.length > EPOCHS_KEPT) this.epochLog.splice(0, this.epochLog.length - EPOCHS_KEPT)
        await opts.onEpochEnd?.(result)
      }
    } finally {
      this.inFit = false
      this.fitGlobalBatch = undefined
      this.stream = undefined
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
   * Whether a regroup at `c` falls in the middle of this streamed epoch, where the rest of it is
   * planned again (#replanStream). A source without a plan to cut again (a loader) throws: its
   * position is exact only at a checkpoint, and the group restarts from the latest one instead.
   */
  #streamRegroup(source: FitSource, c: RecoveryCursor | undefined, epoch: number): boolean {
    if (!isStreamingSource(source) || !c || !c.inFit || c.epoch !== epoch || c.stepInEpoch >= c.stepsPerEpoch) return false
    const sync = this.#host.sync
    // One exchange a step (the all-reduce): local SGD's ranks train apart between rounds, and
    // the servers (or auto, which may move to them) take steps that no survivor's position counts.
    const stepSynchronous = strategyOf(sync) === "allreduce"
    if (stepSynchronous && c.stream && source.restorePlan && sync.recovery?.survivorRanks) return true
    const missing = !source.restorePlan
      ? "a streamed dataset that has no plan to cut again (a loader's position is exact only at a checkpoint)"
      : !stepSynchronous
        ? "a streamed dataset, whose rest is planned again only where every step is one exchange of the group (the all-reduce)"
        : !c.stream
        ? "a streamed dataset, and the furthest survivor did not say which plan its group read"
        : "a streamed dataset, and this rank's placement does not say which ranks survived"
    throw new PeerRecoveryMisaligned({ reason: `the group changed at epoch ${epoch}, step ${c.stepInEpoch} of ${c.stepsPerEpoch}, of ${missing}` })
  }

  /**
   * Where a regroup noticed at the start of a streamed epoch (#streamRegroup holds for `c`) finds
   * the furthest survivor in the epoch's first step: this rank does that step too, as the old group
   * planned it (its old rank and size, the cursor's plan and batch), before the rest is planned again.
   */
  #oldPlanOf(c: RecoveryCursor): { rank: number; cursor: StreamCursor } | undefined {
    const rank = this.#host.sync.recovery!.survivorRanks![this.#host.sync.rank]
    return rank === undefined ? undefined : { rank, cursor: c.stream! }
  }

  /**
   * A regroup in the middle of a streamed epoch: the rest of it planned again for the new group,
   * from the plan the old group read (the furthest survivor's cursor) and what each old rank trained
   * of it: the survivors through the step the group redid (c.stepInEpoch), a lost rank through the
   * step before (its rows of the redone step never reached the group). Every member computes the
   * same plan; nothing is trained twice or left out (core/data/plan.ts replanRegroup).
   */
  #replanStream(source: StreamingSource, opts: FitOptions, c: RecoveryCursor, epoch: number): { steps: number; rowsOf: (step: number) => number[][] } {
    const s = c.stream!
    const k = opts.accumulationSteps ?? 1
    const left = rowsLeft(s.plan)
    const through = (steps: number): number => s.plan.consumed + Math.min(left, steps * k * s.batch)
    const kept = new Set(this.#host.sync.recovery!.survivorRanks)
    const trained = Array.from({ length: s.plan.worldSize }, (_, r) => through(kept.has(r) ? c.stepInEpoch + 1 : c.stepInEpoch))
    source.restorePlan!(replanRegroup(s.plan, trained, this.#host.sync.worldSize))
    return this.#epochRows(source, opts, epoch)
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
      // The all-reduce applies the same update on every rank whatever its rows, and local SGD's
      // rounds weight each rank's delta by its samples (a rank without rows takes the others'); a
      // server's steps would leave a rank without rows behind. Asked at every exchange: strategy
      // "auto" may run one of them now and something else later (it does not move while a rank
      // has no rows: strategies/auto.ts).
      allowZero: () => ROWS_FREE.has(this.#host.strategyNow),
      allGather: allGather ?? (async (b) => b)
    })
  }

  /** An epoch's steps and each step's rows for this rank: per-rank batches, or slices of the global batch. */
  #epochRows(source: FitSource, opts: FitOptions, epoch: number, old?: { rank: number; cursor: StreamCursor }): { steps: number; rowsOf: (step: number) => number[][] } {
    const batcher = this.batcher
    const k = opts.accumulationSteps ?? 1
    if (isStreamingSource(source)) {
      // Streamed: this rank's rows left in the epoch (its part of the plan), taken in order; or
      // its rows of the old group's plan, for the step that group was in at a regroup.
      if (old) source.restorePlan!(old.cursor.plan)
      const bs = old ? old.cursor.batch : this.#host.rankBatch(opts.batchSize as number)
      const p = old ? old.cursor.plan.worldSize : this.#host.sync.worldSize
      this.fitGlobalBatch = bs * p * k
      const left = source.openEpoch(epoch, old ? old.rank : this.#host.sync.rank, p)
      const plan = source.openedPlan?.()
      this.stream = plan ? { plan, batch: bs } : undefined
      return streamEpoch(left, bs, k)
    }
    if (opts.globalBatchSize === undefined || !batcher) {
      const rows = source.rows(epoch, opts.seed)
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
