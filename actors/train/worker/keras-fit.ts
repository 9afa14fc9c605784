// A prepared model's own training calls, the way tfjs code already calls them. `model.fit(x, y,
// args)` trains data-parallel as tf.distribute's MultiWorkerMirroredStrategy does: every rank
// passes the same whole dataset, each epoch every rank trains on its share of a common shuffle,
// `batchSize` is the global batch, and the metrics are the group's (dp.fit over the tensors'
// rows). `model.trainOnBatch(x, y)` is one dp.trainStep on this rank's batch, as Horovod's
// DistributedOptimizer makes it. `model.fitDataset` is refused with what to call instead. Without
// this, each call trained its rank alone: its gradients never all-reduced, its weights drifting
// from the other ranks' (which the report rounds' parity check then overwrote with rank 0's).
import { createHash } from "node:crypto"
import { makeDataset, rowRange, type ArrayDataset } from "../../../core/datasets.ts"
import { ConfigError } from "../../../core/errors.ts"
import type { EpochResult, FitOptions, StepResult } from "./fit-loop.ts"
import type { FitSource } from "./batches.ts"
import { isTensor, type ModelInput } from "./model-input.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

/** What model.fit() needs of the prepared model (DataParallelModel). */
export interface KerasFitHost {
  readonly tf: tfjs
  readonly model: LayersModel
  /** The loss is a classification loss (class ids or one-hot targets). */
  readonly classification: boolean
  fit(source: FitSource, opts: FitOptions): Promise<EpochResult[]>
  trainStep(x: ModelInput, y: Tensor): Promise<StepResult>
  evaluateAsync(x: Tensor, y: Tensor, options?: { readonly distributed?: boolean }): Promise<{ loss: number; accuracy?: number }>
  /**
   * Every rank's copy of `buf`, concatenated in rank order (one group operation); absent, or
   * undefined for this call (a replacement replaying the loop to where the survivors are, which
   * compared their data when they were here), the data is not compared.
   */
  readonly allGather?: (buf: Float32Array) => Promise<Float32Array | undefined>
}

/** The arguments of tfjs's model.fit that model.fit() on a prepared model takes (ModelFitArgs). */
interface FitArgs {
  readonly epochs?: number
  readonly batchSize?: number
  readonly initialEpoch?: number
  readonly validationData?: ReadonlyArray<Tensor>
  readonly validationSplit?: number
  readonly shuffle?: boolean
  readonly verbose?: number
  readonly callbacks?: unknown
  readonly classWeight?: Readonly<Record<number, number>> | ReadonlyArray<number>
  readonly sampleWeight?: Tensor | ArrayLike<number>
  readonly stepsPerEpoch?: number
  readonly validationSteps?: number
  readonly yieldEvery?: unknown
}

/** The callbacks of tfjs's fit that are called here (CustomCallbackArgs, and tf.Callback objects such as tf.callbacks.earlyStopping). */
interface Callbacks {
  setModel?(model: unknown): void
  setParams?(params: Record<string, unknown>): void
  onTrainBegin?(logs?: Record<string, number>): unknown
  onTrainEnd?(logs?: Record<string, number>): unknown
  onEpochBegin?(epoch: number, logs?: Record<string, number>): unknown
  onEpochEnd?(epoch: number, logs?: Record<string, number>): unknown
  onBatchEnd?(batch: number, logs?: Record<string, number>): unknown
}

/** What model.fit() resolves with: tfjs's History (its `epoch` and `history` fields). */
export interface FitHistory {
  readonly epoch: number[]
  readonly history: Record<string, number[]>
  readonly params: Record<string, unknown>
}

const SUPPORTED = new Set(["epochs", "batchSize", "initialEpoch", "validationData", "validationSplit", "shuffle", "verbose", "callbacks", "classWeight", "sampleWeight"])

const refusal = (field: string, reason: string) => new ConfigError({ field: `model.fit(${field})`, reason })

/** One tensor (not an array or map of them: models of several inputs train with dp.trainStep). */
const single = (what: string, v: unknown): Tensor => {
  if (!isTensor(v)) {
    throw refusal(what, `on a prepared model takes one tensor (models of several inputs or outputs train with dp.trainStep(x, y) on batches you build), got ${Array.isArray(v) ? "an array" : typeof v}`)
  }
  return v
}

/**
 * The rows of (x, y) as a dataset: features as float32; targets as class ids where the loss is a
 * classification loss and each row is one id (or one-hot: its position), else as float targets of
 * their row shape.
 */
export const datasetOf = async (host: Pick<KerasFitHost, "classification" | "model">, x: Tensor, y: Tensor): Promise<ArrayDataset> => {
  const n = x.shape[0]
  if (n === undefined || n < 1) throw refusal("x", `needs rows along its first axis, got shape [${x.shape.join(", ")}]`)
  if (y.shape[0] !== n) throw refusal("y", `has ${y.shape[0]} rows, x has ${n}: one target per row`)
  const xd = await x.data()
  const features = xd instanceof Float32Array ? new Float32Array(xd) : Float32Array.from(xd as ArrayLike<number>)
  const yd = (await y.data()) as ArrayLike<number>
  const per = y.size / n
  // the class count one-hot targets take: the model's output width
  const outputs = host.model.outputs[0]?.shape.at(-1) ?? undefined
  if (host.classification && per === 1) {
    const ids = Int32Array.from(yd)
    if (ids.some((v, i) => v !== yd[i])) throw refusal("y", "holds class ids for a classification loss, and they must be whole numbers")
    let classes = 0
    for (const v of ids) classes = Math.max(classes, v + 1)
    return makeDataset(features, ids, x.shape.slice(1), Math.max(outputs ?? 0, classes))
  }
  if (host.classification && y.rank === 2) {
    // one-hot rows: their class ids (the loss takes them one-hot again, as dp.fit() does)
    const ids = new Int32Array(n)
    let oneHot = true
    for (let r = 0; r < n && oneHot; r++) {
      let at = -1
      for (let c = 0; c < per; c++) {
        const v = yd[r * per + c]!
        if (v === 1 && at < 0) at = c
        else if (v !== 0) oneHot = false
      }
      if (at < 0) oneHot = false
      ids[r] = at
    }
    if (oneHot) return makeDataset(features, ids, x.shape.slice(1), per)
  }
  return makeDataset(features, Float32Array.from(yd), x.shape.slice(1), { numClasses: 0, labelShape: y.shape.slice(1) })
}

/** A digest of the dataset (and its rows' weights), as small whole numbers (exact in float32, equal only for equal data). */
const digestOf = (ds: ArrayDataset, weights?: Float32Array): Float32Array => {
  const h = createHash("sha256")
  h.update(JSON.stringify([ds.size, ds.featureShape, ds.labelShape ?? [], ds.y instanceof Int32Array ? "ids" : "floats", weights ? "weighted" : "unweighted"]))
  h.update(new Uint8Array(ds.x.buffer, ds.x.byteOffset, ds.x.byteLength))
  h.update(new Uint8Array(ds.y.buffer, ds.y.byteOffset, ds.y.byteLength))
  if (weights) h.update(new Uint8Array(weights.buffer, weights.byteOffset, weights.byteLength))
  const d = h.digest()
  return Float32Array.from({ length: 8 }, (_, i) => d.readUInt16LE(2 * i))
}

const asList = (callbacks: unknown): Callbacks[] => (callbacks === undefined || callbacks === null ? [] : Array.isArray(callbacks) ? callbacks : [callbacks]) as Callbacks[]

/**
 * model.fit(x, y, args) on a prepared model: every rank passes the same whole dataset (checked: a
 * digest of it is compared across the ranks), `batchSize` is the global batch (default 32), each
 * epoch is a dp.fit() over the rows (every rank its share of one shuffle), and `validationData` /
 * `validationSplit` are evaluated after each epoch (each rank its part of the rows, the sums
 * all-reduced: the same figures on every rank). tfjs's callbacks are called (onTrainBegin/End, onEpochBegin/End, onBatchEnd) with the
 * group's metrics, and `model.stopTraining` (tf.callbacks.earlyStopping sets it) ends the run.
 */
export const kerasFit = async (host: KerasFitHost, xIn: unknown, yIn: unknown, args: FitArgs = {}): Promise<FitHistory> => {
  const x = single("x", xIn)
  const y = single("y", yIn)
  for (const k of Object.keys(args)) {
    if (!SUPPORTED.has(k) && (args as Record<string, unknown>)[k] !== undefined) {
      throw refusal(k, `is not taken on a prepared model (it takes ${[...SUPPORTED].join(", ")}): for more control, loop over dp.trainStep(x, y)`)
    }
  }
  const epochs = args.epochs ?? 1
  const batch = args.batchSize ?? 32
  const initialEpoch = args.initialEpoch ?? 0
  if (!Number.isInteger(epochs) || epochs < 1) throw refusal("epochs", `must be a whole number >= 1, got ${String(args.epochs)}`)
  if (!Number.isInteger(batch) || batch < 1) throw refusal("batchSize", `must be a whole number >= 1 (the global batch, over every rank), got ${String(args.batchSize)}`)
  if (!Number.isInteger(initialEpoch) || initialEpoch < 0 || initialEpoch >= epochs) throw refusal("initialEpoch", `must be a whole number below epochs (${epochs}), got ${String(args.initialEpoch)}`)
  const split = args.validationSplit ?? 0
  if (!(split >= 0 && split < 1)) throw refusal("validationSplit", `must be in [0, 1), got ${String(args.validationSplit)}`)
  if (args.validationData !== undefined && (!Array.isArray(args.validationData) || args.validationData.length !== 2)) {
    throw refusal("validationData", "takes [x, y] (sample weights are not taken)")
  }

  // tfjs's form for a model of one output, a list of one map, is that map.
  let classWeight = args.classWeight
  const listed = classWeight as ReadonlyArray<unknown> | undefined
  if (Array.isArray(listed) && listed.some((w) => typeof w === "object" && w !== null)) {
    if (listed.length !== 1) throw refusal("classWeight", "takes one map of class weights (a model of one output)")
    classWeight = listed[0] as Record<number, number>
  }

  const tf = host.tf
  let all = await datasetOf(host, x, y)
  // sampleWeight: a weight per row (a tensor or numbers), as Keras's
  let weights: Float32Array | undefined
  if (args.sampleWeight !== undefined && args.sampleWeight !== null) {
    const w = args.sampleWeight
    weights = isTensor(w) ? Float32Array.from((await w.data()) as ArrayLike<number>) : ArrayBuffer.isView(w) || Array.isArray(w) ? Float32Array.from(w as ArrayLike<number>) : undefined
    if (!weights) throw refusal("sampleWeight", `takes a weight per row (a tensor or an array of numbers), got ${typeof w}`)
    if (weights.length !== all.size) throw refusal("sampleWeight", `holds ${weights.length} weights for ${all.size} rows: one per row`)
    if (weights.some((v) => !Number.isFinite(v) || v < 0)) throw refusal("sampleWeight", "weights must be numbers >= 0")
  }
  // Every rank must hold the same rows: each trains on its share of them.
  const mine = digestOf(all, weights)
  const digests = (await host.allGather?.(mine)) ?? mine
  const differ: number[] = []
  for (let r = 1; r * mine.length < digests.length; r++) if (mine.some((_, i) => digests[r * mine.length + i] !== digests[i])) differ.push(r)
  if (differ.length > 0) {
    throw refusal(
      "x, y",
      `on a prepared model takes the same whole dataset on every rank (each rank trains on its share of it, as with tf.distribute), and rank(s) ` +
        `${differ.join(", ")} passed other data than rank 0: pass the whole dataset everywhere, or train each rank's own rows with ` +
        `dp.fit(ctx.getDatasetShard(name), ...) or dp.trainStep(x, y)`
    )
  }
  // Keras takes validationSplit's rows from the end, before any shuffle.
  let validation: [Tensor, Tensor] | undefined
  const owned: Tensor[] = []
  if (args.validationData) validation = [single("validationData[0]", args.validationData[0]), single("validationData[1]", args.validationData[1])]
  else if (split > 0) {
    const keep = Math.floor(all.size * (1 - split))
    if (keep < 1 || keep >= all.size) throw refusal("validationSplit", `${split} of ${all.size} rows leaves no rows to ${keep < 1 ? "train on" : "validate on"}`)
    const n = all.size
    validation = [x.slice(keep, n - keep), y.slice(keep, n - keep)] as [Tensor, Tensor]
    owned.push(...validation)
    all = rowRange(all, 0, keep)
    weights = weights?.subarray(0, keep)
  }
  if (all.size < batch) throw refusal("batchSize", `${batch} (the global batch) is larger than the ${all.size} rows to train on`)

  const callbacks = asList(args.callbacks)
  const model = host.model as LayersModel & { stopTraining?: boolean }
  const params = { epochs, initialEpoch, samples: all.size, batchSize: batch, steps: Math.floor(all.size / batch), doValidation: validation !== undefined, metrics: ["loss", "acc"] }
  for (const cb of callbacks) {
    cb.setModel?.(model)
    cb.setParams?.(params)
  }
  const history: Record<string, number[]> = {}
  const epochList: number[] = []
  const source: FitSource = { dataset: all, rows: () => Int32Array.from({ length: all.size }, (_, i) => i), ...(weights ? { weights } : {}) }
  model.stopTraining = false
  try {
    for (const cb of callbacks) await cb.onTrainBegin?.({})
    for (let epoch = initialEpoch; epoch < epochs && !model.stopTraining; epoch++) {
      for (const cb of callbacks) await cb.onEpochBegin?.(epoch, {})
      const [r] = await host.fit(source, {
        epochs: epoch + 1,
        initialEpoch: epoch,
        globalBatchSize: batch,
        seed: 0,
        ...(classWeight !== undefined ? { classWeight } : {}),
        onStep: async (s) => {
          const logs: Record<string, number> = { batch: s.index, size: s.samples, loss: s.loss }
          for (const cb of callbacks) await cb.onBatchEnd?.(s.index, logs)
        }
      })
      const logs: Record<string, number> = { loss: r!.loss }
      if (r!.accuracy !== undefined) logs.acc = r!.accuracy
      if (validation) {
        // each rank its part of the validation rows, the sums all-reduced (as tf.distribute does)
        const v = await host.evaluateAsync(validation[0], validation[1], { distributed: true })
        logs.val_loss = v.loss
        if (v.accuracy !== undefined) logs.val_acc = v.accuracy
      }
      epochList.push(epoch)
      for (const [k, v] of Object.entries(logs)) (history[k] ??= []).push(v)
      for (const cb of callbacks) await cb.onEpochEnd?.(epoch, logs)
    }
    for (const cb of callbacks) await cb.onTrainEnd?.({})
  } finally {
    tf.dispose(owned)
  }
  return { epoch: epochList, history, params }
}

/** model.trainOnBatch(x, y) on a prepared model: one data-parallel step on this rank's batch (several inputs as dp.trainStep takes them); its loss. */
export const kerasTrainOnBatch = async (host: Pick<KerasFitHost, "trainStep">, x: unknown, y: unknown): Promise<number> =>
  (await host.trainStep(Array.isArray(x) || (typeof x === "object" && x !== null && !("shape" in x)) ? (x as ModelInput) : single("x", x), single("y", y))).loss
