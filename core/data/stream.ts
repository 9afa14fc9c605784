// A worker's streaming input pipeline over a file dataset: its rows for an epoch (plan.ts), read
// window by window (chunk-reader.ts) with the next windows loading in the background while the
// model computes, shuffled within each window, gathered into batches, passed through the user's
// map transforms, and counted, so a checkpoint records exactly where the epoch is. dp.fit() drives
// it through the StreamingSource interface: openEpoch() for this rank's place in the group, then
// take() for consecutive row ranges. The worker holds a few windows, never the dataset.
import type { NatsConnection } from "@nats-io/nats-core"
import { ConfigError } from "../errors.ts"
import { openChunkReader, type ChunkReader } from "./chunk-reader.ts"
import { DataPositionMismatch, DataSourceError } from "./errors.ts"
import { EpochOrder, isDataPosition, planFor, rankIntervals, rowsLeft, type DataPosition } from "./plan.ts"
import { chunkSizes, type ResolvedDataset } from "./resolve.ts"
import { prod } from "./shard-format.ts"

/** A batch of rows: features (row-major) and labels, with their per-row shapes. */
export interface Batch {
  readonly x: Float32Array
  /** Class ids (int32) or targets (float32). */
  readonly y: Int32Array | Float32Array
  readonly n: number
  readonly featureShape: ReadonlyArray<number>
  readonly labelShape: ReadonlyArray<number>
  /** A weight per row (a prepared model's model.fit with sampleWeight), when the rows have them. */
  readonly w?: Float32Array
}

/** A map transform: gets a batch, returns it (changed in place or new; it may change shapes, e.g. one-hot labels). */
export type BatchTransform = (batch: Batch) => Batch

/** What dp.fit() trains from when rows stream in (file datasets, worker-side loaders). */
export interface StreamingSource {
  readonly streaming: true
  readonly featureShape: ReadonlyArray<number>
  /** Class count, or 0 (dp.fit then takes the model's output width). */
  readonly numClasses: number
  /** Starts (or goes on with) `epoch` for this rank of a group of `worldSize`: the rows this rank has left in it (the same on every rank). */
  openEpoch(epoch: number, rank: number, worldSize: number): number
  /** Rows [from, from + n) of those openEpoch() left, as one batch. Positions are taken in order; taking one again re-reads it. */
  take(from: number, n: number): Promise<Batch>
  /**
   * The plan the open epoch was opened with (its `consumed`: rows of each part taken before), where
   * the source has one (a file dataset): a regroup plans the rest of the epoch again from it.
   */
  openedPlan?(): DataPosition | undefined
  /** Goes on from a plan (the next openEpoch() of its epoch reads it). */
  restorePlan?(pos: DataPosition): void
  /** Rows of an epoch, where the source plans them (a file dataset): the steps before a plan count from it. */
  readonly rowsPerEpoch?: number
}

export const isStreamingSource = (s: unknown): s is StreamingSource => typeof s === "object" && s !== null && (s as { streaming?: unknown }).streaming === true

/** Time and volume of a stream's input work, for the data benchmark and the progress of a run. */
export interface StreamStats {
  /** Milliseconds take() waited for rows that were not loaded yet. */
  waitMs: number
  /** Milliseconds take() spent in all (waits, gathering, transforms). */
  takeMs: number
  /** Rows handed out. */
  rows: number
  /** Windows loaded, and the bytes read for them. */
  windows: number
  bytesRead: number
}

interface Window {
  readonly x: Float32Array
  readonly y: Int32Array | Float32Array
}

/** One-hot labels: class ids become float32 rows of `numClasses` (categorical losses, or labels for a custom one). */
export const oneHot = (numClasses: number): BatchTransform => {
  if (!Number.isInteger(numClasses) || numClasses < 1) throw new ConfigError({ field: "oneHot(numClasses)", reason: `an integer >= 1, got ${numClasses}` })
  return (b) => {
    if (!(b.y instanceof Int32Array) || b.labelShape.length !== 0) throw new ConfigError({ field: "oneHot", reason: "one-hot takes one class id per row (int32 labels)" })
    const y = new Float32Array(b.n * numClasses)
    for (let i = 0; i < b.n; i++) {
      const c = b.y[i]!
      if (c < 0 || c >= numClasses) throw new ConfigError({ field: "oneHot", reason: `label ${c} is outside 0..${numClasses - 1}` })
      y[i * numClasses + c] = 1
    }
    return { ...b, y, labelShape: [numClasses] }
  }
}

/** (x - mean) / std per feature (one number, or one per feature), in place. */
export const normalize = (mean: number | ArrayLike<number>, std: number | ArrayLike<number> = 1): BatchTransform => (b) => {
  const f = prod(b.featureShape)
  const m = typeof mean === "number" ? undefined : mean
  const s = typeof std === "number" ? undefined : std
  if ((m && m.length !== f) || (s && s.length !== f)) throw new ConfigError({ field: "normalize", reason: `mean/std hold one value or ${f} (one per feature)` })
  for (let i = 0; i < b.n; i++) {
    for (let j = 0; j < f; j++) {
      const k = i * f + j
      b.x[k] = (b.x[k]! - (m ? m[j]! : (mean as number))) / (s ? s[j]! : (std as number))
    }
  }
  return b
}

/** Scales features by a constant (pixels 0..255 to 0..1: scale(1 / 255)), in place. */
export const scale = (factor: number): BatchTransform => (b) => {
  for (let i = 0; i < b.x.length; i++) b.x[i] = b.x[i]! * factor
  return b
}

const labelArray = (d: ResolvedDataset, n: number): Int32Array | Float32Array =>
  d.labelDtype === "int32" ? new Int32Array(n * prod(d.labelShape)) : new Float32Array(n * prod(d.labelShape))

/** Whether two positions are of one plan (the same epoch's rows cut for the same world size). */
const samePlan = (a: DataPosition, b: DataPosition): boolean =>
  a.fingerprint === b.fingerprint && a.epoch === b.epoch && a.worldSize === b.worldSize && a.intervals.length === b.intervals.length &&
  a.intervals.every(([s, e], i) => s === b.intervals[i]![0] && e === b.intervals[i]![1])

/**
 * This rank's view of a file dataset. `seed` fixes every epoch's order; the position (epoch, plan,
 * rows taken) is what checkpoints keep, and restore() puts it back.
 */
/** What a loop that indexes rows is told when its dataset is a stream. */
export const STREAM_NOT_ROWS =
  "the dataset is a stream (files, or a worker-side loader), which hands out batches, not row indices: train on it with " +
  "dp.fit(shard, { epochs, batchSize }), or read it by hand with shard.openEpoch(epoch, ctx.worldRank, ctx.worldSize) and " +
  "await shard.take(from, n) (a batch's x, y and n); ctx.getDataset(name) reads a file dataset whole into memory"

export class FileStream implements StreamingSource {
  readonly streaming = true as const
  readonly name: string
  /** @internal The files as the driver resolved them. */
  readonly dataset: ResolvedDataset
  readonly seed: number
  readonly stats: StreamStats = { waitMs: 0, takeMs: 0, rows: 0, windows: 0, bytesRead: 0 }
  readonly #chunks: ReturnType<typeof chunkSizes>
  readonly #reader: ChunkReader
  readonly #transforms: BatchTransform[] = []
  readonly #place: () => { readonly rank: number; readonly worldSize: number }
  #pos: DataPosition | undefined
  #order: EpochOrder | undefined
  /** What openEpoch() set up: the rank's intervals, their cumulative starts, the consumed count at open. */
  #open: { readonly pos: DataPosition; readonly intervals: Array<[number, number]>; readonly cum: Float64Array; readonly base: number; readonly windows: number[] } | undefined
  readonly #windows = new Map<number, Promise<Window>>()
  #closed = false

  /** @internal ctx.getDatasetShard makes a rank's stream. */
  constructor(
    name: string,
    dataset: ResolvedDataset,
    seed: number,
    place: () => { readonly rank: number; readonly worldSize: number },
    nats?: () => Promise<NatsConnection>
  ) {
    this.name = name
    this.dataset = dataset
    this.seed = seed
    this.#place = place
    this.#chunks = chunkSizes(dataset)
    this.#reader = openChunkReader(dataset, this.#chunks, nats)
  }

  get featureShape(): ReadonlyArray<number> {
    return this.dataset.featureShape
  }

  get labelShape(): ReadonlyArray<number> {
    return this.dataset.labelShape
  }

  get numClasses(): number {
    return this.dataset.numClasses
  }

  get rowsPerEpoch(): number {
    return this.dataset.rows
  }

  /** Rows this rank trains per epoch at the group's current size. */
  get size(): number {
    return Math.floor(this.dataset.rows / this.#place().worldSize)
  }

  get rank(): number {
    return this.#place().rank
  }

  get worldSize(): number {
    return this.#place().worldSize
  }

  /** Windows held now, loaded or loading (the current one and those read ahead). */
  get buffered(): number {
    return this.#windows.size
  }

  /** Adds a map transform (applied to every batch, in the order added). Returns this stream. */
  /**
   * An in-memory shard's call, on a stream: a ConfigError that says how a stream is read (a loop
   * written for makeDataset / loadDigits, given a file dataset).
   */
  rows(_epoch?: number): never {
    throw new ConfigError({ field: `getDatasetShard("${this.name}").rows`, reason: STREAM_NOT_ROWS })
  }

  map(fn: BatchTransform): this {
    if (typeof fn !== "function") throw new ConfigError({ field: `${this.name}.map`, reason: "takes a function (batch) => batch" })
    this.#transforms.push(fn)
    return this
  }

  /** Where the epoch is: saved in checkpoints (TrainContext.checkpointFromModel) for a resume mid-epoch. */
  position(): DataPosition | undefined {
    return this.#pos
  }

  /**
   * The epoch this stream is in the middle of (opened, or restored to, with rows of this rank's
   * part still to take), or undefined between epochs. A loop that reads the stream itself holds
   * its plan's counts: at a regroup there its survivors keep the plan (restore) and no rank joins
   * until the epoch ends (train-context.ts `joinLater`, regroup.ts).
   */
  midEpoch(): number | undefined {
    return this.#pos !== undefined && rowsLeft(this.#pos) > 0 ? this.#pos.epoch : undefined
  }

  openedPlan(): DataPosition | undefined {
    return this.#open?.pos
  }

  restorePlan(pos: DataPosition): void {
    this.restore(pos)
  }

  /** Goes on from a saved position (the next openEpoch() of its epoch continues there, re-planned if the world size changed). */
  restore(pos: DataPosition): void {
    if (!isDataPosition(pos)) throw new DataPositionMismatch({ dataset: this.name, reason: "the saved position is not one (damaged or of another version)" })
    // A position at an epoch's end holds no row of these files to go on from: other files (one
    // added to the folder) start the next epoch as they are. Within an epoch they cannot.
    if (pos.fingerprint !== this.dataset.fingerprint && rowsLeft(pos) > 0) {
      throw new DataPositionMismatch({ dataset: this.name, reason: `it was saved for rows ${pos.fingerprint}, these files are ${this.dataset.fingerprint}` })
    }
    // A regroup's survivor taking the furthest survivor's position of the plan it has open (a loop
    // that reads the stream itself goes on with the counts it holds): it keeps reading that plan.
    // A rank joining at the first step of an epoch it opened takes a position at the end of the
    // epoch before: the plan it opened goes on from there, as it is.
    const o = this.#open
    if (o && samePlan(o.pos, pos)) {
      this.#pos = pos
      return
    }
    if (o && o.pos.fingerprint === pos.fingerprint && o.pos.epoch > pos.epoch && rowsLeft(pos) === 0) return
    this.#pos = pos
    this.#open = undefined
    this.#release(-1)
  }

  #orderFor(epoch: number): EpochOrder {
    if (this.#order?.epoch !== epoch) {
      this.#order = new EpochOrder(this.#chunks.rows, this.dataset.shuffleBuffer, this.dataset.shuffle, this.seed, epoch)
      this.#release(-1)
    }
    return this.#order
  }

  openEpoch(epoch: number, rank: number, worldSize: number): number {
    if (this.#closed) throw new DataSourceError({ source: this.name, reason: "the stream was closed" })
    const pos = planFor(this.#pos, this.dataset.fingerprint, this.dataset.rows, epoch, worldSize)
    this.#pos = pos
    const order = this.#orderFor(epoch)
    const intervals = rankIntervals(pos, rank)
    const cum = new Float64Array(intervals.length + 1)
    const windows: number[] = []
    intervals.forEach(([a, b], i) => {
      cum[i + 1] = cum[i]! + (b - a)
      for (let w = order.windowOf(a); w <= order.windowOf(b - 1); w++) if (windows[windows.length - 1] !== w) windows.push(w)
    })
    this.#open = { pos, intervals, cum, base: pos.consumed, windows }
    // Windows of an earlier plan this one does not read.
    for (const w of [...this.#windows.keys()]) if (!windows.includes(w)) this.#windows.delete(w)
    this.#prefetch(0)
    return rowsLeft(pos)
  }

  /** Shuffled position of the rank's u-th remaining row, and the end of its interval. */
  #positionOf(u: number): { q: number; end: number } {
    const o = this.#open!
    let lo = 0
    let hi = o.intervals.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if (o.cum[mid]! <= u) lo = mid
      else hi = mid - 1
    }
    const [a, b] = o.intervals[lo]!
    return { q: a + (u - o.cum[lo]!), end: b }
  }

  #load(w: number): Promise<Window> {
    let p = this.#windows.get(w)
    if (!p) {
      const order = this.#order!
      const n = order.windowLength(w)
      const x = new Float32Array(n * prod(this.dataset.featureShape))
      const y = labelArray(this.dataset, n)
      p = Promise.all(order.windowPieces(w).map((piece) => this.#reader.read(piece.chunk, piece.from, piece.to, x, y, piece.at))).then((read) => {
        this.stats.windows++
        this.stats.bytesRead += read.reduce((a, b) => a + b, 0)
        return { x, y }
      })
      // A failed read is reported by the take() that needs it (and read again on the next try).
      p.catch(() => this.#windows.delete(w))
      this.#windows.set(w, p)
    }
    return p
  }

  /** Loads the window at index `i` of this plan's window list and the `prefetch` after it. */
  #prefetch(i: number): void {
    const o = this.#open
    if (!o) return
    for (let k = i; k <= i + this.dataset.prefetch && k < o.windows.length; k++) void this.#load(o.windows[k]!).catch(() => {})
  }

  /** Drops loaded windows before `w` (all of them for -1). */
  #release(w: number): void {
    for (const k of [...this.#windows.keys()]) if (w < 0 || k < w) this.#windows.delete(k)
  }

  async take(from: number, n: number): Promise<Batch> {
    const o = this.#open
    if (!o) throw new DataSourceError({ source: this.name, reason: "take() before openEpoch()" })
    const left = rowsLeft(o.pos)
    if (from < 0 || n < 0 || from + n > left) throw new DataSourceError({ source: this.name, reason: `rows ${from}..${from + n} asked, this rank has ${left} left in epoch ${o.pos.epoch}` })
    const t0 = performance.now()
    const order = this.#order!
    const xs = prod(this.dataset.featureShape)
    const ys = prod(this.dataset.labelShape)
    const x = new Float32Array(n * xs)
    const y = labelArray(this.dataset, n)
    let i = 0
    while (i < n) {
      const { q, end } = this.#positionOf(from + i)
      const w = order.windowOf(q)
      const ws = order.windowStart(w)
      // Rows of this interval in this window: one wait, then copies.
      let run = 1
      while (i + run < n && q + run < end && q + run < ws + order.windowLength(w)) run++
      const loaded = this.#windows.get(w)
      let win: Window
      if (loaded) {
        const tw = performance.now()
        win = await loaded
        this.stats.waitMs += performance.now() - tw
      } else {
        const tw = performance.now()
        win = await this.#load(w)
        this.stats.waitMs += performance.now() - tw
      }
      const perm = order.windowPermutation(w)
      for (let k = 0; k < run; k++) {
        const r = perm[q + k - ws]!
        const dst = (i + k) * xs
        if (xs <= 256) for (let j = 0, src = r * xs; j < xs; j++) x[dst + j] = win.x[src + j]!
        else x.set(win.x.subarray(r * xs, r * xs + xs), dst)
        if (ys === 1) y[i + k] = win.y[r]!
        else for (let j = 0; j < ys; j++) y[(i + k) * ys + j] = win.y[r * ys + j]!
      }
      i += run
      // Done with earlier windows; keep the next ones coming.
      this.#release(w)
      this.#prefetch(o.windows.indexOf(w))
    }
    // Rows taken count once they are handed out: a checkpoint after this step resumes after them.
    this.#pos = { ...o.pos, consumed: Math.max(this.#pos!.consumed, o.base + from + n) }
    let batch: Batch = { x, y, n, featureShape: this.dataset.featureShape, labelShape: this.dataset.labelShape }
    for (const t of this.#transforms) batch = t(batch)
    this.stats.rows += n
    this.stats.takeMs += performance.now() - t0
    return batch
  }

  /**
   * Every row, in file order, as one in-memory dataset (a held-out set for evaluation, or a small
   * dataset): it holds all of them, so use it only for data that fits.
   */
  async readAll(): Promise<{ x: Float32Array; y: Int32Array | Float32Array; size: number; featureShape: ReadonlyArray<number>; labelShape: ReadonlyArray<number>; numClasses: number }> {
    const rows = this.dataset.rows
    const x = new Float32Array(rows * prod(this.dataset.featureShape))
    const y = labelArray(this.dataset, rows)
    let at = 0
    const c = this.#chunks
    const reads: Array<Promise<number>> = []
    for (let k = 0; k < c.rows.length; k++) {
      reads.push(this.#reader.read(k, 0, c.rows[k]!, x, y, at))
      at += c.rows[k]!
      if (reads.length >= 8) await Promise.all(reads.splice(0))
    }
    await Promise.all(reads)
    return { x, y, size: rows, featureShape: this.dataset.featureShape, labelShape: this.dataset.labelShape, numClasses: this.dataset.numClasses }
  }

  /** Closes the files; the stream cannot be read after. */
  async close(): Promise<void> {
    this.#closed = true
    this.#windows.clear()
    await this.#reader.close()
  }
}
