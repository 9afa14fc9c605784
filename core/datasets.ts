// In-memory array datasets, their deterministic per-rank shards, and the digits loader used by
// the examples and tests. A shard is a set of row indices: rows are gathered into batches only
// when a batch is built, so sharding copies nothing.
import * as fs from "node:fs/promises"
import { existsSync } from "node:fs"
import * as zlib from "node:zlib"
import { fileURLToPath } from "node:url"
import { mixSeed, permutation } from "./random.ts"
import { ConfigError } from "./errors.ts"

/** Rows of features (row-major, featureShape per row) and integer class labels. */
export interface ArrayDataset {
  readonly x: Float32Array
  readonly y: Int32Array
  readonly size: number
  readonly featureShape: ReadonlyArray<number>
  readonly numClasses: number
}

const rowSize = (ds: ArrayDataset): number => ds.featureShape.reduce((a, b) => a * b, 1)

export const makeDataset = (
  x: Float32Array,
  y: Int32Array,
  featureShape: ReadonlyArray<number>,
  numClasses?: number
): ArrayDataset => {
  const row = featureShape.reduce((a, b) => a * b, 1)
  if (row <= 0 || x.length !== y.length * row) {
    throw new ConfigError({
      field: "datasets",
      reason: `features hold ${x.length} values but ${y.length} labels x ${row} features per row need ${y.length * row}`
    })
  }
  let max = -1
  for (let i = 0; i < y.length; i++) if (y[i] > max) max = y[i]
  return { x, y, size: y.length, featureShape: [...featureShape], numClasses: numClasses ?? max + 1 }
}

/** Gathers the given rows into new contiguous arrays (the one copy a batch needs). */
export const gatherRows = (ds: ArrayDataset, rows: ArrayLike<number>): { x: Float32Array; y: Int32Array } => {
  const r = rowSize(ds)
  const x = new Float32Array(rows.length * r)
  const y = new Int32Array(rows.length)
  for (let i = 0; i < rows.length; i++) {
    const src = rows[i]
    x.set(ds.x.subarray(src * r, src * r + r), i * r)
    y[i] = ds.y[src]
  }
  return { x, y }
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
    return { x: g.x, y: g.y, size: rows.length, featureShape: ds.featureShape, numClasses: ds.numClasses }
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
