// The batches dp.fit() trains on and the tensors the loss wants, whatever the data comes from: an
// in-memory shard (its rows gathered, one copy, then its map transforms) or a stream of rows read
// in the background (a file dataset, a worker-side loader: core/data/stream.ts). Labels are class
// ids (int32, one-hot or sparse as the loss wants) or float targets (regression, or targets that
// are one-hot already), with their per-row shape.
import { gatherRows, type ArrayDataset } from "../../../core/datasets.ts"
import { isStreamingSource, type Batch, type BatchTransform, type StreamingSource } from "../../../core/data/stream.ts"
import type { Tf } from "../../../core/engine.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** An in-memory source of rows per epoch: the worker's shard (disjoint across ranks, reshuffled per epoch). */
export interface ShardSource {
  readonly dataset: ArrayDataset
  /** `seed`: dp.fit's own, where given (else the source's: the Trainer's seed). */
  rows(epoch: number, seed?: number): ArrayLike<number>
  /** Map transforms applied to every batch (DatasetShard.map). */
  readonly transforms?: ReadonlyArray<BatchTransform>
  /** A weight per row of the dataset (model.fit's sampleWeight): each batch carries its rows'. */
  readonly weights?: Float32Array
}

/** What dp.fit() trains from. */
export type FitSource = ShardSource | StreamingSource

/** The class count for one-hot targets: the data's, else the model's output width. */
export const classesOf = (source: FitSource, outputWidth: number): number =>
  (isStreamingSource(source) ? source.numClasses : source.dataset.numClasses) || outputWidth

/** A stream's epoch as dp.fit() steps through it: step i's micro-batches are consecutive row ranges. */
export const streamEpoch = (left: number, batch: number, accumulation: number): { steps: number; rowsOf: (step: number) => number[][] } => {
  const micro = Math.ceil(left / batch)
  const range = (m: number): number[] => {
    const from = m * batch
    return Array.from({ length: Math.max(0, Math.min(left, from + batch) - from) }, (_, i) => from + i)
  }
  return {
    steps: Math.ceil(left / (batch * accumulation)),
    rowsOf: (i) => Array.from({ length: Math.min(accumulation, micro - i * accumulation) }, (_, j) => range(i * accumulation + j))
  }
}

/** The batch of these rows (in-memory) or row positions (streamed). */
export const fitBatch = async (source: FitSource, rows: ReadonlyArray<number>): Promise<Batch> => {
  if (isStreamingSource(source)) return source.take(rows[0] ?? 0, rows.length)
  const ds = source.dataset
  const g = gatherRows(ds, rows)
  const weights = source.weights
  let b: Batch = {
    x: g.x,
    y: g.y,
    n: rows.length,
    featureShape: ds.featureShape,
    labelShape: ds.labelShape ?? [],
    ...(weights ? { w: Float32Array.from(rows, (r) => weights[r]!) } : {})
  }
  for (const t of source.transforms ?? []) b = t(b)
  // (a transform that built its batch anew kept the rows, not their weights)
  if (b.w === undefined && weights && b.n === rows.length) b = { ...b, w: Float32Array.from(rows, (r) => weights[r]!) }
  return b
}

/**
 * The batch as tensors: features, labels, and the targets the loss takes (class ids one-hot for a
 * categorical loss; float targets as they are). The caller disposes all three.
 */
export const batchTensors = (
  tf: Tf,
  b: Batch,
  classification: boolean,
  lossTargets: (y: Tensor) => Tensor
): { x: Tensor; y: Tensor; yLoss: Tensor } => {
  const t = tf as unknown as typeof import("@tensorflow/tfjs")
  const x = t.tensor(b.x, [b.n, ...b.featureShape])
  if (classification && b.y instanceof Int32Array && b.labelShape.length === 0) {
    const y = t.tensor1d(b.y, "int32")
    return { x, y, yLoss: lossTargets(y) }
  }
  const y = t.tensor(b.y, [b.n, ...(b.labelShape.length > 0 ? b.labelShape : [1])], "float32")
  return { x, y, yLoss: y.clone() }
}
