// A worker-side loader as a streaming source: a tf.data dataset (or any async iterable) of rows
// { xs, ys } that a datasetFactory made for this rank. Every epoch iterates it afresh; rows are
// pulled in order with the next ones read ahead while the model computes, batched for dp.fit(),
// and counted, so a checkpoint records how far the epoch got and a resume skips what was trained
// (exact when the loader yields the same rows in the same order for the same epoch). The loader
// owns its sharding: it is called with the rank and world size it starts with.
import { ConfigError } from "../errors.ts"
import { DataFormatError, DataPositionMismatch } from "./errors.ts"
import { STREAM_NOT_ROWS, type Batch, type BatchTransform, type StreamingSource } from "./stream.ts"
import { prod } from "./shard-format.ts"

/** Where an iterable loader's epoch is. */
export interface IterablePosition {
  readonly version: 1
  readonly kind: "iterable"
  readonly epoch: number
  readonly consumed: number
}

type TensorLike = { dataSync(): ArrayLike<number>; shape: number[]; dtype: string; dispose(): void }
/** One row of a streamed loader: its features and its label(s), numbers, arrays, typed arrays or tensors. */
export type StreamedRow = { xs: unknown; ys: unknown }
/** tf.data's Dataset, as far as this needs it. */
export type TfDataset = { iterator(): Promise<{ next(): Promise<{ value?: unknown; done?: boolean }> }>; size?: number | null }

/** What a factory may return for a streamed loader: a tf.data dataset, an async iterable, or a function of the epoch. */
export type RowSource = TfDataset | AsyncIterable<StreamedRow> | Iterable<StreamedRow> | ((epoch: number) => AsyncIterable<StreamedRow> | Iterable<StreamedRow> | TfDataset)

const isTensor = (v: unknown): v is TensorLike => typeof v === "object" && v !== null && typeof (v as TensorLike).dataSync === "function" && Array.isArray((v as TensorLike).shape)

const flat = (v: unknown, out: number[]): number[] => {
  if (typeof v === "number") out.push(v)
  else if (isTensor(v) || ArrayBuffer.isView(v)) {
    const a = isTensor(v) ? v.dataSync() : (v as unknown as ArrayLike<number>)
    for (let i = 0; i < a.length; i++) out.push(a[i]!)
  }
  else if (Array.isArray(v)) for (const e of v) flat(e, out)
  else throw new DataFormatError({ source: "datasetFactory", reason: `a row value ${String(v).slice(0, 40)} is not a number, an array, a typed array or a tensor` })
  return out
}

const shapeOf = (v: unknown): number[] => {
  if (isTensor(v)) return [...v.shape]
  if (ArrayBuffer.isView(v)) return [(v as unknown as ArrayLike<number>).length]
  if (Array.isArray(v)) return [v.length, ...shapeOf(v[0])]
  return []
}

export const isRowSource = (v: unknown): v is RowSource =>
  typeof v === "function" ||
  (typeof v === "object" && v !== null && (typeof (v as TfDataset).iterator === "function" || Symbol.asyncIterator in v || Symbol.iterator in v))

/** A row source with its rows per epoch (tf.data datasets with a finite size carry it). */
export class IterableStream implements StreamingSource {
  readonly streaming = true as const
  readonly name: string
  readonly size: number
  #featureShape: ReadonlyArray<number> | undefined
  #labelShape: ReadonlyArray<number> | undefined
  #labelInt = true
  readonly numClasses: number
  readonly #source: RowSource
  readonly #transforms: BatchTransform[] = []
  readonly #prefetch: number
  #epoch = -1
  #consumed = 0
  /** Rows consumed when the epoch was opened (a resume), and the iterator's place relative to it. */
  #base = 0
  #cursor = 0
  #iter: { next(): Promise<{ value?: unknown; done?: boolean }> } | undefined
  #ahead: Array<Promise<{ value?: unknown; done?: boolean }>> = []
  readonly stats = { waitMs: 0, takeMs: 0, rows: 0 }

  constructor(name: string, source: RowSource, options: { readonly size?: number; readonly numClasses?: number; readonly prefetch?: number } = {}) {
    this.name = name
    this.#source = source
    const size = options.size ?? (typeof source === "object" && "size" in source && typeof source.size === "number" ? source.size : undefined)
    if (size === undefined || !Number.isInteger(size) || size < 0) {
      throw new ConfigError({
        field: `datasets.${name}`,
        reason: "a loader's rows per epoch must be known (every rank takes the same number of steps): return a tf.data dataset of finite size, or { rows, size }"
      })
    }
    this.size = size
    this.numClasses = options.numClasses ?? 0
    this.#prefetch = options.prefetch ?? 64
  }

  get featureShape(): ReadonlyArray<number> {
    return this.#featureShape ?? []
  }

  /** An in-memory shard's call, on a stream: a ConfigError that says how a stream is read. */
  rows(_epoch?: number): never {
    throw new ConfigError({ field: `getDatasetShard("${this.name}").rows`, reason: STREAM_NOT_ROWS })
  }

  map(fn: BatchTransform): this {
    this.#transforms.push(fn)
    return this
  }

  position(): IterablePosition | undefined {
    return this.#epoch < 0 ? undefined : { version: 1, kind: "iterable", epoch: this.#epoch, consumed: this.#consumed }
  }

  /** The epoch this loader is in the middle of (opened, rows of it still to take), or undefined between epochs. */
  midEpoch(): number | undefined {
    return this.#epoch >= 0 && this.#consumed < this.size ? this.#epoch : undefined
  }

  restore(pos: IterablePosition): void {
    if (pos?.kind !== "iterable" || !Number.isInteger(pos.epoch) || !Number.isInteger(pos.consumed)) {
      throw new DataPositionMismatch({ dataset: this.name, reason: "the saved position is not a loader's" })
    }
    this.#epoch = pos.epoch
    this.#consumed = pos.consumed
    this.#iter = undefined
  }

  async #open(): Promise<void> {
    const made = typeof this.#source === "function" ? this.#source(this.#epoch) : this.#source
    if (typeof (made as TfDataset).iterator === "function") this.#iter = await (made as TfDataset).iterator()
    else if (Symbol.asyncIterator in (made as object)) this.#iter = (made as AsyncIterable<unknown>)[Symbol.asyncIterator]() as never
    else this.#iter = (made as Iterable<unknown>)[Symbol.iterator]() as never
    this.#ahead = []
    this.#cursor = -this.#base
  }

  openEpoch(epoch: number, _rank: number, _worldSize: number): number {
    if (epoch !== this.#epoch) {
      this.#epoch = epoch
      this.#consumed = 0
    }
    this.#base = this.#consumed
    this.#iter = undefined
    return Math.max(0, this.size - this.#base)
  }

  #next(): Promise<{ value?: unknown; done?: boolean }> {
    while (this.#ahead.length < this.#prefetch) this.#ahead.push(this.#iter!.next())
    const p = this.#ahead.shift()!
    this.#ahead.push(this.#iter!.next())
    return p
  }

  async take(from: number, n: number): Promise<Batch> {
    const t0 = performance.now()
    // Going back (a step taken again) or a fresh epoch: iterate from the start and skip.
    if (!this.#iter || from < this.#cursor) await this.#open()
    const rows: StreamedRow[] = []
    const tw = performance.now()
    while (this.#cursor < from + n) {
      const r = await this.#next()
      if (r.done) {
        throw new DataFormatError({ source: `datasets.${this.name}`, reason: `the loader ended after ${this.#base + this.#cursor} rows, but says it has ${this.size} per epoch` })
      }
      if (this.#cursor >= from) rows.push(r.value as StreamedRow)
      else for (const v of Object.values((r.value ?? {}) as object)) if (isTensor(v)) v.dispose()
      this.#cursor++
    }
    this.stats.waitMs += performance.now() - tw
    const first = rows[0]
    if (first === undefined || typeof first !== "object" || !("xs" in first) || !("ys" in first)) {
      throw new DataFormatError({ source: `datasets.${this.name}`, reason: "a loader yields rows { xs, ys } (features, label)" })
    }
    if (!this.#featureShape) {
      this.#featureShape = shapeOf(first.xs)
      this.#labelShape = shapeOf(first.ys)
      const ysDtype = isTensor(first.ys) ? first.ys.dtype : undefined
      const v = flat(first.ys, [])
      this.#labelInt = this.#labelShape.length === 0 && (ysDtype === "int32" || (ysDtype === undefined && Number.isInteger(v[0])))
    }
    const xs = prod(this.#featureShape)
    const ys = prod(this.#labelShape!)
    const x = new Float32Array(n * xs)
    const y = this.#labelInt ? new Int32Array(n * ys) : new Float32Array(n * ys)
    const tmp: number[] = []
    rows.forEach((row, i) => {
      tmp.length = 0
      flat(row.xs, tmp)
      if (tmp.length !== xs) throw new DataFormatError({ source: `datasets.${this.name}`, reason: `row ${this.#base + from + i} has ${tmp.length} feature values, the first ${xs}` })
      x.set(tmp, i * xs)
      tmp.length = 0
      flat(row.ys, tmp)
      y.set(tmp, i * ys)
      for (const v of [row.xs, row.ys]) if (isTensor(v)) v.dispose()
    })
    this.#consumed = Math.max(this.#consumed, this.#base + from + n)
    let batch: Batch = { x, y, n, featureShape: this.#featureShape, labelShape: this.#labelShape! }
    for (const t of this.#transforms) batch = t(batch)
    this.stats.rows += n
    this.stats.takeMs += performance.now() - t0
    return batch
  }
}
