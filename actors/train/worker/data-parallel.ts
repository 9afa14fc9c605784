// The data-parallel model wrapper behind TrainContext.prepareModel: every step computes this
// rank's gradients, all-reduces them (weighted by sample counts, so unequal batches still give
// the large-batch SGD update) and applies the same update on every rank. Ranks start from rank 0's
// weights and apply bitwise-identical reduced gradients, so their weights stay identical. What is
// done with the gradient, and the state that takes, is the strategy's (strategies/: ZeRO, parameter
// servers, local SGD, auto); dp.fit()'s epoch loop is fit-loop.ts.
//
// Gradients leave the tfjs engine as ONE flat Float32Array (concatenated on the device, one read;
// or, on host-memory backends with compression, read per variable into the reducer's own buffer),
// buckets are contiguous ranges of it (no packing copy), and the reduced values go back per
// variable from views of it: two copies of the gradient per step, the minimum a backend with its
// own memory (wasm, tensorflow) allows.
import { fusedAdamStep } from "../../../core/kernels/fused-adam.ts"
import { fusedAdamStepWebGpu } from "../../../core/kernels/fused-adam-webgpu.ts"
import { createHash } from "node:crypto"
import type { Tf } from "../../../core/engine.ts"
import type { FitSource } from "./batches.ts"
import { FitLoop, type EpochResult, type FitOptions, type StepResult, type TrainStepOptions } from "./fit-loop.ts"
import { ConfigError } from "../../../core/errors.ts"
import type { LoopPosition, RecoverableModel, ReplayLog } from "./group-session.ts"
import { OPTIMIZER_FILE, loadOptimizerFrom, loadWeightsInto, modelToFiles, optimizerToFile } from "../../../core/model-io.ts"
import type { PeerState } from "../common/train-protocol.ts"
import { lrRuleOf, type LrRule } from "../common/optim/lr-rules.ts"
import { flatOptimizerSpecOf, type FlatOptimizerSpec, type FlatOptimizerState } from "../common/optim/flat-optimizers.ts"
import { hasShards, readShards, reshard, shardLayout, type ZeroStage } from "../common/optim/zero.ts"
import { tfjsWeightsFromFlat, writeTfjsOptimizerWeights } from "../common/optim/tfjs-state.ts"
import { settlingSync } from "./local-sgd.ts"
import { decodeMessage, encodeMessage } from "../../../core/wire.ts"
import type { LossFn, LossName } from "./model-parallel/loss.ts"
import { GradientAccumulator, readFromHeap, readGradients } from "./accumulation.ts"
import { kerasFit, kerasTrainOnBatch, type KerasFitHost } from "./keras-fit.ts"
import { inputsOf, isTensor, rowsOf, type ModelInput } from "./model-input.ts"
export type { ModelInput }
import { countCorrect, labelsOf } from "./model-parallel/loss.ts"
import { broadcastBytes, evaluateLocal, evaluateLocalAsync, resolveLoss, takeRankZeroValues, type EvaluateOptions, type PrepareOptions } from "./prepare-options.ts"
import { strategyOf, type GradientSlot, type GradientSync, type StepObserver } from "./gradient-sync.ts"
import { resolveStrategy, type StrategyHost, type StrategyWorker } from "./strategies/index.ts"
import { clipFlat } from "./clipping.ts"

export type { GradientSlot, GradientSync, ParameterServers, PeerRecovery, RecoveryCursor, StepObserver } from "./gradient-sync.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type LayersModel = import("@tensorflow/tfjs").LayersModel

/** The longest trainStep() holds the event loop across steps before it lets timers run. */
const YIELD_EVERY_MS = 50

/** A prepared model's checkpoint file of its own: the update counter, the ZeRO stage and the world size it was saved at. */
export const DP_STATE_FILE = "data-parallel.json"
type Optimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable

// The same loss names and functions as the pipeline's last stage takes; a source of rows per epoch
// (in memory, or streamed: batches.ts).
export type { LossFn, LossName }
export type { EvaluateOptions, PrepareOptions } from "./prepare-options.ts"
export type { EpochResult, FitCommonOptions, FitOptions, StepResult, TrainStepOptions } from "./fit-loop.ts"
export type { FitSource, ShardSource } from "./batches.ts"


/**
 * Distributed evaluations a rank keeps the group's figures of (its position carries them to a
 * joiner): the last 64, a checkpoint interval of 64 evaluating epochs.
 */
export const EVALUATIONS_KEPT = 64

export class DataParallelModel implements RecoverableModel {
  readonly model: LayersModel
  readonly optimizer: Optimizer
  readonly layout: ReadonlyArray<GradientSlot>
  readonly parameterCount: number
  #tf: tfjs
  #sync: GradientSync
  #loss: LossFn
  /** Each row's loss (the named losses), which fit's classWeight scales. */
  #perSample: ((yTrue: Tensor, yPred: Tensor) => Tensor) | undefined
  /** fit's classWeight while a fit() runs: each class's weight, a [classes] tensor. */
  #classWeight: Tensor | undefined
  /** Class weights apply to the loss (a cross-entropy). */
  #perClass = false
  /** The step in flight's sample weights (trainStep's sampleWeight), a [rows] tensor. */
  #stepWeights: Tensor | undefined
  #classification: boolean
  #sparse: boolean
  #vars: Variable[]
  #observer: StepObserver | undefined
  #delayMsPerSample = 0
  #delayMsPerStep = 0
  #lastComputeMs = 0
  #step = 0
  #inStep = false
  /**
   * The running step has its number (its strategy's beforeStep returned): before that, a regroup
   * that parks this rank in beforeStep's own group operation (strategy auto's decision round)
   * finds the step not begun, so it neither counts as in flight nor is redone with a new number.
   */
  #stepNumbered = false
  #baseLearningRate: number | undefined
  #lrRule: LrRule | undefined
  #lastLearningRate: number | undefined
  /** The rate gradwire last set on the optimizer (prepareModel's rule, the elastic scale): another rate found there is the loop's own schedule's. */
  #rateSet: number | undefined
  #weightDecay = 0
  /** prepareModel's gradient clipping (PrepareOptions.clipNorm / clipValue). */
  #clipNorm: number | undefined
  #clipValue: number | undefined
  /** Gradient accumulation: sample-weighted sums of the micro-batches' gradients since the last exchange. */
  readonly #acc: GradientAccumulator
  /**
   * The group's progress in synchronous steps' worth of gradients (globalStep): one per
   * all-reduce step; on the servers, the updates they applied times the gradients in one, over p.
   */
  #global = 0
  /** The strategy's worker side (strategies/): its state, the exchange and apply of each step. */
  #worker: StrategyWorker
  /** dp.fit()'s loop: its position, batching and regroups (fit-loop.ts). */
  readonly #loop: FitLoop
  /** When trainStep last gave the event loop a turn (performance.now()). */
  #lastTurn = performance.now()
  /**
   * Take the flat-gradient exchange path even with one worker (benchmarks use it to measure that
   * path's cost; a single worker otherwise applies its gradients in place).
   */
  exchangeAlone = false
  /** @internal report() calls still on their way, which a step waits for (TrainContext.report); undefined when none. */
  awaitReports: (() => Promise<void> | undefined) | undefined
  /** Called after every step (live progress). */
  onStep: ((info: { epoch: number; step: number; stepsPerEpoch: number; samples: number; loss: number }) => void) | undefined

  private constructor(tf: Tf, model: LayersModel, sync: GradientSync, opts: PrepareOptions, observer?: StepObserver) {
    this.#tf = tf as unknown as tfjs
    this.model = model
    // Local SGD with overlap: a fragment's round in flight is merged before any other group operation.
    this.#sync = sync.localSgd ? settlingSync(sync, () => this.#worker.settle?.() ?? Promise.resolve()) : sync
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
    this.#perSample = loss.perSample
    this.#perClass = loss.perClass === true
    this.#classification = loss.classification
    this.#sparse = loss.sparse
    this.#vars = model.trainableWeights.map((w) => w.read() as Variable)
    this.#acc = new GradientAccumulator(this.#tf, this.#vars)
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
    this.#delayMsPerStep = opts.simulatedDelayMsPerStep ?? 0
    this.#lrRule = lrRuleOf(opts)
    const wd = opts.weightDecay ?? 0
    if (!Number.isFinite(wd) || wd < 0) throw new ConfigError({ field: "prepareModel.weightDecay", reason: `must be a number >= 0, got ${String(opts.weightDecay)}` })
    this.#weightDecay = wd
    for (const field of ["clipNorm", "clipValue"] as const) {
      const v = opts[field]
      if (v === undefined) continue
      if (typeof v !== "number" || !Number.isFinite(v) || v <= 0) throw new ConfigError({ field: `prepareModel.${field}`, reason: `must be a number > 0, got ${String(v)}` })
      const strategy = strategyOf(sync)
      if (strategy !== "allreduce" && strategy !== "local-sgd") {
        throw new ConfigError({
          field: `prepareModel.${field}`,
          reason: `clips the reduced gradient on every rank, which strategy "${strategy}" does not have (the servers apply the updates): use strategy "allreduce" (ZeRO too) or "local-sgd"`
        })
      }
    }
    this.#clipNorm = opts.clipNorm
    this.#clipValue = opts.clipValue
    if ((this.#lrRule || wd > 0) && typeof (optimizer as unknown as { learningRate?: unknown }).learningRate !== "number") {
      throw new ConfigError({
        field: this.#lrRule ? "prepareModel.lrScaling" : "prepareModel.weightDecay",
        reason: "needs the optimizer's learning rate, and this optimizer has no numeric learningRate (use a tf.train optimizer)"
      })
    }
    this.#baseLearningRate = (optimizer as unknown as { learningRate?: number }).learningRate
    if (typeof this.#baseLearningRate === "number") this.#rateSet = this.#baseLearningRate
    const stage = sync.zeroStage ?? 0
    if (stage !== 0 && stage !== 1 && stage !== 2) throw new ConfigError({ field: "collectiveConfig.zeroStage", reason: `must be 0, 1 or 2, got ${String(stage)}` })
    const dp = this
    this.#loop = new FitLoop({
      tf: this.#tf,
      sync: this.#sync,
      model,
      classification: this.#classification,
      observer,
      get lastComputeMs() { return dp.#lastComputeMs },
      trainStep: (x, y, o) => this.trainStep(x, y, o),
      emptyStep: (idle) => this.#emptyStep(idle),
      lossTargets: (y, n) => this.lossTargets(y, n),
      rankBatch: (bs) => this.#rankBatch(bs),
      get strategyNow() { return dp.#worker.name }
    })
    this.#worker = resolveStrategy(strategyOf(sync)).create!(this.#strategyHost())
  }

  /** What the strategy's worker side may use of this model. */
  #strategyHost(): StrategyHost {
    const dp = this
    return {
      sync: this.#sync,
      layout: this.layout,
      parameterCount: this.parameterCount,
      optimizer: this.optimizer,
      weightDecay: this.#weightDecay,
      observer: this.#observer,
      get learningRate() { return dp.learningRate },
      get inFit() { return dp.#loop.inFit },
      get fitUsed() { return dp.#loop.fitUsed },
      get reports() { return dp.#sync.recovery?.reports },
      get reportsExchange() { return dp.#sync.recovery?.reportsExchange ?? false },
      // (Inside dp.fit() only: a hand-written loop after it gives every rank its own rows.)
      get ranksWithoutRows() { return dp.#loop.inFit ? (dp.#loop.batcher?.batches ?? []).flatMap((b, r) => (b === 0 ? [r] : [])) : [] },
      get soleHolder() {
        const batches = dp.#loop.inFit ? dp.#loop.batcher?.batches : undefined
        if (batches === undefined || batches.length < 2 || batches.length !== dp.#sync.worldSize) return undefined
        const holders = batches.flatMap((b, r) => (b > 0 ? [r] : []))
        return holders.length === 1 ? holders[0] : undefined
      },
      get exchangeAlone() { return dp.exchangeAlone },
      get step() { return dp.#step },
      set step(v: number) { dp.#step = v },
      get global() { return dp.#global },
      set global(v: number) { dp.#global = v },
      readFlatParams: () => this.#readFlatParams(),
      assignFlat: (flat) => this.#assignFlat(flat),
      applyFlat: (flat) => {
        clipFlat(flat, this.#clipValue, this.#clipNorm)
        const tf = this.#tf
        const named: Record<string, Tensor> = {}
        for (const s of this.layout) named[s.name] = tf.tensor(flat.subarray(s.offset, s.offset + s.size), s.shape as number[], "float32")
        this.#applyWhole(named)
        tf.dispose(Object.values(named))
      },
      loadTfjsOptimizer: (spec, state) => this.#loadTfjsOptimizer(spec, state),
      clipNorm: this.#clipNorm,
      clipValue: this.#clipValue,
      clip: (flat, whole) => {
        if (this.#clipValue !== undefined || (whole && this.#clipNorm !== undefined)) clipFlat(flat, this.#clipValue, whole ? this.#clipNorm : undefined)
      }
    }
  }

  /**
   * Wraps a model and makes every rank start from rank 0's weights.
   * @internal A training loop calls ctx.prepareModel, which supplies the group's gradient sync.
   */
  static async prepare(tf: Tf, model: LayersModel, sync: GradientSync, opts: PrepareOptions = {}, observer?: StepObserver): Promise<DataParallelModel> {
    const dp = new DataParallelModel(tf, model, sync, opts, observer)
    dp.#routeModelTraining()
    dp.#applyElasticLearningRate()
    await dp.syncWeights()
    await dp.#worker.init?.()
    return dp
  }

  /**
   * The model's own training calls, which would train this rank alone (its gradients never
   * all-reduced, its weights drifting from the other ranks'), train the group instead (keras-fit.ts):
   * `model.fit(x, y, args)` as dp.fit over the whole dataset every rank passes, `model.trainOnBatch`
   * as dp.trainStep; `model.fitDataset` fails with a ConfigError naming these. predict and evaluate
   * stay the model's own.
   */
  #routeModelTraining(): void {
    const dp = this
    const sync = this.#sync
    const host: KerasFitHost = {
      tf: this.#tf,
      model: this.model,
      classification: this.#classification,
      fit: (source, opts) => dp.fit(source, opts),
      trainStep: (x, y) => dp.trainStep(x, y),
      evaluateAsync: (x, y, o) => dp.evaluateAsync(x, y, o),
      // A replacement replaying the loop to the survivors' position makes no group operation
      // before it joins them (they compared their data at this call already).
      ...(sync.allGather ? { allGather: (buf: Float32Array) => (sync.recovery?.joinTarget !== undefined ? Promise.resolve(undefined) : sync.allGather!(buf)) } : {})
    }
    const define = (name: string, value: (...args: never[]) => unknown) => Object.defineProperty(this.model, name, { configurable: true, writable: true, value })
    define("fit", (x: unknown, y: unknown, args?: Parameters<typeof kerasFit>[3]) => kerasFit(host, x, y, args))
    define("trainOnBatch", (x: unknown, y: unknown) => kerasTrainOnBatch(host, x, y))
    define("fitDataset", () =>
      Promise.reject(
        new ConfigError({
          field: "model.fitDataset",
          reason:
            `on a model passed to ctx.prepareModel() it would train rank ${sync.rank} alone (its gradients not all-reduced): train with ` +
            `model.fit(x, y, { epochs, batchSize }) on the whole dataset (every rank the same), dp.fit(ctx.getDatasetShard(name), { epochs, batchSize }), ` +
            `or dp.trainStep(x, y) on batches you build`
        })
      )
    )
  }

  /** @internal whether a training step is running (RecoverableModel: where a broken group found this rank) */
  inStep(): boolean {
    return this.#inStep
  }

  /** @internal whether steps go through the parameter servers now (ctx.communicationStats() reads it) */
  get viaServers(): boolean {
    return this.#worker.viaServers
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
    return this.#worker.name
  }

  /**
   * The trainable weights as one flat vector in layout order: on wasm each straight from its place
   * on the heap (readFromHeap), elsewhere concatenated on the engine and read once,
   * asynchronously (what a GPU backend needs).
   */
  async #readFlatParams(): Promise<Float32Array> {
    const tf = this.#tf
    if (tf.getBackend() === "wasm") return readFromHeap(tf, this.#vars, this.layout, new Float32Array(this.parameterCount))
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

  /** The loop's recent distributed evaluations as the group computed them (Position.evaluations), and the count of the current report() round's. */
  #evaluations: Array<[number, number, number, number]> = []
  #evaluationsAt: [number, number] = [-1, 0]

  /** The micro-batches the loop added with `{ accumulate: true }` that no update has applied yet. */
  get unappliedAccumulation(): { readonly microBatches: number; readonly samples: number } {
    return this.#acc.pending
  }

  /** This rank's loop ended: the strategy settles (parameter servers: sync and ssp steps stop waiting for it). */
  async finish(): Promise<void> {
    await this.#worker.finish?.()
  }

  /** collectiveConfig.zeroStage as this model runs it. */
  get zeroStage(): ZeroStage {
    return this.#worker.zeroStage ?? 0
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
    // The constructor kept the optimizer's own rate as the base; a rate the loop set since is the base now.
    this.#followLoopRate()
    const lr = (this.#baseLearningRate as number) * this.learningRateScale
    if (o.learningRate !== lr) this.#setLearningRate(lr)
  }

  /**
   * The loop set the optimizer's rate itself since gradwire last did (its own schedule: a step
   * decay each epoch, a cosine, as a DDP loop sets its param_groups' lr): that rate becomes the base
   * that prepareModel's rule (lrScaling, warmupSteps) and the elastic scale multiply from now on,
   * where they had set the rate back from their first base and the loop's schedule was lost.
   */
  #followLoopRate(): void {
    const now = this.learningRate
    if (now !== undefined && this.#rateSet !== undefined && now !== this.#rateSet) this.#baseLearningRate = now
  }

  // --------------------------------------------------------------------------------------------
  // Recovery from surviving peers (the group session calls these, group-session.ts)

  /** The state other members of a regrouped generation take: weights, optimizer state, step counter. */
  async snapshot(): Promise<Omit<PeerState, "position">> {
    const own = this.#worker.snapshotFiles?.(this.#inStep && this.#stepNumbered)
    const files = {
      ...(await modelToFiles(this.#tf as unknown as Tf, this.model)),
      [OPTIMIZER_FILE]: await optimizerToFile(this.optimizer),
      ...own
    }
    // Steps completed: a step in flight (this rank is parked in its reduction) does not count yet,
    // unless this rank has updated its state for it (ZeRO, parked in the step's last operation).
    return { files, step: this.#step - (this.#inStep && this.#stepNumbered && !this.#worker.stepApplied ? 1 : 0) }
  }

  /** What a regroup merges from every survivor besides the snapshot (ZeRO stage 1's shard and replica). */
  peerFiles(): Record<string, Uint8Array> | undefined {
    return this.#worker.peerFiles?.()
  }

  /** Takes a survivor's state: the same weights, optimizer state and step counter as it. */
  async adopt(state: PeerState, options: { readonly redoingStep?: boolean } = {}): Promise<void> {
    // Local SGD: a member in the survivor's round keeps its own parameters (local-sgd.ts).
    const after = await this.#worker.beforeAdopt?.(state.files)
    loadWeightsInto(this.#tf as unknown as Tf, this.model, state.files)
    after?.()
    // A step this rank is in and will redo in the new group keeps its number; the next one follows.
    // The group step goes on from the taken state's step counter, or from where the strategy counts
    // it (the servers' version: ParameterServerWorker.adopted).
    const step = state.step + (this.#inStep && this.#stepNumbered && options.redoingStep ? 1 : 0)
    this.#global = step
    await this.#worker.adopted?.(state.files, { inStep: this.#inStep && this.#stepNumbered, redoingStep: options.redoingStep === true })
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
    this.#step = step
  }

  // --------------------------------------------------------------------------------------------
  // State parity (failureConfig.parityEvery; train-context.ts runs the exchange at report rounds)

  /** At report() call `index` on every rank (train-context.ts), before its parity check: the strategy's work there (StrategyWorker.atReport). */
  async atReport(index: number): Promise<void> {
    await this.#worker.atReport?.(index)
  }

  /** Whether the ranks of this group hold the same state between steps (what stateDigest covers). */
  get #replicated(): boolean {
    return this.#worker.replicated
  }

  /**
   * A digest of the state every rank of a synchronous group holds alike: trainable weights,
   * optimizer state and step counter; with ZeRO the weights only (each rank holds its own optimizer
   * shard). Four 16-bit numbers of a SHA-256: integers, exact in float32, and no NaN bit patterns for
   * a copy to canonicalise. Undefined where ranks legitimately differ: local SGD between rounds,
   * parameter servers (async, SSP), strategy auto while it runs either (on the all-reduce it has
   * one: AutoWorker.replicated). Non-trainable weights (batch-norm statistics, computed on each rank's own
   * batches) are not in it: syncBuffers() gives every rank rank 0's.
   */
  async stateDigest(): Promise<Float32Array | undefined> {
    if (!this.#replicated) return undefined
    const h = createHash("sha256")
    const values = await Promise.all(this.model.trainableWeights.map((w) => w.read().data() as Promise<Float32Array>))
    for (const v of values) h.update(new Uint8Array(v.buffer, v.byteOffset, v.byteLength))
    if (!this.zeroStage) h.update(await optimizerToFile(this.optimizer)).update(String(this.#step))
    const d = h.digest()
    return Float32Array.from([d.readUInt16LE(0), d.readUInt16LE(2), d.readUInt16LE(4), d.readUInt16LE(6)])
  }

  /**
   * Rank 0's non-trainable weights (batch-norm moving statistics) to every rank, as DDP broadcasts
   * its buffers: each rank's come from its own batches. All ranks call it; nothing when the model
   * has none, or its ranks are not replicas.
   */
  async syncBuffers(broadcast: (buf: Float32Array) => Promise<void>): Promise<void> {
    if (this.#replicated) await takeRankZeroValues(this.#tf, this.model.nonTrainableWeights, broadcast)
  }

  /**
   * Every rank takes rank 0's state (all ranks call it; `broadcast` sends rank 0's buffer to the
   * others): its snapshot's bytes, two to a float32 (16-bit integers: exact, no NaN patterns), then adopted by every rank, rank 0
   * included, as after a regroup; with ZeRO its weights.
   */
  async takeRankZeroState(broadcast: (buf: Float32Array) => Promise<void>): Promise<void> {
    if (this.zeroStage) {
      await takeRankZeroValues(this.#tf, this.model.weights, broadcast)
      return
    }
    const bytes = this.#sync.rank === 0 ? encodeMessage(await this.snapshot()) : undefined
    // Rank 0 loads its own snapshot too: the optimizer rebuilds its derived state (Adam's bias
    // corrections) from what it loads, and the others' must match it bit for bit (as in a regroup).
    const out = await broadcastBytes(bytes, broadcast)
    const state = decodeMessage(out) as Omit<PeerState, "position">
    await this.adopt({ ...state, position: { ops: 0, reports: 0, stepsSinceReport: 0, inFit: false, epoch: 0, stepInEpoch: 0, stepsPerEpoch: 0 } })
  }

  /** The group changed: the learning rate follows its size under "keep-per-worker"; batches are re-cut by fit(). */
  regrouped(): void {
    this.#loop.batcher = undefined
    this.#applyElasticLearningRate()
  }

  /** Whether the loop has called dp.fit() (GroupSession: a grow parks such a loop at its next step, not at a report). */
  fitUsed(): boolean {
    return this.#loop.fitUsed
  }

  loopPosition(): LoopPosition {
    const l = this.#loop
    const pinned = this.#worker.peersCannotNow?.()
    return {
      inFit: l.inFit,
      epoch: l.epoch,
      stepInEpoch: l.stepInEpoch,
      stepsPerEpoch: l.stepsPerEpoch,
      ...(l.inFit && l.stream ? { stream: l.stream } : {}),
      ...(pinned !== undefined ? { strategyPinned: pinned } : {})
    }
  }

  replayLog(): ReplayLog {
    const epochs = this.#loop.epochLog
    return {
      ...(this.#evaluations.length > 0 ? { evaluations: this.#evaluations.map((e) => [...e]) } : {}),
      ...(epochs.length > 0 ? { epochs: epochs.map((e) => [...e]) } : {})
    }
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
    await takeRankZeroValues(this.#tf, this.model.weights, async (buf) => {
      const t0 = performance.now()
      await this.#sync.broadcast(buf)
      this.#observer?.wait?.("broadcast weights from rank 0", t0, performance.now())
    })
  }

  /** The group's gradient buffer (GradientSync.gradientBuffer), on backends that keep tensors in host memory. */
  #ownGradientBuffer(): Float32Array | undefined {
    return this.#tf.getBackend() === "tensorflow" ? undefined : this.#sync.gradientBuffer?.(this.parameterCount)
  }

  /**
   * One synchronous data-parallel step on this rank's batch (y in the loss's target form: one-hot
   * for categoricalCrossentropy, class ids for sparseCategoricalCrossentropy); returns this rank's
   * loss and, for classification, its correct predictions. With { accumulate: true } the batch's
   * gradients are only added up locally (see TrainStepOptions). A model of several inputs takes
   * them as an array (in the model's input order) or by input name.
   */
  async trainStep(x: ModelInput, y: Tensor, options: TrainStepOptions = {}): Promise<StepResult> {
    const reports = this.awaitReports?.()
    if (reports) await reports
    await this.#letTimersRun()
    const recovery = this.#sync.recovery
    // A rank joining survivors replays a hand-written loop from the checkpoint: the steps they made
    // already are skipped (loss NaN, no samples), and at their position it takes their state.
    if (recovery?.joinTarget && !this.#loop.inFit && (options.accumulate || (await recovery.replayStep()) === "skip")) return { loss: Number.NaN, samples: 0 }
    const weights = options.sampleWeight === undefined ? undefined : this.#sampleWeightsOf(options.sampleWeight, rowsOf(x))
    this.#stepWeights = weights
    try {
      if (options.accumulate) return await this.#accumulateStep(x, y)
      this.#inStep = true
      this.#stepNumbered = false
      try {
        const r = await this.#trainStep(x, y)
        recovery?.countStep()
        return r
      } finally {
        this.#inStep = false
      }
    } finally {
      this.#stepWeights = undefined
      if (weights && weights !== options.sampleWeight) weights.dispose()
    }
  }

  /** trainStep's sampleWeight as a [rows] float32 tensor (the caller's own when it is one of that shape). */
  #sampleWeightsOf(given: NonNullable<TrainStepOptions["sampleWeight"]>, rows: number): Tensor {
    const field = "trainStep(sampleWeight)"
    if (!this.#perSample) {
      throw new ConfigError({ field, reason: "weights each row's loss, which needs a loss named in compile() (a cross-entropy or meanSquaredError), not a loss function" })
    }
    const tf = this.#tf
    if (isTensor(given)) {
      if (given.size !== rows) throw new ConfigError({ field, reason: `holds ${given.size} weights for a batch of ${rows} rows: one per row` })
      return given.rank === 1 && given.dtype === "float32" ? given : tf.tidy(() => given.reshape([rows]).toFloat())
    }
    const values = Float32Array.from(given as ArrayLike<number>)
    if (values.length !== rows) throw new ConfigError({ field, reason: `holds ${values.length} weights for a batch of ${rows} rows: one per row` })
    if (values.some((v) => !Number.isFinite(v) || v < 0)) throw new ConfigError({ field, reason: "weights must be numbers >= 0" })
    return tf.tensor1d(values, "float32")
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

  /** Loss, gradients and (classification) correct predictions of a batch. */
  #forward(x: ModelInput, y: Tensor): { value: Scalar; grads: Record<string, Tensor>; correct: Tensor | undefined } {
    const tf = this.#tf
    let pred: Tensor | undefined
    const input = inputsOf(this.model, x)
    const { value, grads } = this.optimizer.computeGradients(() => {
      const out = this.model.apply(input, { training: true }) as Tensor
      if (this.#classification) pred = tf.keep(out)
      // classWeight, sampleWeight: each row's loss times its class's and its own weight, their mean (as Keras's).
      const byClass = this.#classWeight ? tf.gather(this.#classWeight, labelsOf(y)) : undefined
      const byRow = this.#stepWeights
      if ((byClass || byRow) && this.#perSample) {
        const w = byClass && byRow ? tf.mul(byClass, byRow) : (byClass ?? byRow)!
        return tf.mul(this.#perSample(y, out), w).mean() as Scalar
      }
      return this.#loss(y, out)
    }, this.#vars)
    const correct = pred ? countCorrect(tf, pred, y) : undefined
    pred?.dispose()
    return { value, grads: grads as Record<string, Tensor>, correct }
  }

  async #accumulateStep(x: ModelInput, y: Tensor): Promise<StepResult> {
    const tf = this.#tf
    const samples = rowsOf(x)
    const t0 = performance.now()
    const { value, grads, correct } = this.#forward(x, y)
    this.#acc.add(grads, samples)
    const [lossArr, correctArr] = await Promise.all([value.data(), correct?.data()])
    tf.dispose([value, ...(correct ? [correct] : [])])
    await this.#simulatedDelay(samples)
    this.#acc.computeMs += performance.now() - t0
    return { loss: lossArr[0], samples, ...(correctArr ? { correct: correctArr[0] } : {}) }
  }

  /**
   * prepareModel's learning-rate rule for update `step` with `samples` on this rank: sets the
   * optimizer's rate (ZeRO's shard optimizer takes it from there) and returns it.
   */
  #applyLearningRateRule(step: number, samples: number): void {
    const rule = this.#lrRule
    if (!rule) {
      // (the elastic scale follows a rate the loop sets between regroups, too)
      const e = this.#sync.elastic
      if (e && e.batch === "keep-per-worker" && this.#rateSet !== undefined) this.#applyElasticLearningRate()
      return
    }
    this.#followLoopRate()
    const global = this.#loop.fitGlobalBatch ?? samples * this.#sync.worldSize
    const lr = (this.#baseLearningRate as number) * rule.factor(step, global)
    this.#lastLearningRate = lr
    this.#setLearningRate(lr)
  }

  #setLearningRate(lr: number): void {
    const o = this.optimizer as unknown as { learningRate: number; setLearningRate?: (lr: number) => void }
    if (typeof o.setLearningRate === "function") o.setLearningRate(lr)
    else o.learningRate = lr
    this.#rateSet = o.learningRate
  }

  /**
   * Sets the learning rate from the loop, for a schedule of its own (PyTorch's StepLR, a cosine): the
   * optimizer takes it now, and prepareModel's lrScaling and warmupSteps and the elastic
   * "keep-per-worker" scale multiply it from the next update on. Setting the optimizer's rate
   * directly (setLearningRate, learningRate) is followed the same way; this is its typed form.
   */
  setLearningRate(lr: number): void {
    if (typeof lr !== "number" || !Number.isFinite(lr) || lr < 0) {
      throw new ConfigError({ field: "dp.setLearningRate", reason: `takes a finite rate >= 0, got ${String(lr)}` })
    }
    if (typeof this.#baseLearningRate !== "number") {
      throw new ConfigError({ field: "dp.setLearningRate", reason: "this optimizer has no numeric learningRate (use a tf.train optimizer)" })
    }
    this.#baseLearningRate = lr
    this.#setLearningRate(lr)
  }

  /** The optimizer's learning rate now (undefined for one without a numeric rate). */
  get learningRate(): number | undefined {
    const lr = (this.optimizer as unknown as { learningRate?: unknown }).learningRate
    return typeof lr === "number" ? lr : undefined
  }

  /** Clips gradients that stayed on the engine (a step with nobody to exchange with), in place in `grads`: as clipFlat. */
  async #clipTensors(grads: Record<string, Tensor>): Promise<void> {
    const tf = this.#tf
    const names = Object.keys(grads)
    const value = this.#clipValue
    if (value !== undefined) {
      for (const k of names) {
        const c = tf.clipByValue(grads[k]!, -value, value)
        grads[k]!.dispose()
        grads[k] = c
      }
    }
    const max = this.#clipNorm
    if (max === undefined || names.length === 0) return
    const normT = tf.tidy(() => tf.sqrt(tf.addN(names.map((k) => tf.sum(tf.square(grads[k]!))))))
    const norm = (await normT.data())[0]!
    normT.dispose()
    if (!(norm > max)) return
    const scale = max / norm
    for (const k of names) {
      const c = tf.mul(grads[k]!, scale)
      grads[k]!.dispose()
      grads[k] = c
    }
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
    // On wasm, tfjs's Adam as one in-place pass per variable (bit for bit the same update); on
    // webgpu, one dispatch per variable.
    if (!fusedAdamStep(tf, this.optimizer, grads) && !fusedAdamStepWebGpu(tf, this.optimizer, grads)) this.optimizer.applyGradients(grads)
  }

  /** Simulated heterogeneity (prepare options): the sleep of a slower device's forward+backward over `rows` rows. */
  async #simulatedDelay(rows: number): Promise<void> {
    const ms = this.#delayMsPerSample * rows + (rows > 0 ? this.#delayMsPerStep : 0)
    if (ms > 0) await new Promise((r) => setTimeout(r, ms))
  }

  /**
   * A step with no rows (sample weight 0): this rank takes part in the group's exchange and applies
   * the same update as the others, adding nothing to it. A rank joining a streamed epoch does this
   * for the step the survivors redo as it joins (their rows of it were planned before it came;
   * under local SGD it does nothing there), and a rank the heterogeneity-aware batcher left without
   * rows (`idle`) for each of its steps: under local SGD an inner step with nothing to apply, its
   * outer rounds coming due with every rank's, its delta weighted by the 0 samples behind it.
   */
  async #emptyStep(idle: boolean): Promise<void> {
    const worker = this.#worker
    if (worker.inPlace() && !idle) return
    this.#inStep = true
    this.#stepNumbered = false
    try {
      await worker.beforeStep?.()
      const step = this.#step++
      this.#stepNumbered = true
      this.#applyLearningRateRule(step, 0)
      // (Asked after beforeStep: strategy auto may have moved there.)
      if (worker.inPlace()) await worker.afterInPlace?.(0)
      else await this.#emptyExchange(worker, step)
      if (!worker.viaServers) this.#global++
      this.#sync.recovery?.countStep()
    } finally {
      this.#inStep = false
    }
    // The rank's progress goes on (a step with no samples; its loss is not counted).
    const base = this.#loop.stepBase
    this.onStep?.({ epoch: this.#loop.epoch, step: base + this.#loop.stepInEpoch, stepsPerEpoch: base + this.#loop.stepsPerEpoch, samples: 0, loss: Number.NaN })
  }

  /** An empty step's exchange: a zero gradient of sample weight 0, and the group's update applied. */
  async #emptyExchange(worker: StrategyWorker, step: number): Promise<void> {
    // Of the length readGradients gives (ZeRO stage 2 pads it to a multiple of the world size).
    const flat = worker.gradientBuffer?.() ?? this.#ownGradientBuffer() ?? new Float32Array(this.parameterCount)
    flat.fill(0)
    const exchanged = await worker.exchange(flat, {
      step,
      samples: 0,
      ...this.#globalSamples(),
      recompute: async () => {
        flat.fill(0)
        return flat
      }
    })
    if (!exchanged.adopted) await exchanged.apply?.()
  }

  /** The step's samples over every rank, where dp.fit() knows them (StepExchange.globalSamples). */
  #globalSamples(): { globalSamples?: number } {
    const g = this.#loop.inFit ? this.#loop.fitGlobalBatch : undefined
    return g !== undefined && g > 0 ? { globalSamples: g } : {}
  }

  async #trainStep(x: ModelInput, y: Tensor): Promise<StepResult> {
    const tf = this.#tf
    const worker = this.#worker
    await worker.beforeStep?.()
    const step = this.#step++
    this.#stepNumbered = true
    const t0 = performance.now()
    const fwd = this.#forward(x, y)
    const own = rowsOf(x)
    const { grads, samples } = this.#acc.withAccumulated(fwd.grads, own)
    const value = fwd.value
    const correctT = fwd.correct
    this.#applyLearningRateRule(step, samples)
    const done = (lossArr: ArrayLike<number>, correctArr: ArrayLike<number> | undefined): StepResult => {
      if (!worker.viaServers) this.#global++
      const base = this.#loop.stepBase
      this.onStep?.({ epoch: this.#loop.epoch, step: base + this.#loop.stepInEpoch++, stepsPerEpoch: base + this.#loop.stepsPerEpoch, samples, loss: lossArr[0]! })
      return { loss: lossArr[0]!, samples: own, ...(correctArr ? { correct: correctArr[0]! } : {}) }
    }
    if (worker.inPlace()) {
      // Nobody to exchange with (or local SGD's inner step): apply the gradients where they are,
      // without the round trip out of the engine and back.
      const [lossArr, correctArr] = await Promise.all([value.data(), correctT?.data()])
      tf.dispose([value, ...(correctT ? [correctT] : [])])
      await this.#simulatedDelay(own)
      const t1 = performance.now()
      this.#lastComputeMs = t1 - t0 + this.#acc.computeMs
      this.#acc.clear()
      this.#observer?.phase?.("forward_backward", t0, t1, step)
      worker.computed?.(this.#lastComputeMs, step, true)
      if (this.#clipNorm !== undefined || this.#clipValue !== undefined) await this.#clipTensors(grads)
      this.#applyWhole(grads)
      tf.dispose(Object.values(grads))
      const t2 = performance.now()
      // Local SGD: the outer round of the fragments due after this step (none most steps).
      await worker.afterInPlace?.(samples)
      const t3 = performance.now()
      this.#observer?.phase?.("allreduce", t2, t3, step)
      this.#observer?.phase?.("apply", t1, t2, step)
      this.#observer?.phase?.("step", t0, t3, step)
      return done(lossArr, correctArr)
    }
    let [flat, lossArr, correctArr] = await Promise.all([readGradients(this.#tf, this.#vars, this.layout, grads, worker.gradientBuffer?.() ?? this.#ownGradientBuffer()), value.data(), correctT?.data()])
    tf.dispose([value, ...(correctT ? [correctT] : [])])
    tf.dispose(Object.values(grads))
    await this.#simulatedDelay(own)
    const t1 = performance.now()
    this.#lastComputeMs = t1 - t0 + this.#acc.computeMs
    this.#observer?.phase?.("forward_backward", t0, t1, step)
    worker.computed?.(this.#lastComputeMs, step, false)
    const exchanged = await worker.exchange(flat, {
      step,
      samples,
      ...this.#globalSamples(),
      // The group broke under the reduction and was re-formed: this rank's gradients again (the
      // weights are unchanged), with the micro-batches it accumulated before, which it kept.
      recompute: async () => {
        const again = this.#forward(x, y)
        const redo = this.#acc.withAccumulated(again.grads, own)
        ;[flat, lossArr] = await Promise.all([readGradients(this.#tf, this.#vars, this.layout, redo.grads, this.#ownGradientBuffer()), again.value.data()])
        tf.dispose([again.value, ...(again.correct ? [again.correct] : []), ...Object.values(redo.grads)])
        return flat
      }
    })
    this.#acc.clear()
    const t2 = performance.now()
    this.#observer?.phase?.("allreduce", exchanged.sentAt ?? t1, t2, step)
    if (exchanged.adopted) {
      // The group was re-formed and this rank took the state of a survivor that completed this
      // step: its update is in the weights already.
      this.#observer?.phase?.("step", t0, t2, step)
      return { loss: lossArr[0]!, samples: own, ...(correctArr ? { correct: correctArr[0]! } : {}) }
    }
    await exchanged.apply?.()
    const t3 = performance.now()
    this.#observer?.phase?.("apply", t2, t3, step)
    this.#observer?.phase?.("step", t0, t3, step)
    return done(lossArr, correctArr)
  }

  /**
   * Loss and accuracy of this rank's model on (x, y), read asynchronously: the form a GPU backend
   * needs (webgpu has no synchronous read in Node). Computed locally on all the rows, or with
   * `{ distributed: true }` each rank on its 1/p of them and the sums all-reduced (every rank must
   * call it then, with the same rows), as DDP's evaluation over a DistributedSampler does.
   */
  async evaluateAsync(x: ModelInput, y: Tensor, options: EvaluateOptions = {}): Promise<{ loss: number; accuracy?: number }> {
    const inputs = inputsOf(this.model, x)
    const { rank, worldSize } = this.#sync
    if (!options.distributed || worldSize === 1) return evaluateLocalAsync(this.#tf, this.model, this.#loss, this.#classification, inputs, y)
    // Which of the loop's distributed evaluations this is: the report() calls before it, and its
    // number since the last one. A replacement replaying the loop to the survivors answers it with
    // the figures the group had (the furthest survivor's log, in its position), not with its own
    // part on the checkpoint's weights, so that the loop's values (a best score, an early-stopping
    // counter) are the survivors' when it joins them.
    const recovery = this.#sync.recovery
    const reports = recovery?.reports ?? 0
    if (this.#evaluationsAt[0] !== reports) this.#evaluationsAt = [reports, 0]
    const index = this.#evaluationsAt[1]++
    const replaying = recovery?.joinTarget
    if (replaying) {
      const logged = replaying.evaluations?.find((e) => e[0] === reports && e[1] === index)
      if (logged) {
        // (kept as its own: it may be the furthest survivor of a later regroup)
        this.#evaluations.push([reports, index, logged[2]!, logged[3]!])
        return { loss: logged[2]!, ...(this.#classification ? { accuracy: logged[3]! } : {}) }
      }
    }
    // This rank's contiguous part of the rows, then one all-reduce of the sums: the whole set's
    // figures on every rank (the same weights everywhere) at 1/p of the computation.
    const n = y.shape[0] ?? 0
    const lo = Math.floor((rank * n) / worldSize)
    const hi = Math.floor(((rank + 1) * n) / worldSize)
    const totals = new Float32Array(3)
    if (hi > lo) {
      const tf = this.#tf
      const part = (t: Tensor) => t.slice(lo, hi - lo)
      const xs = Array.isArray(inputs) ? inputs.map(part) : part(inputs)
      const ys = part(y)
      try {
        const r = await evaluateLocalAsync(tf, this.model, this.#loss, this.#classification, xs, ys)
        totals.set([r.loss * (hi - lo), (r.accuracy ?? 0) * (hi - lo), hi - lo])
      } finally {
        tf.dispose([ys, ...(Array.isArray(xs) ? xs : [xs])])
      }
    }
    // (a replacement replaying the loop to the survivors makes no group operation before it joins
    // them: its figures are its own part's, and its reports are not sent until then)
    if (this.#sync.recovery?.joinTarget === undefined) await this.#sync.sum(totals)
    const count = Math.max(1, totals[2]!)
    const out = { loss: totals[0]! / count, ...(this.#classification ? { accuracy: totals[1]! / count } : {}) }
    if (!replaying) {
      this.#evaluations.push([reports, index, out.loss, out.accuracy ?? Number.NaN])
      if (this.#evaluations.length > EVALUATIONS_KEPT) this.#evaluations.splice(0, this.#evaluations.length - EVALUATIONS_KEPT)
    }
    return out
  }

  /** Loss and accuracy of this rank's model on (x, y), computed locally (synchronous reads: cpu, wasm, tensorflow; on webgpu use evaluateAsync). */
  evaluate(x: ModelInput, y: Tensor): { loss: number; accuracy?: number } {
    return evaluateLocal(this.#tf, this.model, this.#loss, this.#classification, inputsOf(this.model, x), y)
  }

  /**
   * Trains over this rank's shard for some epochs; the metrics handed to onEpochEnd cover all ranks
   * (fit-loop.ts: in-memory rows or a stream, global batches split by throughput, accumulation,
   * regroups and joins with recovery from peers).
   */
  async fit(source: FitSource, opts: FitOptions): Promise<EpochResult[]> {
    if (opts.classWeight === undefined) return this.#loop.fit(source, opts)
    if (this.#classWeight) throw new ConfigError({ field: "fit(classWeight)", reason: "a fit() with classWeight is running already on this model" })
    this.#classWeight = this.#tf.tensor1d(this.#classWeightsOf(opts.classWeight), "float32")
    try {
      return await this.#loop.fit(source, opts)
    } finally {
      this.#classWeight.dispose()
      this.#classWeight = undefined
    }
  }

  /** fit's classWeight ({ class: weight }, or an array by class) as a weight per class: 1 for a class not named (as Keras). */
  #classWeightsOf(given: NonNullable<FitOptions["classWeight"]>): Float32Array {
    const field = "fit(classWeight)"
    if (!this.#perSample || !this.#perClass) {
      throw new ConfigError({
        field,
        reason: "weights each row's loss by its class, which needs a classification loss named in compile() (sparseCategoricalCrossentropy, categoricalCrossentropy or binaryCrossentropy), not a loss function or a regression loss"
      })
    }
    const width = this.model.outputs[0]?.shape.at(-1) ?? 1
    const classes = Math.max(2, width)
    if (typeof given !== "object" || given === null) throw new ConfigError({ field, reason: `takes { [classId]: weight } or an array of weights by class, got ${String(given)}` })
    const out = new Float32Array(classes).fill(1)
    const entries: Array<[string, unknown]> = Array.isArray(given) ? given.map((v, i) => [String(i), v]) : Object.entries(given)
    for (const [k, v] of entries) {
      const c = Number(k)
      if (!Number.isInteger(c) || c < 0 || c >= classes) throw new ConfigError({ field, reason: `names class ${JSON.stringify(k)}, and the model's classes are 0..${classes - 1}` })
      if (typeof v !== "number" || !Number.isFinite(v) || v < 0) throw new ConfigError({ field, reason: `class ${c}'s weight must be a number >= 0, got ${String(v)}` })
      out[c] = v
    }
    return out
  }

  /** Heterogeneity-aware batching state for report(): per-rank batches, re-balances, stragglers. */
  batchingMetrics(): Record<string, number | string> {
    const e = this.#sync.elastic
    return {
      ...this.#loop.batcher?.metrics(),
      // Elastic groups always; a fixed-size group while it runs short-handed.
      ...(e && (!e.fixed || this.#sync.worldSize < e.maxWorkers) ? { world_size: this.#sync.worldSize, lr_scale: this.learningRateScale } : {}),
      // The learning rate prepareModel's rule set for the last update.
      ...(this.#lrRule && this.#lastLearningRate !== undefined ? { lr: this.#lastLearningRate } : {}),
      // The strategy's: auto's choice and switches, local SGD's rounds, the servers' staleness and pushes.
      ...this.#worker.metrics?.()
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
    const whole = (): Promise<Uint8Array> => optimizerToFile(this.optimizer)
    const files = this.#worker.checkpointFiles ? await this.#worker.checkpointFiles(whole) : { [OPTIMIZER_FILE]: await whole() }
    return { ...files, [DP_STATE_FILE]: state }
  }

  /** ZeRO: this rank's shard of the optimizer state, as the checkpoint file it adds to its reports. */
  shardFiles(): Record<string, Uint8Array> {
    return this.#worker.shardFiles?.() ?? {}
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
    // The strategy's own state (local SGD's outer loop, the servers', ZeRO's shards, auto's move back).
    if (await this.#worker.restore?.(files)) return
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
    const own = this.#worker.memoryStats?.()
    if (own) return own
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
