// In-memory array datasets, their deterministic per-rank shards, and the digits loader used by
// the examples and tests. A shard is a set of row indices: rows are gathered into batches only
// when a batch is built, so sharding copies nothing.
import * as fs from "node:fs/promises"
import { existsSync } from "node:fs"
import * as zlib from "node:zlib"
import { fileURLToPath } from "node:url"
import { mixSeed, permutation } from "./random.ts"
import { ConfigError } from "./errors.ts"
import { packedArray } from "./wire.ts"

/**
 * Rows of features (row-major, featureShape per row) and labels: integer class ids (Int32Array,
 * one per row) or float targets (Float32Array, labelShape values per row: regression).
 */
export interface ArrayDataset {
  readonly x: Float32Array
  readonly y: Int32Array | Float32Array
  readonly size: number
  readonly featureShape: ReadonlyArray<number>
  /** Classes of int32 labels (0 for float targets). */
  readonly numClasses: number
  /** Shape of one row's label: [] (the default) for one value per row. */
  readonly labelShape?: ReadonlyArray<number>
}

const rowSize = (ds: ArrayDataset): number => ds.featureShape.reduce((a, b) => a * b, 1)
const labelSize = (ds: Pick<ArrayDataset, "labelShape">): number => (ds.labelShape ?? []).reduce((a, b) => a * b, 1)

/**
 * An in-memory dataset. `y` holds class ids (Int32Array) or float targets (Float32Array, for
 * regression; `labelShape` values per row, default one).
 */
export const makeDataset = (
  x: Float32Array,
  y: Int32Array | Float32Array,
  featureShape: ReadonlyArray<number>,
  numClasses?: number | { readonly numClasses?: number; readonly labelShape?: ReadonlyArray<number> }
): ArrayDataset => {
  const opts = typeof numClasses === "object" && numClasses !== null ? numClasses : { numClasses }
  // (copied as packed arrays: a dataset sent to a worker arrives with decoded, holey ones; wire.ts packedArray)
  const labelShape = packedArray(opts.labelShape ?? [])
  const row = featureShape.reduce((a, b) => a * b, 1)
  const per = labelShape.reduce((a, b) => a * b, 1)
  if (!(y instanceof Int32Array) && !(y instanceof Float32Array)) {
    throw new ConfigError({ field: "datasets", reason: "labels are an Int32Array (class ids) or a Float32Array (regression targets)" })
  }
  if (y instanceof Int32Array && labelShape.length > 0) {
    throw new ConfigError({ field: "datasets", reason: "class ids (Int32Array) are one per row: labelShape is for float targets (Float32Array)" })
  }
  const size = per > 0 ? y.length / per : 0
  if (row <= 0 || per <= 0 || !Number.isInteger(size) || x.length !== size * row) {
    throw new ConfigError({
      field: "datasets",
      reason: `features hold ${x.length} values but ${y.length} labels (${per} per row) x ${row} features per row need ${Math.floor(size) * row}`
    })
  }
  let max = -1
  if (y instanceof Int32Array) for (let i = 0; i < y.length; i++) if (y[i] > max) max = y[i]
  return {
    x,
    y,
    size,
    featureShape: packedArray(featureShape),
    numClasses: opts.numClasses ?? max + 1,
    ...(labelShape.length > 0 ? { labelShape } : {})
  }
}

/** Gathers the given rows into new contiguous arrays (the one copy a batch needs). */
export const gatherRows = <Y extends Int32Array | Float32Array>(
  ds: ArrayDataset & { readonly y: Y },
  rows: ArrayLike<number>
): { x: Float32Array; y: Y } => {
  const r = rowSize(ds)
  const l = labelSize(ds)
  const x = new Float32Array(rows.length * r)
  const y = (ds.y instanceof Int32Array ? new Int32Array(rows.length * l) : new Float32Array(rows.length * l)) as Y
  for (let i = 0; i < rows.length; i++) {
    const src = rows[i]
    x.set(ds.x.subarray(src * r, src * r + r), i * r)
    if (l === 1) y[i] = ds.y[src]
    else y.set(ds.y.subarray(src * l, src * l + l), i * l)
  }
  return { x, y }
}

/** Rows [from, to) of a dataset as one of its own: views of its arrays, no copy. */
export const rowRange = (ds: ArrayDataset, from: number, to: number): ArrayDataset => {
  const r = rowSize(ds)
  const l = labelSize(ds)
  return { ...ds, size: to - from, x: ds.x.subarray(from * r, to * r), y: ds.y.subarray(from * l, to * l) }
}

/** A seeded split into train and held-out rows. */
export const trainTestSplit = (
  ds: ArrayDataset,
  testFraction: number,
  seed = 0
): { train: ArrayDataset; test: ArrayDataset } => {
  const perm = permutation(ds.size, mixSeed(seed, 0x7e57))
  const nTest = Math.round(ds.size * testFraction)
  const take = (rows: Int32Array): ArrayDataset => {
    const g = gatherRows(ds, rows)
    return { x: g.x, y: g.y, size: rows.length, featureShape: ds.featureShape, numClasses: ds.numClasses, ...(ds.labelShape ? { labelShape: ds.labelShape } : {}) }
  }
  return { test: take(perm.subarray(0, nTest)), train: take(perm.subarray(nTest)) }
}

/**
 * The rows rank `rank` of `worldSize` trains on in `epoch`: a permutation seeded by (seed, epoch),
 * cut into worldSize disjoint, equal parts. The remainder (size mod worldSize rows) is left out
 * for that epoch so every rank runs the same number of steps (uneven shards deadlock synchronous
 * training); reshuffling each epoch means no row is left out for good.
 */
export const shardIndices = (size: number, rank: number, worldSize: number, seed: number, epoch: number): Int32Array => {
  if (!(worldSize >= 1) || rank < 0 || rank >= worldSize) {
    throw new ConfigError({ field: "rank", reason: `rank ${rank} is outside a world of ${worldSize}` })
  }
  const perm = permutation(size, mixSeed(seed, epoch))
  const per = Math.floor(size / worldSize)
  return perm.subarray(rank * per, rank * per + per)
}

/** Shard rows with per-rank sizes (heterogeneity-aware batching): counts[i] rows for rank i. */
export const shardIndicesWeighted = (
  size: number,
  rank: number,
  counts: ReadonlyArray<number>,
  seed: number,
  epoch: number
): Int32Array => {
  const total = counts.reduce((a, b) => a + b, 0)
  if (total > size) throw new ConfigError({ field: "counts", reason: `shards ask for ${total} rows, the dataset has ${size}` })
  const perm = permutation(size, mixSeed(seed, epoch))
  let start = 0
  for (let i = 0; i < rank; i++) start += counts[i]
  return perm.subarray(start, start + counts[rank])
}

/** The bundled digits file: next to the sources, or one level up when running from dist/. */
export const digitsPath = (): string => {
  const here = fileURLToPath(new URL("../examples/data/digits.csv.gz", import.meta.url))
  return existsSync(here) ? here : fileURLToPath(new URL("../../examples/data/digits.csv.gz", import.meta.url))
}

/** The UCI handwritten digits (8x8 images, values 0..16 scaled to 0..1, labels 0..9). */
export const loadDigits = async (file: string = digitsPath()): Promise<ArrayDataset> => {
  const text = zlib.gunzipSync(await fs.readFile(file)).toString("utf8")
  const lines = text.split("\n").filter((l) => l.trim().length > 0)
  const x = new Float32Array(lines.length * 64)
  const y = new Int32Array(lines.length)
  lines.forEach((line, i) => {
    const cols = line.split(",")
    if (cols.length !== 65) throw new ConfigError({ field: "digits", reason: `line ${i + 1} has ${cols.length} columns, expected 65` })
    for (let j = 0; j < 64; j++) x[i * 64 + j] = Number(cols[j]) / 16
    y[i] = Number(cols[64])
  })
  return makeDataset(x, y, [64], 10)
}
