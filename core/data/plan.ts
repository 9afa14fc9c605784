// Which rows each rank reads, in which order, and where an epoch is: pure functions of the
// dataset's chunking, the seed, the epoch and the world size, so every rank computes the same
// thing without talking, and a position saved in a checkpoint is a few numbers.
//
// An epoch's order: the chunks (runs of consecutive rows of a file) in a seeded order (the per-epoch
// reshuffle of the file order), read as one stream; the stream is cut into windows of
// `shuffleBuffer` rows and each window is permuted (the bounded shuffle buffer). Position q of the
// epoch's shuffled order is the row at stream position w*W + perm_w[q - w*W] (w = floor(q / W)).
//
// A plan hands out the positions not yet trained: sorted intervals of shuffled positions, cut into
// worldSize equal contiguous parts (floor(M / p) rows each; the rest is left for the epoch's end),
// so each rank reads only the windows of its part. Every rank takes the same number of rows per
// step, so one count (`consumed`) says how far every rank got. When the world size changes
// (a resize, a resume with another number of workers), the rows not consumed yet, every rank's
// rest plus the part left over, are planned again for the new size: nothing is repeated or skipped
// (once every rank finished its part the epoch is over, and the few left-over rows stay out).
import { mixSeed, permutation } from "../random.ts"

export interface DataPosition {
  readonly version: 1
  /** ResolvedDataset.fingerprint of the rows this position belongs to. */
  readonly fingerprint: string
  readonly epoch: number
  /** The epoch's positions still to hand out when this plan was made: sorted, disjoint [start, end). */
  readonly intervals: ReadonlyArray<readonly [number, number]>
  readonly worldSize: number
  /** Rows every rank has taken of its part since the plan was made. */
  readonly consumed: number
}

export const isDataPosition = (v: unknown): v is DataPosition => {
  const p = v as Partial<DataPosition> | undefined
  return (
    typeof p === "object" && p !== null && p.version === 1 && typeof p.fingerprint === "string" && Number.isInteger(p.epoch) &&
    Array.isArray(p.intervals) && p.intervals.every((i) => Array.isArray(i) && i.length === 2 && i[0]! <= i[1]!) &&
    Number.isInteger(p.worldSize) && p.worldSize! >= 1 && Number.isInteger(p.consumed) && p.consumed! >= 0
  )
}

const lengthOf = (iv: ReadonlyArray<readonly [number, number]>): number => iv.reduce((n, [a, b]) => n + (b - a), 0)

/** A new epoch: every position, planned for `worldSize` ranks. */
export const freshPosition = (fingerprint: string, epoch: number, rows: number, worldSize: number): DataPosition => ({
  version: 1,
  fingerprint,
  epoch,
  intervals: rows > 0 ? [[0, rows]] : [],
  worldSize,
  consumed: 0
})

/** Positions the plan still hands out (every rank's part and the rest left for the epoch's end). */
export const planRows = (pos: DataPosition): number => lengthOf(pos.intervals)

/**
 * Steps of the epoch trained before `pos` was planned (a resume or a regroup mid-epoch planned the
 * rest again) and by its `consumed` rows, counted in the plan's steps of `batch` rows per rank and
 * `accumulation` micro-batches: the epoch's `rows` less the positions still to hand out.
 */
export const stepsBeforePlan = (pos: DataPosition, rows: number, batch: number, accumulation: number): number =>
  Math.round((Math.max(0, rows - planRows(pos)) + pos.consumed * pos.worldSize) / Math.max(1, batch * pos.worldSize * accumulation))

/** Rows each rank's part holds. */
export const partRows = (pos: DataPosition): number => Math.floor(lengthOf(pos.intervals) / pos.worldSize)

/** Rows rank `rank` has still to take. */
export const rowsLeft = (pos: DataPosition): number => Math.max(0, partRows(pos) - pos.consumed)

/** The positions [from, to) of the concatenated intervals, as intervals. */
const sliceOf = (iv: ReadonlyArray<readonly [number, number]>, from: number, to: number): Array<[number, number]> => {
  const out: Array<[number, number]> = []
  let at = 0
  for (const [a, b] of iv) {
    const len = b - a
    const lo = Math.max(from, at)
    const hi = Math.min(to, at + len)
    if (hi > lo) out.push([a + (lo - at), a + (hi - at)])
    at += len
    if (at >= to) break
  }
  return out
}

/** What rank `rank` still has to take, in order, as intervals of shuffled positions. */
export const rankIntervals = (pos: DataPosition, rank: number): Array<[number, number]> => {
  const per = partRows(pos)
  return sliceOf(pos.intervals, rank * per + Math.min(pos.consumed, per), (rank + 1) * per)
}

const merge = (iv: Array<[number, number]>): Array<[number, number]> => {
  iv.sort((x, y) => x[0] - y[0])
  const out: Array<[number, number]> = []
  for (const [a, b] of iv) {
    if (b <= a) continue
    const last = out[out.length - 1]
    if (last && a <= last[1]) last[1] = Math.max(last[1], b)
    else out.push([a, b])
  }
  return out
}

/**
 * Every position not taken yet: each rank's rest and the part no rank was given. A plan every rank
 * finished is the epoch's end: its few left-over rows stay out, as they do without a re-plan.
 */
export const remainingIntervals = (pos: DataPosition): Array<[number, number]> => {
  const per = partRows(pos)
  const total = lengthOf(pos.intervals)
  if (pos.consumed >= per) return []
  const out: Array<[number, number]> = []
  for (let r = 0; r < pos.worldSize; r++) out.push(...rankIntervals(pos, r))
  out.push(...sliceOf(pos.intervals, per * pos.worldSize, total))
  return merge(out)
}

/** The rows not taken yet, planned for `worldSize` ranks. */
export const replan = (pos: DataPosition, worldSize: number): DataPosition => ({
  ...pos,
  intervals: remainingIntervals(pos),
  worldSize,
  consumed: 0
})

/**
 * A regroup in the middle of an epoch (recovery from surviving peers): the rows no rank trained,
 * planned for the new group of `worldSize`. `trained[r]` is how many rows of its part old rank r
 * trained, counted from the plan's start: ranks differ here, as a lost rank's last step may not
 * have reached the group while the survivors redo theirs. A rank missing from `trained` (or past
 * its part) counts as having trained its whole part.
 */
export const replanRegroup = (pos: DataPosition, trained: ReadonlyArray<number>, worldSize: number): DataPosition => {
  const per = partRows(pos)
  const total = lengthOf(pos.intervals)
  const out: Array<[number, number]> = []
  for (let r = 0; r < pos.worldSize; r++) {
    const done = Math.min(per, Math.max(0, trained[r] ?? per))
    out.push(...sliceOf(pos.intervals, r * per + done, (r + 1) * per))
  }
  out.push(...sliceOf(pos.intervals, per * pos.worldSize, total))
  return { ...pos, intervals: merge(out), worldSize, consumed: 0 }
}

/**
 * The plan for `epoch` at `worldSize`, given where the data stood: a new epoch starts over, the
 * same epoch at another size is planned again from what is left, the same size goes on.
 */
export const planFor = (pos: DataPosition | undefined, fingerprint: string, rows: number, epoch: number, worldSize: number): DataPosition => {
  if (!pos || pos.epoch !== epoch || pos.fingerprint !== fingerprint) return freshPosition(fingerprint, epoch, rows, worldSize)
  if (pos.worldSize !== worldSize) return replan(pos, worldSize)
  return pos
}

/** An epoch's order: chunks in a seeded order, read as one stream, shuffled within windows. */
export class EpochOrder {
  readonly epoch: number
  readonly rows: number
  readonly window: number
  readonly #chunkRows: Int32Array
  readonly #order: Int32Array
  /** Stream position where the j-th chunk of the order starts (and the total at the end). */
  readonly #starts: Float64Array
  readonly #shuffle: boolean
  readonly #seed: number
  #permCache = new Map<number, Int32Array>()

  constructor(chunkRows: Int32Array, window: number, shuffle: boolean, seed: number, epoch: number) {
    this.epoch = epoch
    this.window = Math.max(1, window)
    this.#chunkRows = chunkRows
    this.#shuffle = shuffle
    this.#seed = seed
    if (shuffle) this.#order = permutation(chunkRows.length, mixSeed(seed, epoch, 0xc4c4))
    else this.#order = Int32Array.from({ length: chunkRows.length }, (_, i) => i)
    this.#starts = new Float64Array(chunkRows.length + 1)
    for (let j = 0; j < chunkRows.length; j++) this.#starts[j + 1] = this.#starts[j]! + chunkRows[this.#order[j]!]!
    this.rows = this.#starts[chunkRows.length]!
  }

  /** The chunks in this epoch's order (canonical indices). */
  get chunkOrder(): Int32Array {
    return this.#order
  }

  windowOf(q: number): number {
    return Math.floor(q / this.window)
  }

  windowStart(w: number): number {
    return w * this.window
  }

  windowLength(w: number): number {
    return Math.max(0, Math.min(this.rows, (w + 1) * this.window) - w * this.window)
  }

  /** Row of window w's buffer (stream order) that shuffled position q of the window takes. */
  windowPermutation(w: number): Int32Array {
    let p = this.#permCache.get(w)
    if (!p) {
      const n = this.windowLength(w)
      p = this.#shuffle ? permutation(n, mixSeed(this.#seed, this.epoch, w, 0x5b5b)) : Int32Array.from({ length: n }, (_, i) => i)
      if (this.#permCache.size >= 4) this.#permCache.delete(this.#permCache.keys().next().value!)
      this.#permCache.set(w, p)
    }
    return p
  }

  /** The stream position of shuffled position q. */
  streamPosition(q: number): number {
    const w = this.windowOf(q)
    return this.windowStart(w) + this.windowPermutation(w)[q - this.windowStart(w)]!
  }

  /** Window w as pieces of chunks: rows [from, to) of canonical chunk `chunk` go to buffer row `at`. */
  windowPieces(w: number): Array<{ chunk: number; from: number; to: number; at: number }> {
    const start = this.windowStart(w)
    const end = start + this.windowLength(w)
    const out: Array<{ chunk: number; from: number; to: number; at: number }> = []
    // The order's chunk holding `start` (binary search over the starts).
    let lo = 0
    let hi = this.#order.length - 1
    while (lo < hi) {
      const mid = (lo + hi + 1) >> 1
      if (this.#starts[mid]! <= start) lo = mid
      else hi = mid - 1
    }
    for (let j = lo; j < this.#order.length && this.#starts[j]! < end; j++) {
      const s = this.#starts[j]!
      const e = this.#starts[j + 1]!
      const a = Math.max(start, s)
      const b = Math.min(end, e)
      if (b > a) out.push({ chunk: this.#order[j]!, from: a - s, to: b - s, at: a - start })
    }
    return out
  }
}
