// The data-parallel model wrapper behind TrainContext.prepareModel: every step computes this
// rank's gradients, all-reduces them (weighted by sample counts, so unequal batches still give
// the large-batch SGD update) and applies the same update on every rank. Ranks start from rank 0's
// weights and apply bitwise-identical reduced gradients, so their weights stay identical.
//
// Gradients leave the tfjs engine as ONE flat Float32Array (concatenated on the device, one read;
// or, on host-memory backends with compression, read per variable into the reducer's own buffer),
// buckets are contiguous ranges of it (no packing copy), and the reduced values go back per
// variable from views of it: two copies of the gradient per step, the minimum a backend with its
// own memory (wasm, tensorflow) allows.
import { fusedAdamStep } from "../../core/kernels/fused-adam.ts"
import * as os from "node:os"
import { createHash } from "node:crypto"
import type { Tf } from "../../core/engine.ts"
import { shardIndicesWeighted } from "../../core/datasets.ts"
import { isStreamingSource } from "../../core/data/stream.ts"
import { batchTensors, classesOf, fitBatch, streamEpoch, type FitSource, type ShardSource } from "./batches.ts"
import { HeteroBatcher } from "./hetero-batching.ts"
import { ConfigError } from "../../core/errors.ts"
import { PeerRecoveryMisaligned, type LoopPosition, type RecoverableModel } from "./group-session.ts"
import { OPTIMIZER_FILE, loadOptimizerFrom, readOptimizerFile, loadWeightsInto, modelToFiles, optimizerToFile } from "../../core/model-io.ts"
import type { PeerState } from "./train-protocol.ts"
import { lrRuleOf, type LrRule, type LrRuleOptions } from "./optim/lr-rules.ts"
import { flatOptimizerSpecOf, type FlatOptimizerSpec, type FlatOptimizerState } from "./optim/flat-optimizers.ts"
import { chooseStrategy, onServers, type StrategyName } from "../../scheduler/strategy-choice.ts"
import { hasPsFiles, psWholeState } from "./ps-client.ts"
import { ZeroShard, hasShards, readShards, reshard, shardLayout, type ZeroStage } from "./optim/zero.ts"
import { flatStateFromTfjs, readTfjsOptimizerWeights, tfjsWeightsFromFlat, writeTfjsOptimizerWeights } from "./optim/tfjs-state.ts"
import { LOCAL_SGD_FILE, LocalSgd, settlingSync } from "./local-sgd.ts"
import { decodeMessage, encodeMessage } from "../../core/wire.ts"
import type { LocalSgdSettings } from "./optim/outer-optimizer.ts"
import type { LossFn, LossName } from "./model-parallel/loss.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type LayersModel = import("@tensorflow/tfjs").LayersModel

/** The CPU ms this machine's cores have been busy (everything but idle and iowait) since boot. */
const machineBusyMs = (): number => {
  let busy = 0
  for (const c of os.cpus()) busy += c.times.user + c.times.nice + c.times.sys + c.times.irq
  return busy
}

/** This machine, as a number that survives a Float32Array exchange exactly (24 bits of a hash of the host name). */
const hostHash = createHash("sha1").update(os.hostname()).digest().readUIntBE(0, 3)

/** The longest trainStep() holds the event loop across steps before it lets timers run. */
const YIELD_EVERY_MS = 50

/** A prepared model's checkpoint file of its own: the update counter, the ZeRO stage and the world size it was saved at. */
export const DP_STATE_FILE = "data-parallel.json"
type Optimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable

// The same loss names and functions as the pipeline's last stage takes.
export type { LossFn, LossName }

/** One variable's place in the flat gradient buffer. */
export interface GradientSlot {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly offset: number
  readonly size: number
}

/** What the wrapper needs from the group: the worker wires it to the communicator. */
export interface GradientSync {
  readonly rank: number
  readonly worldSize: number
  /**
   * Reduces the flat gradient in place to the weighted mean over ranks (weight: this rank's sample
   * count). After the group was re-formed meanwhile (recovery from peers): "adopted" when this rank
   * took a survivor's state, which already contains this step (nothing is to be applied);
   * "recompute" when the step is to be done again in the new group (the buffer holds partial sums
   * of the old one).
   */
  reduceGradients(flat: Float32Array, layout: ReadonlyArray<GradientSlot>, weight: number, step: number, scope?: string): Promise<void | "adopted" | "recompute">
  /** Copies rank 0's values into `buf` on every rank. */
  broadcast(buf: Float32Array): Promise<void>
  /** Element-wise sum over ranks, in place. */
  sum(buf: Float32Array): Promise<void>
  /**
   * A flat gradient buffer of n elements that reduceGradients works on in place (faster with
   * compression: GradientReducer.gradientBuffer), or undefined to pass any Float32Array.
   */
  gradientBuffer?(n: number): Float32Array | undefined
  /** Gathers every rank's buffer in rank order (heterogeneity-aware batching exchanges throughputs). */
  allGather?(buf: Float32Array): Promise<Float32Array>
  /** collectiveConfig.adaptiveBatching: fit({ globalBatchSize }) splits by measured throughput. */
  readonly adaptiveBatching?: boolean
  /**
   * Elastic groups (scalingConfig.numWorkers { min, max }): "keep-global" scales a per-rank
   * batchSize by maxWorkers / worldSize so the global batch stays that of the full group;
   * "keep-per-worker" keeps the rank's batch and scales the learning rate by worldSize / maxWorkers.
   */
  readonly elastic?: { readonly maxWorkers: number; readonly batch: "keep-global" | "keep-per-worker" }
  /** Recovery from surviving peers (actors/train/group-session.ts); absent: a failure restarts from the checkpoint. */
  readonly recovery?: PeerRecovery
  /** collectiveConfig.zeroStage: 1 and 2 shard the optimizer state (optim/zero.ts). Default 0. */
  readonly zeroStage?: ZeroStage
  /**
   * Stage 2: reduces `buf` (a multiple of worldSize long) to the weighted mean over ranks and
   * returns this rank's segment of it (segment r of p equal ones), a view of `buf`.
   */
  reduceScatter?(buf: Float32Array, weight: number): Promise<Float32Array>
  /** Every rank's `segment` (equal lengths) into `out`, in rank order. */
  allGatherInto?(segment: Float32Array, out: Float32Array): Promise<void>
  /** collectiveConfig.strategy "parameter-server" (or "auto"): the servers (ps-client.ts). */
  readonly ps?: ParameterServers
  /**
   * collectiveConfig.strategy "auto": training starts on the all-reduce and, from measured compute
   * and communication times, moves to the servers (backup workers, or SSP) and back
   * (scheduler/strategy-choice.ts); rank 0 explains every decision.
   */
  readonly auto?: { readonly numServers: number; explain(text: string, json: Record<string, unknown>, summary: string): void }
  /**
   * collectiveConfig.strategy "local-sgd": steps apply their gradients locally; every syncEvery
   * steps the parameter deltas are averaged through reduceGradients (scoped per fragment) and the
   * outer optimizer applied (local-sgd.ts).
   */
  readonly localSgd?: LocalSgdSettings
  /** Bytes this rank's reductions put on the wire so far, and as dense fp32 (the reducer's stats). */
  wireStats?(): { readonly totalWireBytes: number; readonly totalDenseBytes: number }
}

/** What the data-parallel model needs of the parameter servers (PsClient implements it, ps-client.ts). */
export interface ParameterServers {
  readonly numServers: number
  init(flat: Float32Array, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number): Promise<void>
  pushPull(
    worker: number,
    step: number,
    grad: Float32Array,
    weight: number,
    learningRate: number | undefined
  ): Promise<{ readonly params: Float32Array; readonly staleness: number; readonly dropped: boolean; readonly version: number; readonly serverMs: number | undefined }>
  pull(n: number): Promise<Float32Array>
  stateFiles(): Promise<Record<string, Uint8Array>>
  /** Re-initialises the servers from a checkpoint's parameter-server files; false when it has none. */
  restore(files: Readonly<Record<string, Uint8Array>>, n: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number): Promise<boolean>
  finish(worker: number): Promise<void>
  /** The mode the servers were configured with, and their backup workers (sync). */
  readonly mode: "sync" | "async" | "ssp"
  readonly backupWorkers: number
  takeOver(flat: Float32Array, optimizer: FlatOptimizerState, learningRate: number, spec: FlatOptimizerSpec, numWorkers: number, weightDecay: number, as: { readonly mode: "sync" | "async" | "ssp"; readonly backupWorkers: number }): Promise<void>
  wholeState(n: number): Promise<{ readonly params: Float32Array; readonly optimizer: FlatOptimizerState }>
  /** Gradient bytes pushed (last step: every server's message; totals), as ReducerStats counts the all-reduce's. */
  readonly pushStats?: { readonly wireBytes: number; readonly denseBytes: number; readonly steps: number; readonly totalWireBytes: number; readonly totalDenseBytes: number }
}

/** Strategy "auto": the first decision (steps before it measure the all-reduce), its window and how often it is taken again. */
const AUTO_FIRST_DECISION = 12
/** The first round only measures (its window is warm-up); the first choice is made at this clock. */
const AUTO_FIRST_CHOICE = 24
const AUTO_WINDOW = 10
const AUTO_EVERY = 48
/** Rounds a strategy's measured rate stands in for its prediction. */
const AUTO_REMEMBER = 4

/** Where a loop is in dp.fit(): the group operations done, the epoch and the step in it. */
export interface RecoveryCursor {
  readonly ops: number
  readonly inFit: boolean
  readonly epoch: number
  readonly stepInEpoch: number
  readonly stepsPerEpoch: number
}

/** What dp.fit() needs of the group session to skip, join and follow regroups. */
export interface PeerRecovery {
  /** Bumped at every regroup and join. */
  readonly generation: number
  readonly ops: number
  /** A joining rank's target: the survivors' position; undefined once joined. */
  readonly joinTarget: RecoveryCursor | undefined
  /** The joining rank reached the target: take the survivors' state. */
  join(): Promise<void>
  /** After a regroup, where the furthest survivor was (once). */
  takeCursor(): RecoveryCursor | undefined
  /** A trainStep() outside dp.fit(): a joining rank skips the survivors' steps, then joins them. */
  replayStep(): Promise<"skip" | "run">
  /** A training step completed. */
  countStep(): void
}

/** Strategy "auto": whether a strategy trains through the parameter servers. */

/** Step index of a cursor's position in an epoch cut into `steps` steps (= steps at the metric sum). */
const stepAt = (c: RecoveryCursor, steps: number): number =>
  c.stepInEpoch >= c.stepsPerEpoch ? steps : Math.min(steps, Math.round((c.stepInEpoch / Math.max(1, c.stepsPerEpoch)) * steps))

/**
 * Optional timing hooks (the timeline and the report's compute/communication split), all in
 * performance.now() milliseconds. "step" encloses the three others; it is reported last.
 */
export interface StepObserver {
  phase?(name: "step" | "forward_backward" | "allreduce" | "apply", startMs: number, endMs: number, step: number): void
  /** A collective outside any step (initial weight broadcast, epoch-end metric sum): time spent on the group. */
  wait?(name: string, startMs: number, endMs: number): void
}

export interface PrepareOptions extends LrRuleOptions {
  /** Default: the model's compile() optimizer. */
  readonly optimizer?: Optimizer
  /**
   * Decoupled weight decay (AdamW-style, as torch.optim.AdamW): before each update every weight is
   * multiplied by 1 - learningRate * weightDecay. With any optimizer. Default 0.
   */
  readonly weightDecay?: number
  /** Default: the model's compile() loss. */
  readonly loss?: LossName | LossFn
  /**
   * Simulated heterogeneity (tests, benchmarks): this rank sleeps this many ms per sample after
   * forward/backward, inside the measured compute time, like a slower device. Default 0.
   */
  readonly simulatedDelayMsPerSample?: number
}

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

/** A source of rows per epoch (in memory, or streamed: batches.ts). */
export type { FitSource, ShardSource } from "./batches.ts"

const resolveLoss = (tf: Tf, model: LayersModel, loss: PrepareOptions["loss"]): { fn: LossFn; classification: boolean; sparse: boolean } => {
  const l = loss ?? (model as unknown as { loss?: unknown }).loss
  if (typeof l === "function") return { fn: l as LossFn, classification: false, sparse: false }
  const t = tf as unknown as tfjs
  switch (l) {
    case "categoricalCrossentropy":
      return { fn: (yt, yp) => t.metrics.categoricalCrossentropy(yt, yp).mean() as Scalar, classification: true, sparse: false }
    case "sparseCategoricalCrossentropy":
      return {
        fn: (yt, yp) =>
          t.tidy(() => t.metrics.categoricalCrossentropy(t.oneHot(yt.flatten().toInt(), yp.shape[yp.shape.length - 1] as number), yp).mean() as Scalar),
        classification: true,
        sparse: true
      }
    case "meanSquaredError":
      return { fn: (yt, yp) => t.losses.meanSquaredError(yt, yp) as Scalar, classification: false, sparse: false }
    case "binaryCrossentropy":
      return { fn: (yt, yp) => t.metrics.binaryCrossentropy(yt, yp).mean() as Scalar, classification: false, sparse: false }
    default:
      throw new ConfigError({
        field: "prepareModel.loss",
        reason:
          `no usable loss (got ${JSON.stringify(l)}): compile the model with one of "categoricalCrossentropy", ` +
          `"sparseCategoricalCrossentropy", "meanSquaredError", "binaryCrossentropy", or pass { loss: (yTrue, yPred) => scalar }`
      })
  }
}

export class DataParallelModel implements RecoverableModel {
  readonly model: LayersModel
  readonly optimizer: Optimizer
  readonly layout: ReadonlyArray<GradientSlot>
  readonly parameterCount: number
  #tf: tfjs
  #sync: GradientSync
  #loss: LossFn
  #classification: boolean
  #sparse: boolean
  #vars: Variable[]
  #observer: StepObserver | undefined
  #delayMsPerSample = 0
  #lastComputeMs = 0
  #batcher: HeteroBatcher | undefined
  #step = 0
  #epoch = 0
  #stepInEpoch = 0
  #stepsPerEpoch = 0
  #inFit = false
  #inStep = false
  #baseLearningRate: number | undefined
  #lrRule: LrRule | undefined
  #lastLearningRate: number | undefined
  #weightDecay = 0
  /** ZeRO stage 1/2: this rank's parameter segment and its optimizer state. */
  #zero: ZeroShard | undefined
  /** Strategy "local-sgd": the outer loop (local-sgd.ts). */
  #localSgd: LocalSgd | undefined
  /** Gradient accumulation: sample-weighted sums of the micro-batches' gradients since the last exchange. */
  #acc: Record<string, Tensor> | undefined
  #accSamples = 0
  #accComputeMs = 0
  /** dp.fit(): the nominal global batch of an update (for the learning-rate rule). */
  #fitGlobalBatch: number | undefined
  /** The parameter-server strategy: the workers' optimizer as the servers run it, and staleness counters. */
  #psSpec: FlatOptimizerSpec | undefined
  #psStaleness = { sum: 0, max: 0, steps: 0, dropped: 0 }
  /** Strategy "auto": what runs now, and this rank's recent compute and all-reduce times (ms, -1: not measured). */
  #strategy: StrategyName = "allreduce"
  #computeLog: number[] = []
  /** strategy "auto": when the last decision round was, and the machine's busy CPU ms then. */
  #cpuMark: { at: number; busy: number; own: number } | undefined
  #commLog: number[] = []
  #allReduceMs: number | undefined
  /** Strategy "auto" on the servers: this rank's push-pull ms per step, and the group's measured price of one. */
  #psLog: number[] = []
  #pushPullMs: number | undefined
  /** Strategy "auto": the busiest server's CPU ms per push, as the servers last reported it. */
  #serverMs: number | undefined
  #switches = 0
  /**
   * The group's progress in synchronous steps' worth of gradients (globalStep): one per
   * all-reduce step; on the servers, the updates they applied times the gradients in one, over p.
   */
  #global = 0
  /** Strategy "auto" on the servers: the group step and #step when training moved there (their version was 0 then). */
  #globalBase = 0
  #syncBase = 0
  /**
   * Strategy "auto": the decision clock's next point (the same on every rank). Inside dp.fit() the
   * clock is this rank's trainStep calls (dp.fit gives every rank the same steps); outside it, the
   * group step, which every rank reaches whatever steps it took itself.
   */
  #nextDecision = AUTO_FIRST_DECISION
  #calls = 0
  /**
   * Strategy "auto": where the current measuring window began (performance.now() and the group
   * step; undefined until the second step), and the rates measured per strategy with the round
   * they were measured in (forgotten after AUTO_REMEMBER rounds, so a changed group is tried again).
   */
  #mark: { at: number; global: number } | undefined
  #measured = new Map<StrategyName, { rate: number; round: number }>()
  #rounds = 0
  /** When trainStep last gave the event loop a turn (performance.now()). */
  #lastTurn = performance.now()
  /** The recovery generation dp.fit() last saw, and the operation after which batch exchanges count again. */
  #seenGeneration = 0
  #freshAfterOps = -1
  /**
   * Take the flat-gradient exchange path even with one worker (benchmarks use it to measure that
   * path's cost; a single worker otherwise applies its gradients in place).
   */
  exchangeAlone = false
  /** Called after every step (live progress). */
  onStep: ((info: { epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }) => void) | undefined

  private constructor(tf: Tf, model: LayersModel, sync: GradientSync, opts: PrepareOptions, observer?: StepObserver) {
    this.#tf = tf as unknown as tfjs
    this.model = model
    // Local SGD with overlap: a fragment's round in flight is merged before any other group operation.
    this.#sync = sync.localSgd ? settlingSync(sync, () => this.#localSgd?.settle() ?? Promise.resolve()) : sync
    const optimizer = opts.optimizer ?? (model as unknown as { optimizer?: Optimizer }).optimizer
    if (!optimizer) {
      throw new ConfigError({
        field: "prepareModel.optimizer",
        reason: "no optimizer: compile the model (model.compile({ optimizer, loss })) or pass prepareModel(model, { optimizer })"
      })
    }
    this.optimizer = optimizer
    const loss = resolveLoss(tf, model, opts.loss)
    this.#loss = loss.fn
    this.#classification = loss.classification
    this.#sparse = loss.sparse
    this.#vars = model.trainableWeights.map((w) => w.read() as Variable)
    let offset = 0
    this.layout = this.#vars.map((v) => {
      const size = v.size
      const slot = { name: v.name, shape: [...v.shape], offset, size }
      offset += size
      return slot
    })
    this.parameterCount = offset
    this.#observer = observer
    this.#delayMsPerSample = opts.simulatedDelayMsPerSample ?? 0
    this.#lrRule = lrRuleOf(opts)
    const wd = opts.weightDecay ?? 0
    if (!Number.isFinite(wd) || wd < 0) throw new ConfigError({ field: "prepareModel.weightDecay", reason: `must be a number >= 0, got ${String(opts.weightDecay)}` })
    this.#weightDecay = wd
    if ((this.#lrRule || wd > 0) && typeof (optimizer as unknown as { learningRate?: unknown }).learningRate !== "number") {
      throw new ConfigError({
        field: this.#lrRule ? "prepareModel.lrScaling" : "prepareModel.weightDecay",
        reason: "needs the optimizer's learning rate, and this optimizer has no numeric learningRate (use a tf.train optimizer)"
      })
    }
    this.#baseLearningRate = (optimizer as unknown as { learningRate?: number }).learningRate
    const stage = sync.zeroStage ?? 0
    if (stage !== 0 && stage !== 1 && stage !== 2) throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: `must be 0, 1 or 2, got ${String(stage)}` })
    if (sync.localSgd && !sync.auto && (stage > 0 || sync.ps)) {
      throw new ConfigError({
        field: stage > 0 ? "collectiveConfig.zeroStage" : "collectiveConfig.strategy",
        reason: `strategy "local-sgd" keeps every rank's whole parameters and inner optimizer state and averages parameter deltas; it does not combine with ${stage > 0 ? `zeroStage ${stage}: use zeroStage 0` : "parameter servers"}`
      })
    }
    if (sync.ps) {
      if (stage > 0) throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: "the parameter servers hold the optimizer state already: use zeroStage 0 with strategy \"parameter-server\"" })
      this.#psSpec = flatOptimizerSpecOf(optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0])
    }
    if (stage > 0) {
      if (!sync.allGatherInto || (stage === 2 && !sync.reduceScatter)) {
        throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: `stage ${stage} needs the group's reduce-scatter and all-gather, which this group does not offer` })
      }
      this.#zero = new ZeroShard(stage as 1 | 2, flatOptimizerSpecOf(optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0]), this.parameterCount, sync.rank, sync.worldSize)
    }
  }

  /**
   * Wraps a model and makes every rank start from rank 0's weights.
   * @internal A training loop calls ctx.prepareModel, which supplies the group's gradient sync.
   */
  static async prepare(tf: Tf, model: LayersModel, sync: GradientSync, opts: PrepareOptions = {}, observer?: StepObserver): Promise<DataParallelModel> {
    const dp = new DataParallelModel(tf, model, sync, opts, observer)
    dp.#applyElasticLearningRate()
    await dp.syncWeights()
    await dp.#loadZeroParams()
    await dp.#initServers()
    await dp.#initLocalSgd()
    return dp
  }

  /** Whether this step goes through the parameter servers. */
  get #viaServers(): boolean {
    return this.#sync.ps !== undefined && (this.#sync.auto === undefined || onServers(this.#strategy))
  }

  /** @internal whether steps go through the parameter servers now (ctx.communicationStats() reads it) */
  get viaServers(): boolean {
    return this.#viaServers
  }

  /**
   * How far the group has trained, in synchronous steps' worth of gradients (TensorFlow's
   * global_step): one per all-reduce step; on parameter servers, the updates they applied times the
   * gradients in each (p - backupWorkers for a sync step, one for async and SSP) over p. A rank
   * that backup workers or asynchronous updates leave behind reads the group's progress here, not
   * its own steps; every rank agrees on it up to the updates it has not heard of yet.
   */
  get globalStep(): number {
    return Math.floor(this.#global + 1e-9)
  }

  /** The strategy this model trains with now ("allreduce", or with "auto" also "backup", "ssp" or "async"; "parameter-server" when fixed). */
  get strategy(): string {
    return this.#sync.auto ? this.#strategy : this.#sync.ps ? "parameter-server" : this.#localSgd ? "local-sgd" : "allreduce"
  }

  /** Parameter servers: rank 0 gives them the (broadcast) weights and the optimizer; every rank waits until they have them. */
  async #initServers(files?: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const ps = this.#sync.ps
    // Strategy "auto" starts on the all-reduce: the servers get the state when training moves to them.
    if (!ps || this.#sync.auto) return
    if (this.#sync.rank === 0) {
      const restored = files ? await ps.restore(files, this.parameterCount, this.#psSpec!, this.#sync.worldSize, this.#weightDecay) : false
      if (!restored) await ps.init(await this.#readFlatParams(), this.#psSpec!, this.#sync.worldSize, this.#weightDecay)
    }
    // A barrier: nobody pushes (or pulls) before rank 0 set the servers up.
    await this.#sync.sum(new Float32Array(1))
    if (files) this.#assignFlat(await ps.pull(this.parameterCount))
  }

  /** Strategy "local-sgd": the outer loop starts from the broadcast weights (its anchor). */
  async #initLocalSgd(): Promise<void> {
    const settings = this.#sync.localSgd
    // Strategy "auto" starts on the all-reduce and moves to local SGD when the link bounds training.
    if (!settings || (this.#sync.auto && this.#strategy !== "local-sgd")) return
    const params = await this.#readFlatParams()
    this.#localSgd = new LocalSgd(settings, {
      layout: this.layout,
      readParams: () => this.#readFlatParams(),
      writeParams: (flat) => this.#assignFlat(flat),
      reduce: (buf, layout, weight, round, scope) => this.#sync.reduceGradients(buf, layout as ReadonlyArray<GradientSlot>, weight, round, scope),
      observe: (name, start, end) => this.#observer?.wait?.(name, start, end),
      ...(this.#sync.wireStats ? { wireStats: () => this.#sync.wireStats!() } : {})
    }, params)
  }

  /** The trainable weights as one flat vector, read asynchronously (what a GPU backend needs). */
  async #readFlatParams(): Promise<Float32Array> {
    const tf = this.#tf
    const flatT = tf.tidy(() => tf.concat(this.#vars.map((v) => v.reshape([-1]))))
    const flat = (await flatT.data()) as Float32Array
    flatT.dispose()
    return flat
  }

  /** Loads a flat vector into the trainable weights (one copy into the engine per variable). */
  #assignFlat(flat: Float32Array): void {
    const tf = this.#tf
    this.layout.forEach((s, i) => {
      const t = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape as number[], "float32")
      this.#vars[i]!.assign(t)
      t.dispose()
    })
  }

  /** The parameter-server strategy: tells the servers this rank's loop ended (sync and ssp steps stop waiting for it). */
  async finish(): Promise<void> {
    await this.#localSgd?.settle()
    await this.#sync.ps?.finish(this.#sync.rank)
    // Strategy "auto" on the servers: ranks that are still training may be waiting in a decision
    // (or reach one); this rank takes part in the group's decision rounds, changing nothing, until
    // every rank has finished.
    if (this.#sync.auto && onServers(this.#strategy)) while (!(await this.#decisionRound(true)).allFinishing);
  }

  /** collectiveConfig.zeroStage as this model runs it. */
  get zeroStage(): ZeroStage {
    return this.#zero?.stage ?? 0
  }

  /** ZeRO: takes this rank's parameter segment from the model's weights (after a broadcast or a restore). */
  async #loadZeroParams(): Promise<void> {
    if (this.#zero) this.#zero.loadParams(await this.#readFlatParams())
  }

  /** The learning rate's factor under the elastic "keep-per-worker" policy (1 otherwise), or prepareModel's rule. */
  get learningRateScale(): number {
    if (this.#lrRule) return this.#lastLearningRate !== undefined && this.#baseLearningRate ? this.#lastLearningRate / this.#baseLearningRate : 1
    const e = this.#sync.elastic
    return e && e.batch === "keep-per-worker" ? this.#sync.worldSize / e.maxWorkers : 1
  }

  /** Scales the optimizer's learning rate by worldSize / maxWorkers (the linear rule) for "keep-per-worker". */
  #applyElasticLearningRate(): void {
    const e = this.#sync.elastic
    // prepareModel's lrScaling follows the global batch itself, which "keep-per-worker" changes.
    if (!e || e.batch !== "keep-per-worker" || this.#lrRule) return
    const o = this.optimizer as unknown as { learningRate?: unknown; setLearningRate?: (lr: number) => void }
    if (typeof o.learningRate !== "number") {
      throw new ConfigError({
        field: "scalingConfig.elasticBatch",
        reason: `"keep-per-worker" rescales the learning rate, but this optimizer has no numeric learningRate; use "keep-global"`
      })
    }
    // The constructor kept the optimizer's own rate as the base.
    const lr = (this.#baseLearningRate as number) * this.learningRateScale
    if (typeof o.setLearningRate === "function") o.setLearningRate(lr)
    else o.learningRate = lr
  }

  // --------------------------------------------------------------------------------------------
  // Recovery from surviving peers (the group session calls these, group-session.ts)

  /** The state other members of a regrouped generation take: weights, optimizer state, step counter. */
  async snapshot(): Promise<Omit<PeerState, "position">> {
    if (this.#zero) {
      throw new PeerRecoveryMisaligned({ reason: "with ZeRO each rank holds only its shard of the optimizer state, so no survivor holds the whole of it" })
    }
    const files = {
      ...(await modelToFiles(this.#tf as unknown as Tf, this.model)),
      [OPTIMIZER_FILE]: await optimizerToFile(this.optimizer),
      ...(this.#localSgd ? { [LOCAL_SGD_FILE]: this.#localSgd.stateFile(this.#inStep) } : {})
    }
    // Steps completed: a step in flight (this rank is parked in its reduction) does not count yet.
    return { files, step: this.#step - (this.#inStep ? 1 : 0) }
  }

  /** Takes a survivor's state: the same weights, optimizer state and step counter as it. */
  async adopt(state: PeerState, options: { readonly redoingStep?: boolean } = {}): Promise<void> {
    // Local SGD: a member in the survivor's round keeps its own parameters (local-sgd.ts).
    const own = this.#localSgd && state.files[LOCAL_SGD_FILE] ? await this.#readFlatParams() : undefined
    loadWeightsInto(this.#tf as unknown as Tf, this.model, state.files)
    if (own && this.#localSgd!.adopt(state.files[LOCAL_SGD_FILE]!) === "keep") this.#assignFlat(own)
    const opt = state.files[OPTIMIZER_FILE]
    if (opt) {
      // tfjs optimizers make new variables for what they load: the ones they held go.
      const held = (await this.optimizer.getWeights()).map((w) => w.tensor)
      await loadOptimizerFrom(this.#tf as unknown as Tf, this.optimizer, opt)
      const now = await this.optimizer.getWeights()
      const kept = new Set(now.filter((w) => w.name !== "iter").map((w) => w.tensor))
      // getWeights() makes a fresh step-count scalar each time ("iter"): those go too.
      for (const t of [...held, ...now.filter((w) => w.name === "iter").map((w) => w.tensor)]) if (!kept.has(t) && !t.isDisposed) t.dispose()
    }
    // A step this rank is in and will redo in the new group keeps its number; the next one follows.
    this.#step = state.step + (this.#inStep && options.redoingStep ? 1 : 0)
    this.#global = this.#step
  }

  // --------------------------------------------------------------------------------------------
  // State parity (failureConfig.parityEvery; train-context.ts runs the exchange at report rounds)

  /** Whether the ranks of this group hold the same state between steps (what stateDigest covers). */
  get #replicated(): boolean {
    return !this.#localSgd && !this.#sync.ps && !this.#sync.auto
  }

  /**
   * A digest of the state every rank of a synchronous group holds alike: trainable weights,
   * optimizer state and step counter; with ZeRO the weights only (each rank holds its own optimizer
   * shard). Four 16-bit numbers of a SHA-256: integers, exact in float32, and no NaN bit patterns for
   * a copy to canonicalise. Undefined where ranks
   * legitimately differ: local SGD between rounds, parameter servers (async, SSP), a strategy
   * chosen at run time. Non-trainable weights (batch-norm statistics, computed on each rank's own
   * batches) are not in it: syncBuffers() gives every rank rank 0's.
   */
  async stateDigest(): Promise<Float32Array | undefined> {
    if (!this.#replicated) return undefined
    const h = createHash("sha256")
    const values = await Promise.all(this.model.trainableWeights.map((w) => w.read().data() as Promise<Float32Array>))
    for (const v of values) h.update(new Uint8Array(v.buffer, v.byteOffset, v.byteLength))
    if (!this.#zero) h.update(await optimizerToFile(this.optimizer)).update(String(this.#step))
    const d = h.digest()
    return Float32Array.from([d.readUInt16LE(0), d.readUInt16LE(2), d.readUInt16LE(4), d.readUInt16LE(6)])
  }

  /**
   * Rank 0's non-trainable weights (batch-norm moving statistics) to every rank, as DDP broadcasts
   * its buffers: each rank's come from its own batches. All ranks call it; nothing when the model
   * has none, or its ranks are not replicas.
   */
  async syncBuffers(broadcast: (buf: Float32Array) => Promise<void>): Promise<void> {
    if (this.#replicated) await this.#takeRankZeroValues(this.model.nonTrainableWeights, broadcast)
  }

  /**
   * Every rank takes rank 0's state (all ranks call it; `broadcast` sends rank 0's buffer to the
   * others): its snapshot's bytes, two to a float32 (16-bit integers: exact, no NaN patterns), then adopted by every rank, rank 0
   * included, as after a regroup; with ZeRO its weights.
   */
  async takeRankZeroState(broadcast: (buf: Float32Array) => Promise<void>): Promise<void> {
    if (this.#zero) {
      await this.#takeRankZeroValues(this.model.weights, broadcast)
      return
    }
    const rank0 = this.#sync.rank === 0
    const bytes = rank0 ? encodeMessage(await this.snapshot()) : undefined
    const n = bytes?.length ?? 0
    const size = Float32Array.of(n % 65536, Math.floor(n / 65536))
    await broadcast(size)
    const length = size[0]! + size[1]! * 65536
    const buf = new Float32Array(Math.ceil(length / 2))
    if (bytes) for (let i = 0; i < length; i += 2) buf[i >> 1] = bytes[i]! | ((bytes[i + 1] ?? 0) << 8)
    await broadcast(buf)
    // Rank 0 loads its own snapshot too: the optimizer rebuilds its derived state (Adam's bias
    // corrections) from what it loads, and the others' must match it bit for bit (as in a regroup).
    const out = new Uint8Array(length)
    for (let i = 0; i < length; i += 2) {
      const v = buf[i >> 1]!
      out[i] = v & 0xff
      if (i + 1 < length) out[i + 1] = v >> 8
    }
    const state = decodeMessage(out) as Omit<PeerState, "position">
    await this.adopt({ ...state, position: { ops: 0, reports: 0, stepsSinceReport: 0, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 } })
  }

  /** The group changed: the learning rate follows its size under "keep-per-worker"; batches are re-cut by fit(). */
  regrouped(): void {
    this.#batcher = undefined
    this.#applyElasticLearningRate()
  }

  loopPosition(): LoopPosition {
    return { inFit: this.#inFit, epoch: this.#epoch, stepInEpoch: this.#stepInEpoch, stepsPerEpoch: this.#stepsPerEpoch }
  }

  /** A per-rank batch size as this group uses it: scaled up when an elastic group runs below its max size. */
  #rankBatch(batchSize: number): number {
    const e = this.#sync.elastic
    if (!e || e.batch !== "keep-global" || this.#sync.worldSize >= e.maxWorkers) return batchSize
    return Math.ceil((batchSize * e.maxWorkers) / this.#sync.worldSize)
  }

  /** Broadcasts rank 0's weights (trainable and not, e.g. batch-norm statistics) to every rank. */
  async syncWeights(): Promise<void> {
    if (this.#sync.worldSize === 1) return
    await this.#takeRankZeroValues(this.model.weights, async (buf) => {
      const t0 = performance.now()
      await this.#sync.broadcast(buf)
      this.#observer?.wait?.("broadcast weights from rank 0", t0, performance.now())
    })
  }

  /**
   * Gives `vars` (the same variables on every rank) rank 0's values: concatenated on the engine and
   * read once, sent by `broadcast` (rank 0's buffer to the others), written back in place.
   */
  async #takeRankZeroValues(vars: LayersModel["weights"], broadcast: (buf: Float32Array) => Promise<void>): Promise<void> {
    if (vars.length === 0) return
    const tf = this.#tf
    const flat = tf.tidy(() => tf.concat(vars.map((v) => v.read().reshape([-1]))))
    const buf = (await flat.data()) as Float32Array
    flat.dispose()
    await broadcast(buf)
    tf.tidy(() => {
      let off = 0
      for (const v of vars) {
        const size = v.read().size
        v.write(tf.tensor(buf.subarray(off, off + size), v.read().shape, v.dtype))
        off += size
      }
    })
  }

  /**
   * This step's gradients as one flat array in layout order, in `into` when given (ZeRO stage 2's
   * padded buffer). When the group has a buffer of its own (GradientSync.gradientBuffer:
   * compression kernels work on it in place) and the backend keeps tensors in host memory (cpu,
   * wasm), each variable's gradient is read into it: one copy per element, as many as the
   * concat-and-read path makes. The tensorflow backend concatenates on the device and downloads once.
   */
  async #readGradients(grads: Record<string, Tensor>, into?: Float32Array): Promise<Float32Array> {
    const tf = this.#tf
    const device = tf.getBackend() === "tensorflow"
    const own = into ?? (device ? undefined : this.#sync.gradientBuffer?.(this.parameterCount))
    if (own && !device) {
      const parts = await Promise.all(this.#vars.map((v) => grads[v.name]?.data() as Promise<Float32Array> | undefined))
      this.layout.forEach((s, i) => {
        const part = parts[i]
        if (part) own.set(part, s.offset)
        else own.fill(0, s.offset, s.offset + s.size)
      })
      return own
    }
    const flatT = tf.tidy(() => tf.concat(this.#vars.map((v) => (grads[v.name] ?? tf.zerosLike(v)).reshape([-1]))))
    const flat = (await flatT.data()) as Float32Array
    flatT.dispose()
    if (own) own.set(flat)
    return own ?? flat
  }

  /**
   * One synchronous data-parallel step on this rank's batch (y in the loss's target form: one-hot
   * for categoricalCrossentropy, class ids for sparseCategoricalCrossentropy); returns this rank's
   * loss and, for classification, its correct predictions. With { accumulate: true } the batch's
   * gradients are only added up locally (see TrainStepOptions).
   */
  async trainStep(x: Tensor, y: Tensor, options: TrainStepOptions = {}): Promise<StepResult> {
    await this.#letTimersRun()
    const recovery = this.#sync.recovery
    // A rank joining survivors replays a hand-written loop from the checkpoint: the steps they made
    // already are skipped (loss NaN, no samples), and at their position it takes their state.
    if (recovery?.joinTarget && !this.#inFit && (options.accumulate || (await recovery.replayStep()) === "skip")) return { loss: Number.NaN, samples: 0 }
    if (options.accumulate) return this.#accumulateStep(x, y)
    this.#inStep = true
    try {
      const r = await this.#trainStep(x, y)
      recovery?.countStep()
      return r
    } finally {
      this.#inStep = false
    }
  }

  /**
   * Gives the event loop a turn when steps have held it for a while. A group of one (or an
   * accumulation run) has no collective that waits on I/O, and tfjs's data() resolves at once on
   * host backends: without this a loop of long steps never lets timers run, the worker's heartbeat
   * included, and the driver takes the worker for hung.
   */
  async #letTimersRun(): Promise<void> {
    const now = performance.now()
    if (now - this.#lastTurn < YIELD_EVERY_MS) return
    await new Promise<void>((resolve) => setImmediate(resolve))
    this.#lastTurn = performance.now()
  }

  #decisionClock(): number {
    return this.#inFit ? this.#calls : this.globalStep
  }

  /**
   * Strategy "auto": one round of the group's decision exchange. Every rank's recent compute,
   * all-reduce and push-pull times, its group step, step counter, decision clock and whether it has
   * finished are gathered; every rank leaves with the same group step and next decision point.
   */
  async #decisionRound(
    finishing: boolean
  ): Promise<{
    computeMs: number[][]
    steps: number
    step: number
    anyFinishing: boolean
    allFinishing: boolean
    cpu: { busyCores: number[]; stepsPerSec: number[]; cores: number[]; host: number[]; ownCores: number[] }
  }> {
    const k = AUTO_WINDOW
    const w = 3 * k + 11
    // This rank's last k compute, all-reduce and push-pull times (-1: not measured), then the rest.
    const mine = new Float32Array(w).fill(-1)
    const c = this.#computeLog.slice(-k)
    const m = this.#commLog.slice(-k)
    const q = this.#psLog.slice(-k)
    mine.set(c, k - c.length)
    mine.set(m, 2 * k - m.length)
    mine.set(q, 3 * k - q.length)
    mine[3 * k] = this.#global
    mine[3 * k + 1] = this.#step
    mine[3 * k + 2] = this.#decisionClock()
    mine[3 * k + 3] = finishing ? 1 : 0
    mine[3 * k + 4] = this.#serverMs ?? -1
    mine[3 * k + 5] = this.#mark ? performance.now() - this.#mark.at : -1
    // Since the last round: this machine's busy cores (every process on it) and this rank's
    // steps/s; its cores, and the machine (a 24-bit hash of the host name: ranks of one machine
    // share its cores).
    const usage = process.cpuUsage()
    const now = { at: performance.now(), busy: machineBusyMs(), own: (usage.user + usage.system) / 1000 }
    const took = this.#computeLog.length
    if (this.#cpuMark && took > 0 && now.at > this.#cpuMark.at) {
      mine[3 * k + 6] = (now.busy - this.#cpuMark.busy) / (now.at - this.#cpuMark.at)
      mine[3 * k + 7] = (took * 1000) / (now.at - this.#cpuMark.at)
      mine[3 * k + 10] = (now.own - this.#cpuMark.own) / (now.at - this.#cpuMark.at)
    }
    this.#cpuMark = now
    mine[3 * k + 8] = os.availableParallelism()
    mine[3 * k + 9] = hostHash
    this.#computeLog = []
    this.#commLog = []
    this.#psLog = []
    const all = await this.#sync.allGather!(mine)
    const p = this.#sync.worldSize
    let global = 0
    let steps = 0
    let clock = 0
    let done = 0
    let serverMs = -1
    let elapsed = -1
    for (let r = 0; r < p; r++) {
      global = Math.max(global, all[r * w + 3 * k]!)
      steps = Math.max(steps, all[r * w + 3 * k + 1]!)
      clock = Math.max(clock, all[r * w + 3 * k + 2]!)
      done += all[r * w + 3 * k + 3]!
      serverMs = Math.max(serverMs, all[r * w + 3 * k + 4]!)
      elapsed = Math.max(elapsed, all[r * w + 3 * k + 5]!)
    }
    // The group's rate since the window began (gradient steps/s: p per synchronous step's worth).
    this.#rounds++
    // The first window (from the second step) is warm-up: kernels compiled, buffers and links
    // made; its rate would sell the starting strategy short, so that round only measures.
    if (this.#mark && elapsed > 0 && !finishing && this.#rounds > 1) {
      const rate = ((global - this.#mark.global) * p * 1000) / elapsed
      if (rate > 0) this.#measured.set(this.#strategy, { rate, round: this.#rounds })
    }
    for (const [name, m] of this.#measured) if (this.#rounds - m.round > AUTO_REMEMBER) this.#measured.delete(name)
    this.#mark = { at: performance.now(), global }
    this.#global = global
    const after = Math.floor(clock + 1e-9)
    this.#nextDecision =
      after < AUTO_FIRST_DECISION
        ? AUTO_FIRST_DECISION
        : after < AUTO_FIRST_CHOICE
          ? AUTO_FIRST_CHOICE
          : AUTO_FIRST_CHOICE + AUTO_EVERY * (Math.floor((after - AUTO_FIRST_CHOICE) / AUTO_EVERY) + 1)
    // Per step, the least any rank spent exchanging (the last to arrive waited for nobody), averaged:
    // rates follow the mean time, and a rank throttled in bursts has many quick steps and a few slow ones.
    const leastPerStep = (part: number): number | undefined => {
      const mins: number[] = []
      for (let t = 0; t < k; t++) {
        let least = Number.POSITIVE_INFINITY
        for (let r = 0; r < p; r++) {
          const v = all[r * w + part * k + t]!
          if (v >= 0) least = Math.min(least, v)
        }
        if (Number.isFinite(least)) mins.push(least)
      }
      return mins.length > 0 ? mins.reduce((a, b) => a + b, 0) / mins.length : undefined
    }
    this.#allReduceMs = leastPerStep(1) ?? this.#allReduceMs
    this.#pushPullMs = leastPerStep(2) ?? this.#pushPullMs
    if (serverMs >= 0) this.#serverMs = serverMs
    const computeMs: number[][] = []
    for (let r = 0; r < p; r++) computeMs.push(Array.from(all.subarray(r * w, r * w + k)).filter((v) => v >= 0))
    const field = (i: number): number[] => Array.from({ length: p }, (_, r) => all[r * w + 3 * k + i]!)
    const cpu = { busyCores: field(6), stepsPerSec: field(7), cores: field(8), host: field(9), ownCores: field(10) }
    return { computeMs, steps, step: Math.floor(global + 1e-9), anyFinishing: done > 0, allFinishing: done >= p, cpu }
  }

  /**
   * Strategy "auto", each time the decision clock passes the next decision point, the same points
   * on every rank, so the exchange lines up: inside dp.fit() every rank's step count; outside it the
   * group step, which lines up even where ranks take different numbers of steps (backup workers,
   * SSP, async: a rank enters when it hears the group got there, so the others wait at most for its
   * step in flight). Every rank computes the same choice from the gathered measurements
   * (scheduler/strategy-choice.ts), rank 0 explains it, and a change moves training. Once any rank
   * has finished its loop nothing changes any more.
   */
  async #decideStrategy(): Promise<void> {
    const auto = this.#sync.auto!
    if (!this.#sync.allGather) return
    const { computeMs, steps, step, anyFinishing, cpu } = await this.#decisionRound(false)
    // The first round (warm-up) only measures: its compute times' jitter and its rate are the
    // first steps', and the machine's busy cores have no window yet.
    if (this.#rounds === 1) return
    if (anyFinishing || this.#allReduceMs === undefined || computeMs.some((r) => r.length === 0)) return
    const choice = chooseStrategy(
      {
        computeMs,
        allReduceMs: this.#allReduceMs,
        numServers: auto.numServers,
        equalSteps: this.#inFit,
        ...(this.#pushPullMs !== undefined ? { pushPullMs: this.#pushPullMs } : {}),
        ...(this.#serverMs !== undefined ? { serverMs: this.#serverMs } : {}),
        measured: Object.fromEntries([...this.#measured].map(([name, m]) => [name, m.rate])),
        // Held to what the machines' cores run (no rank without a CPU figure yet: none is applied).
        ...(cpu.busyCores.every((c) => c > 0) && cpu.ownCores.every((c) => c > 0) ? { cpu } : {}),
        // collectiveConfig.localSgd offers local SGD: one round of the whole vector per H steps.
        ...(this.#sync.localSgd ? { localSgd: { syncEvery: this.#sync.localSgd.syncEvery } } : {})
      },
      this.#strategy
    )
    if (this.#sync.rank === 0) {
      const best = choice.predictions.find((x) => x.name === choice.pick)
      auto.explain(choice.text, { step, ...choice.json }, `gradwire: strategy ${choice.pick}${choice.changed ? ` (was ${this.#strategy})` : ""} at step ${step}: predicted ${best?.stepsPerSec.toFixed(1)} gradient steps/s`)
    }
    if (choice.changed) {
      // The next strategy starts every rank at the same step (the all-reduce and sync steps are numbered by it).
      this.#step = steps
      await this.#switchStrategy(choice.pick)
    }
  }

  /** Moves training between the all-reduce and the servers, carrying the parameters and the optimizer state. */
  async #switchStrategy(target: StrategyName): Promise<void> {
    const ps = this.#sync.ps!
    const spec = this.#psSpec!
    if (this.#strategy === "local-sgd") {
      // Leaving local SGD: one last round of every fragment, so every rank holds the same weights.
      await this.#localSgd!.flush()
      this.#localSgd = undefined
    }
    if (onServers(this.#strategy)) {
      // Leaving the servers: every rank takes their whole state (they are idle: every rank is here).
      const whole = await ps.wholeState(this.parameterCount)
      this.#assignFlat(whole.params)
      await this.#loadTfjsOptimizer(spec, whole.optimizer)
    }
    if (onServers(target) && this.#sync.rank === 0) {
      const weights = await readTfjsOptimizerWeights(this.optimizer as unknown as Parameters<typeof readTfjsOptimizerWeights>[0])
      const state = flatStateFromTfjs(spec, this.layout, this.parameterCount, weights)
      const as = target === "backup" ? { mode: "sync" as const, backupWorkers: 1 } : { mode: target as "ssp" | "async", backupWorkers: 0 }
      await ps.takeOver(await this.#readFlatParams(), state, this.learningRate ?? 0, spec, this.#sync.worldSize, this.#weightDecay, as)
    }
    // Nobody pushes before the servers hold the state; then every rank learns their version.
    await this.#sync.sum(new Float32Array(1))
    if (onServers(target)) await ps.pull(this.parameterCount)
    // The servers' version starts again at 0: the group step and step counter it is counted from.
    this.#globalBase = this.#global
    this.#syncBase = this.#step
    this.#strategy = target
    // Local SGD's outer loop starts at the weights every rank holds now.
    if (target === "local-sgd") await this.#initLocalSgd()
    this.#switches++
    // The new strategy's window starts after the move.
    this.#mark = { at: performance.now(), global: this.#global }
  }

  /** Loss, gradients and (classification) correct predictions of a batch. */
  #forward(x: Tensor, y: Tensor): { value: Scalar; grads: Record<string, Tensor>; correct: Tensor | undefined } {
    const tf = this.#tf
    let pred: Tensor | undefined
    const { value, grads } = this.optimizer.computeGradients(() => {
      const out = this.model.apply(x, { training: true }) as Tensor
      if (this.#classification) pred = tf.keep(out)
      return this.#loss(y, out)
    }, this.#vars)
    const correct = pred ? tf.tidy(() => pred!.argMax(-1).equal(this.#labelsOf(y)).sum()) : undefined
    pred?.dispose()
    return { value, grads: grads as Record<string, Tensor>, correct }
  }

  async #accumulateStep(x: Tensor, y: Tensor): Promise<StepResult> {
    const tf = this.#tf
    const samples = x.shape[0] ?? 0
    const t0 = performance.now()
    const { value, grads, correct } = this.#forward(x, y)
    const acc = (this.#acc ??= {})
    for (const v of this.#vars) {
      const g = grads[v.name]
      if (!g) continue
      const prev = acc[v.name]
      acc[v.name] = tf.tidy(() => (prev ? prev.add(g.mul(samples)) : g.mul(samples)))
      prev?.dispose()
    }
    tf.dispose(Object.values(grads))
    this.#accSamples += samples
    const [lossArr, correctArr] = await Promise.all([value.data(), correct?.data()])
    tf.dispose([value, ...(correct ? [correct] : [])])
    if (this.#delayMsPerSample > 0) await new Promise((r) => setTimeout(r, this.#delayMsPerSample * samples))
    this.#accComputeMs += performance.now() - t0
    return { loss: lossArr[0], samples, ...(correctArr ? { correct: correctArr[0] } : {}) }
  }

  /** The update's gradients: this batch's, or with accumulated ones their sample-weighted mean (accumulators kept). */
  #withAccumulated(grads: Record<string, Tensor>, samples: number): { grads: Record<string, Tensor>; samples: number } {
    const acc = this.#acc
    if (!acc) return { grads, samples }
    const tf = this.#tf
    const total = this.#accSamples + samples
    const out: Record<string, Tensor> = {}
    for (const v of this.#vars) {
      const a = acc[v.name]
      const g = grads[v.name]
      if (!a && !g) continue
      out[v.name] = tf.tidy(() => (a ? (g ? a.add(g.mul(samples)) : a) : g!.mul(samples)).div(Math.max(1, total)))
    }
    tf.dispose(Object.values(grads))
    return { grads: out, samples: total }
  }

  #clearAccumulated(): void {
    if (this.#acc) this.#tf.dispose(Object.values(this.#acc))
    this.#acc = undefined
    this.#accSamples = 0
    this.#accComputeMs = 0
  }

  /**
   * prepareModel's learning-rate rule for update `step` with `samples` on this rank: sets the
   * optimizer's rate (ZeRO's shard optimizer takes it from there) and returns it.
   */
  #applyLearningRateRule(step: number, samples: number): void {
    const rule = this.#lrRule
    if (!rule) return
    const global = this.#fitGlobalBatch ?? samples * this.#sync.worldSize
    const lr = (this.#baseLearningRate as number) * rule.factor(step, global)
    this.#lastLearningRate = lr
    this.#setLearningRate(lr)
  }

  #setLearningRate(lr: number): void {
    const o = this.optimizer as unknown as { learningRate: number; setLearningRate?: (lr: number) => void }
    if (typeof o.setLearningRate === "function") o.setLearningRate(lr)
    else o.learningRate = lr
  }

  /** The optimizer's learning rate now (undefined for one without a numeric rate). */
  get learningRate(): number | undefined {
    const lr = (this.optimizer as unknown as { learningRate?: unknown }).learningRate
    return typeof lr === "number" ? lr : undefined
  }

  /** Stage 0's update: decoupled weight decay, then the optimizer on the reduced gradients. */
  #applyWhole(grads: Record<string, Tensor>): void {
    const tf = this.#tf
    const wd = this.#weightDecay
    if (wd > 0) {
      const keep = 1 - (this.learningRate as number) * wd
      for (const v of this.#vars) {
        const decayed = tf.tidy(() => v.mul(keep))
        v.assign(decayed)
        decayed.dispose()
      }
    }
    // On wasm, tfjs's Adam as one in-place pass per variable (bit for bit the same update).
    if (!fusedAdamStep(tf, this.optimizer, grads)) this.optimizer.applyGradients(grads)
  }

  /** ZeRO's update: this rank's segment from its reduced gradient, then every segment all-gathered into the model. */
  async #applyShard(zero: ZeroShard, grad: Float32Array): Promise<void> {
    const tf = this.#tf
    zero.update(grad, this.learningRate, this.#weightDecay)
    const gathered = zero.gathered
    await this.#sync.allGatherInto!(zero.segment, gathered)
    this.#assignFlat(gathered)
  }

  async #trainStep(x: Tensor, y: Tensor): Promise<StepResult> {
    const tf = this.#tf
    if (this.#sync.auto && this.#decisionClock() >= this.#nextDecision) await this.#decideStrategy()
    this.#calls++
    if (this.#sync.auto && this.#calls === 2 && !this.#mark) this.#mark = { at: performance.now(), global: this.#global }
    const step = this.#step++
    const t0 = performance.now()
    const fwd = this.#forward(x, y)
    const { grads, samples } = this.#withAccumulated(fwd.grads, x.shape[0] ?? 0)
    const own = x.shape[0] ?? 0
    const value = fwd.value
    const correctT = fwd.correct
    this.#applyLearningRateRule(step, samples)
    const zero = this.#zero
    const done = (lossArr: ArrayLike<number>, correctArr: ArrayLike<number> | undefined): StepResult => {
      if (!this.#viaServers) this.#global++
      this.onStep?.({ epoch: this.#epoch, step: this.#stepInEpoch++, stepsPerEpoch: this.#stepsPerEpoch, samples, loss: lossArr[0]! })
      return { loss: lossArr[0]!, samples: own, ...(correctArr ? { correct: correctArr[0]! } : {}) }
    }
    const local = this.#localSgd
    if ((this.#sync.worldSize === 1 && !this.exchangeAlone && !zero && !this.#viaServers) || local) {
      // Nobody to exchange with (or local SGD's inner step): apply the gradients where they are,
      // without the round trip out of the engine and back.
      const [lossArr, correctArr] = await Promise.all([value.data(), correctT?.data()])
      tf.dispose([value, ...(correctT ? [correctT] : [])])
      if (this.#delayMsPerSample > 0) await new Promise((r) => setTimeout(r, this.#delayMsPerSample * own))
      const t1 = performance.now()
      this.#lastComputeMs = t1 - t0 + this.#accComputeMs
      this.#clearAccumulated()
      this.#observer?.phase?.("forward_backward", t0, t1, step)
      if (local && this.#sync.auto && step >= 2) this.#computeLog.push(this.#lastComputeMs)
      this.#applyWhole(grads)
      tf.dispose(Object.values(grads))
      const t2 = performance.now()
      // Local SGD: the outer round of the fragments due after this step (none most steps).
      if (local) {
        await local.afterStep(samples)
        // A round in flight needs the event loop's turns to make progress while steps compute.
        if (local.pending) await new Promise<void>((resolve) => setImmediate(resolve))
      }
      const t3 = performance.now()
      this.#observer?.phase?.("allreduce", t2, t3, step)
      this.#observer?.phase?.("apply", t1, t2, step)
      this.#observer?.phase?.("step", t0, t3, step)
      return done(lossArr, correctArr)
    }
    const into = zero?.stage === 2 ? zero.gradients : undefined
    let [flat, lossArr, correctArr] = await Promise.all([this.#readGradients(grads, into), value.data(), correctT?.data()])
    tf.dispose([value, ...(correctT ? [correctT] : [])])
    tf.dispose(Object.values(grads))
    if (this.#delayMsPerSample > 0) await new Promise((r) => setTimeout(r, this.#delayMsPerSample * own))
    let t1 = performance.now()
    this.#lastComputeMs = t1 - t0 + this.#accComputeMs
    this.#observer?.phase?.("forward_backward", t0, t1, step)
    if (this.#sync.auto && step >= 2) this.#computeLog.push(this.#lastComputeMs)
    const ps = this.#viaServers ? this.#sync.ps : undefined
    if (ps) {
      // The servers apply the gradient (as the mode says) and hand back their fresh parameters.
      // Under "auto" a mode runs exactly as when chosen by hand (the same learning rate per update).
      const p = this.#sync.worldSize
      const oneByOne = this.#sync.auto ? this.#strategy === "ssp" || this.#strategy === "async" : ps.mode !== "sync"
      const r = await ps.pushPull(this.#sync.rank, step, flat, samples, this.learningRate)
      if (r.serverMs !== undefined) this.#serverMs = r.serverMs
      // The group's progress from the servers' version; under "auto" with backup workers outside
      // dp.fit() a rank whose gradient came late goes on at the step the servers collect, not
      // behind it. Inside dp.fit() every rank pushes every step of its own (decisions come at the
      // same step count on every rank, and the fast ones wait there for a step only the slow one
      // can still complete).
      const perUpdate = oneByOne ? 1 : p - (this.#sync.auto ? 1 : ps.backupWorkers)
      this.#global = Math.max(this.#global, this.#globalBase + (r.version * perUpdate) / p)
      if (this.#sync.auto && this.#strategy === "backup" && !this.#inFit) this.#step = Math.max(this.#step, this.#syncBase + r.version)
      if (this.#sync.auto && step >= 2) {
        this.#commLog.push(-1)
        this.#psLog.push(performance.now() - t1)
      }
      this.#clearAccumulated()
      const st = this.#psStaleness
      st.sum += r.staleness
      st.max = Math.max(st.max, r.staleness)
      st.steps++
      if (r.dropped) st.dropped++
      const t2 = performance.now()
      this.#observer?.phase?.("allreduce", t1, t2, step)
      this.#assignFlat(r.params)
      const t3 = performance.now()
      this.#observer?.phase?.("apply", t2, t3, step)
      this.#observer?.phase?.("step", t0, t3, step)
      return done(lossArr, correctArr)
    }
    if (zero?.stage === 2) {
      // Each rank receives only its segment of the reduced gradient.
      const segment = await this.#sync.reduceScatter!(flat, samples)
      this.#clearAccumulated()
      const t2 = performance.now()
      this.#observer?.phase?.("allreduce", t1, t2, step)
      await this.#applyShard(zero, segment)
      const t3 = performance.now()
      this.#observer?.phase?.("apply", t2, t3, step)
      this.#observer?.phase?.("step", t0, t3, step)
      return done(lossArr, correctArr)
    }
    let reduced = await this.#sync.reduceGradients(flat, this.layout, samples, step)
    while (reduced === "recompute") {
      // The group broke under the reduction and was re-formed: the buffer holds partial sums of
      // the old group, so this rank's gradients are computed again (the weights are unchanged) and
      // reduced in the new group (with the micro-batches it accumulated before, which it kept).
      const again = this.#forward(x, y)
      const redo = this.#withAccumulated(again.grads, own)
      ;[flat, lossArr] = await Promise.all([this.#readGradients(redo.grads), again.value.data()])
      tf.dispose([again.value, ...(again.correct ? [again.correct] : []), ...Object.values(redo.grads)])
      t1 = performance.now()
      reduced = await this.#sync.reduceGradients(flat, this.layout, samples, step)
    }
    this.#clearAccumulated()
    const t2 = performance.now()
    this.#observer?.phase?.("allreduce", t1, t2, step)
    if (this.#sync.auto && step >= 2) this.#commLog.push(t2 - t1)
    if (reduced === "adopted") {
      // The group was re-formed and this rank took the state of a survivor that completed this
      // step: its update is in the weights already.
      this.#observer?.phase?.("step", t0, t2, step)
      return { loss: lossArr[0]!, samples: own, ...(correctArr ? { correct: correctArr[0]! } : {}) }
    }
    if (zero) {
      // Stage 1: the whole gradient was all-reduced (with any compression); this rank updates its segment.
      await this.#applyShard(zero, flat.subarray(zero.layout.start, zero.layout.end))
    } else {
      // One copy back into the engine per variable, straight from views of the reduced buffer.
      const named: Record<string, Tensor> = {}
      for (const s of this.layout) named[s.name] = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape as number[], "float32")
      this.#applyWhole(named)
      tf.dispose(Object.values(named))
    }
    const t3 = performance.now()
    this.#observer?.phase?.("apply", t2, t3, step)
    this.#observer?.phase?.("step", t0, t3, step)
    return done(lossArr, correctArr)
  }

  #labelsOf(y: Tensor): Tensor {
    return y.rank > 1 && (y.shape[y.rank - 1] ?? 1) > 1 ? y.argMax(-1) : y.flatten().toInt()
  }

  /**
   * Loss and accuracy of this rank's model on (x, y), computed locally, read asynchronously: the
   * form a GPU backend needs (webgpu has no synchronous read in Node).
   */
  async evaluateAsync(x: Tensor, y: Tensor): Promise<{ loss: number; accuracy?: number }> {
    const tf = this.#tf
    const [lossT, accT] = tf.tidy(() => {
      const pred = this.model.predict(x) as Tensor
      const loss = this.#loss(y, pred)
      return [loss, this.#classification ? pred.argMax(-1).equal(this.#labelsOf(y)).mean() : undefined] as const
    })
    const [loss, acc] = await Promise.all([lossT.data(), accT?.data()])
    tf.dispose([lossT, ...(accT ? [accT] : [])])
    return acc ? { loss: loss[0]!, accuracy: acc[0]! } : { loss: loss[0]! }
  }

  /** Loss and accuracy of this rank's model on (x, y), computed locally (synchronous reads: cpu, wasm, tensorflow; on webgpu use evaluateAsync). */
  evaluate(x: Tensor, y: Tensor): { loss: number; accuracy?: number } {
    if (this.#tf.getBackend() === "webgpu") {
      throw new ConfigError({ field: "dp.evaluate", reason: "the webgpu backend cannot read tensors synchronously in Node: use await dp.evaluateAsync(x, y)" })
    }
    const tf = this.#tf
    return tf.tidy(() => {
      const pred = this.model.predict(x) as Tensor
      const loss = this.#loss(y, pred).dataSync()[0]
      if (!this.#classification) return { loss }
      const acc = pred.argMax(-1).equal(this.#labelsOf(y)).mean().dataSync()[0]
      return { loss, accuracy: acc }
    })
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
    const tf = this.#tf
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
    const numClasses = classesOf(source, (this.model.outputs[0]?.shape.at(-1) as number | null) ?? 0)
    const recovery = this.#sync.recovery
    const results: EpochResult[] = []
    this.#inFit = true
    try {
      for (let epoch = opts.initialEpoch ?? 0; epoch < opts.epochs; epoch++) {
        const started = performance.now()
        this.#epoch = epoch
        this.#streamRegroup(source, this.#observeRegroup(source, opts), epoch)
        let { steps, rowsOf } = this.#epochRows(source, opts, epoch)
        this.#stepsPerEpoch = steps
        const target = recovery?.joinTarget
        if (target && (!target.inFit || epoch > target.epoch)) {
          throw new PeerRecoveryMisaligned({
            reason: `this joining rank is at epoch ${epoch} of dp.fit(), the survivors ${target.inFit ? `at epoch ${target.epoch}` : "outside dp.fit()"}`
          })
        }
        if (target && epoch < target.epoch) {
          // The survivors trained this epoch: skip it whole (nothing computed, nothing exchanged).
          this.#stepInEpoch = steps
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
          this.#stepsPerEpoch = steps
        }
        if (target && i < steps) {
          this.#streamRegroup(source, target, epoch)
          await joinHere()
        }
        while (i < steps) {
          this.#stepInEpoch = i
          // A step's micro-batches (one without accumulation): all but the last are only accumulated.
          const micro = rowsOf(i)
          let r: StepResult = { loss: 0, samples: 0 }
          let stepSamples = 0
          for (let j = 0; j < micro.length; j++) {
            const batchRows = micro[j]!
            const batch = await fitBatch(source, batchRows)
            const { x, y, yLoss } = batchTensors(this.#tf as unknown as Tf, batch, this.#classification, (t) => this.lossTargets(t, numClasses))
            try {
              r = await this.trainStep(x, yLoss, { accumulate: j < micro.length - 1 })
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
            this.#stepsPerEpoch = steps
            if (c.inFit && c.epoch === epoch) i = Math.min(steps, stepAt(c, steps) + (recovery!.ops - c.ops))
          }
          // Every member's batch-size exchanges start again after the regroup's operation.
          if (!recovery || recovery.ops - 1 > this.#freshAfterOps) await this.#batcher?.afterStep(stepSamples, this.#lastComputeMs)
          await opts.onStep?.({ ...r, epoch, index })
        }
        this.#stepInEpoch = steps
        if (target && recovery?.joinTarget) await joinHere()
        const w0 = performance.now()
        await this.#sync.sum(totals)
        this.#observer?.wait?.("epoch metrics all-reduce", w0, performance.now())
        const result: EpochResult = {
          epoch,
          loss: totals[0] / Math.max(1, totals[2]),
          ...(this.#classification ? { accuracy: totals[1] / Math.max(1, totals[2]) } : {}),
          samples: totals[2],
          steps,
          seconds: (performance.now() - started) / 1000
        }
        results.push(result)
        await opts.onEpochEnd?.(result)
      }
    } finally {
      this.#inFit = false
      this.#fitGlobalBatch = undefined
    }
    return results
  }

  /**
   * Notices a regroup (or a join) since the last look: a fresh batch split for the new group (its
   * exchanges count from the regroup's operation on every member) and, once, the furthest survivor's
   * position, which the caller moves its epoch cursor to.
   */
  #observeRegroup(source: FitSource, opts: FitOptions, joinedAtOps?: number): RecoveryCursor | undefined {
    const recovery = this.#sync.recovery
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
    const p = this.#sync.worldSize
    if (!Number.isInteger(globalBatch) || globalBatch < p || globalBatch > source.dataset.size) {
      throw new ConfigError({
        field: "fit.globalBatchSize",
        reason: `must be an integer between the number of workers (${p}) and the dataset size (${source.dataset.size}), got ${globalBatch}`
      })
    }
    if (!fresh && this.#batcher?.globalBatch === globalBatch) return
    const allGather = this.#sync.allGather?.bind(this.#sync)
    this.#batcher = new HeteroBatcher({
      rank: this.#sync.rank,
      worldSize: p,
      globalBatch,
      adaptive: this.#sync.adaptiveBatching === true && allGather !== undefined,
      allGather: allGather ?? (async (b) => b)
    })
  }

  /** An epoch's steps and each step's rows for this rank: per-rank batches, or slices of the global batch. */
  #epochRows(source: FitSource, opts: FitOptions, epoch: number): { steps: number; rowsOf: (step: number) => number[][] } {
    const batcher = this.#batcher
    const k = opts.accumulationSteps ?? 1
    if (isStreamingSource(source)) {
      // Streamed: this rank's rows left in the epoch (its part of the plan), taken in order.
      const bs = this.#rankBatch(opts.batchSize as number)
      this.#fitGlobalBatch = bs * this.#sync.worldSize * k
      return streamEpoch(source.openEpoch(epoch, this.#sync.rank, this.#sync.worldSize), bs, k)
    }
    if (opts.globalBatchSize === undefined || !batcher) {
      const rows = source.rows(epoch)
      const bs = this.#rankBatch(opts.batchSize as number)
      this.#fitGlobalBatch = bs * this.#sync.worldSize * k
      const slice = (m: number): number[] => Array.prototype.slice.call(rows, m * bs, (m + 1) * bs) as number[]
      // Step i: micro-batches i*k .. i*k+k-1 (the epoch's last step may have fewer).
      return {
        steps: Math.ceil(rows.length / (bs * k)),
        rowsOf: (i) => Array.from({ length: Math.min(k, Math.ceil(rows.length / bs) - i * k) }, (_, j) => slice(i * k + j))
      }
    }
    const B = opts.globalBatchSize
    this.#fitGlobalBatch = B * k
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


  /** Heterogeneity-aware batching state for report(): per-rank batches, re-balances, stragglers. */
  batchingMetrics(): Record<string, number | string> {
    const e = this.#sync.elastic
    return {
      ...this.#batcher?.metrics(),
      ...(e ? { world_size: this.#sync.worldSize, lr_scale: this.learningRateScale } : {}),
      // The learning rate prepareModel's rule set for the last update.
      ...(this.#lrRule && this.#lastLearningRate !== undefined ? { lr: this.#lastLearningRate } : {}),
      // Parameter servers: updates between the parameters a gradient was computed on and its
      // application (mean and max over this rank's steps so far), and gradients dropped (backup workers).
      ...(this.#sync.auto ? { strategy: this.#strategy, "strategy/switches": this.#switches } : {}),
      ...this.#localSgd?.metrics(),
      ...(this.#viaServers
        ? {
            "ps/staleness": this.#psStaleness.sum / Math.max(1, this.#psStaleness.steps),
            "ps/staleness_max": this.#psStaleness.max,
            "ps/dropped": this.#psStaleness.dropped,
            // Gradient bytes of this rank's last step's pushes (every server's), and as dense fp32:
            // ReducerStats' wireBytes / denseBytes (ctx.communicationStats()) for the pushes.
            ...(this.#sync.ps?.pushStats && this.#sync.ps.pushStats.steps > 0
              ? { "ps/wire_bytes": this.#sync.ps.pushStats.wireBytes, "ps/dense_bytes": this.#sync.ps.pushStats.denseBytes }
              : {})
          }
        : {})
    }
  }

  // --------------------------------------------------------------------------------------------
  // Checkpoints (TrainContext.checkpointFromModel / restoreModel)

  /**
   * The optimizer's checkpoint files: its whole state (stage 0), or nothing with ZeRO, where
   * every rank adds its shard to its reports (shardFiles); and the update counter (LR warmup).
   */
  async optimizerFiles(): Promise<Record<string, Uint8Array>> {
    const state = new TextEncoder().encode(JSON.stringify({ step: this.#step, globalStep: this.#global, zeroStage: this.zeroStage, worldSize: this.#sync.worldSize }))
    if (this.#zero) return { [DP_STATE_FILE]: state }
    if (this.#localSgd) {
      // The outer loop's anchor and momentum; a round in flight is merged first.
      await this.#localSgd.settle()
      return { [OPTIMIZER_FILE]: await optimizerToFile(this.optimizer), [LOCAL_SGD_FILE]: this.#localSgd.stateFile(), [DP_STATE_FILE]: state }
    }
    // The parameter servers hold the parameters and the optimizer state: one file per server.
    if (this.#viaServers) return { ...(await this.#sync.ps!.stateFiles()), [DP_STATE_FILE]: state }
    return { [OPTIMIZER_FILE]: await optimizerToFile(this.optimizer), [DP_STATE_FILE]: state }
  }

  /** ZeRO: this rank's shard of the optimizer state, as the checkpoint file it adds to its reports. */
  shardFiles(): Record<string, Uint8Array> {
    if (!this.#zero) return {}
    const { name, bytes } = this.#zero.shardFile()
    return { [name]: bytes }
  }

  /**
   * Loads the optimizer state and update counter of a checkpoint whose model weights were just
   * loaded into the model: the whole state (stage 0), or this rank's range of the saved shards,
   * re-sharded when the checkpoint's world size differs from this group's.
   */
  async restoreOptimizer(files: Readonly<Record<string, Uint8Array>>): Promise<void> {
    const saved = files[DP_STATE_FILE]
    if (saved) {
      const st = JSON.parse(new TextDecoder().decode(saved)) as { step?: number; globalStep?: number }
      this.#step = Number(st.step ?? 0)
      this.#global = Number(st.globalStep ?? this.#step)
    }
    if (this.#localSgd) {
      // The outer state saved with the weights; a checkpoint without it (another strategy's) starts
      // the outer loop at the restored weights.
      const outer = files[LOCAL_SGD_FILE]
      if (outer) this.#localSgd.restore(outer)
      else await this.#localSgd.resetAnchor()
    }
    if (this.#sync.auto) {
      // Strategy "auto" resumes on the all-reduce: a checkpoint taken while on the servers is
      // their state, which every rank loads into its own optimizer.
      this.#strategy = "allreduce"
      if (hasPsFiles(files)) {
        const whole = psWholeState(files, this.parameterCount)
        this.#assignFlat(whole.params)
        await this.#loadTfjsOptimizer(this.#psSpec!, whole.optimizer)
        return
      }
    } else if (this.#sync.ps) {
      // Rank 0 sets the servers up from the checkpoint (from the restored weights when it has no
      // server state); every rank then continues from the servers' parameters.
      await this.#initServers(files)
      return
    }
    const zero = this.#zero
    if (zero) {
      await this.#loadZeroParams()
      if (hasShards(files)) zero.loadShards(files)
      else if (files[OPTIMIZER_FILE]) {
        // Saved whole by a stage-0 run: converted to the flat layout, this rank's range kept.
        const saved = await readOptimizerFile(files[OPTIMIZER_FILE], this.optimizer.getClassName())
        const whole = flatStateFromTfjs(zero.optimizer.spec, this.layout, this.parameterCount, saved.map((w) => ({ name: w.name, values: w.data })))
        zero.loadWhole(whole)
      }
      return
    }
    const opt = files[OPTIMIZER_FILE]
    if (opt) await loadOptimizerFrom(this.#tf as unknown as Tf, this.optimizer, opt)
    else if (hasShards(files)) {
      // Saved sharded by a ZeRO run: the shards assembled into the whole state, handed to tfjs's optimizer.
      const spec = flatOptimizerSpecOf(this.optimizer as unknown as Parameters<typeof flatOptimizerSpecOf>[0])
      const whole = reshard(readShards(files, { kind: spec.kind, total: this.parameterCount }), shardLayout(this.parameterCount, 1, 0))
      await this.#loadTfjsOptimizer(spec, whole)
    }
  }

  /** Hands a whole flat optimizer state (from shards or the servers) to tfjs's optimizer. */
  async #loadTfjsOptimizer(spec: FlatOptimizerSpec, state: FlatOptimizerState): Promise<void> {
    await writeTfjsOptimizerWeights(this.#tf as unknown as Tf, this.optimizer as unknown as Parameters<typeof writeTfjsOptimizerWeights>[1], tfjsWeightsFromFlat(spec, this.layout, state))
  }

  /**
   * Bytes this rank holds across steps for the optimizer state, the gradient buffers gradwire
   * keeps (ZeRO stage 2: the padded gradient the reduce-scatter works on; stage 0/1: the reduced
   * flat gradient, which lives until it is applied) and ZeRO's parameter buffers (its segment and
   * the gathered vector).
   */
  async memoryStats(): Promise<{ readonly optimizerState: number; readonly reducedGradient: number; readonly gradientBuffers: number; readonly parameterBuffers: number }> {
    const zero = this.#zero
    if (zero) {
      const m = zero.memory()
      const reduced = zero.stage === 2 ? zero.layout.shardSize * 4 : this.parameterCount * 4
      return { optimizerState: m.optimizerState, reducedGradient: reduced, gradientBuffers: m.gradientBuffers || this.parameterCount * 4, parameterBuffers: m.parameterBuffers }
    }
    const weights = await this.optimizer.getWeights()
    let bytes = 0
    for (const w of weights) {
      if (w.name !== "iter") bytes += w.tensor.size * 4
      else w.tensor.dispose()
    }
    // A group of one applies tfjs's gradients in place: no flat copy of them.
    const flat = this.#sync.worldSize === 1 && !this.exchangeAlone ? 0 : this.parameterCount * 4
    return { optimizerState: bytes, reducedGradient: flat, gradientBuffers: flat, parameterBuffers: 0 }
  }

  /** Targets in the form the loss wants: one-hot for categoricalCrossentropy, class ids otherwise. */
  lossTargets(y: Tensor, numClasses: number): Tensor {
    if (this.#classification && !this.#sparse) return this.#tf.oneHot(y, numClasses)
    return y.clone()
  }
}
