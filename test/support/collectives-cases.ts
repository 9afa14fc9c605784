// Test cases for collectives, shared by the test files (which build case lists) and the rank
// processes (which run them). Inputs are generated from (seed, rank), so every rank can compute
// the float64 reference of the whole group by itself and no data has to be shipped around.
import { createHash } from "node:crypto"
import { roundToHalf } from "../../collectives/float16.ts"
import { segmentBounds } from "../../collectives/segments.ts"
import { seededRng } from "../../core/random.ts"

export type CaseOp = "allReduce" | "reduceScatter" | "broadcast" | "allGather" | "shift" | "barrier" | "buckets"

export interface Case {
  readonly op: CaseOp
  readonly length: number
  readonly seed: number
  readonly algorithm?: string
  readonly reduce?: "sum" | "mean" | "max" | "weightedMean"
  readonly wire?: "f32" | "f16"
  readonly root?: number
  readonly hierarchy?: "node" | "server"
  readonly fanout?: boolean
  /** Run this many copies of the case at once (distinct seeds), to exercise concurrent calls. */
  readonly concurrent?: number
  /** buckets: variable sizes (elements); bucket sizes in bytes. */
  readonly sizes?: ReadonlyArray<number>
  readonly bucketBytes?: number
  readonly firstBucketBytes?: number
  /**
   * allReduce, op sum, wire f16: the rank passes its input as binary16 bits (`halfInput`) over a
   * `data` full of NaN, and checks the result bit for bit against the same call on the decoded
   * values without them.
   */
  readonly halfInput?: boolean
  /**
   * allReduce and reduceScatter: the rank overwrites its buffer with NaN as soon as the call
   * returns (its result checked from a copy taken first). Every rank's result must be unchanged:
   * a call returns only once what it sent from the buffer has left it.
   */
  readonly clobber?: boolean
  /** Give ranks different lengths (rank r adds r * lengthSkew): a mismatch test. */
  readonly lengthSkew?: number
  /**
   * allReduce: as soon as the call returns, rank `busy.rank` keeps its event loop busy for
   * `busy.ms` (a long computation, as a backward pass), and each rank's result says when its call
   * returned (`returnedAt`) and when the busy spell ended (`busyUntil`), both Date.now().
   */
  readonly busy?: { readonly rank: number; readonly ms: number }
  /**
   * allReduce on a buffer from Communicator.allocate (its sums in place): the result says how its
   * payload slots were used (`slots`), read once the call's sends have gone.
   */
  readonly allocated?: boolean
}

export interface CaseResult {
  readonly returnedAt?: number
  readonly busyUntil?: number
  readonly ok: boolean
  /** sha1 of the result bytes: equal on every rank for results that must be identical. */
  readonly hash: string
  readonly maxErr: number
  readonly detail: string
  /** An `allocated` case's payload slots: taken during the call, free after it, how many there are (none without SIMD). */
  readonly slots?: { readonly taken: number; readonly free: number; readonly count: number }
}

/** mulberry32: a small, fast, seedable PRNG (the library's own). */
export const prng = seededRng

/** Rank r's input for a case: values in [-1, 1), a few exact zeros and repeated values for max ties. */
export const inputOf = (seed: number, rank: number, length: number): Float32Array => {
  const next = prng(seed * 7919 + rank * 104729 + 1)
  const out = new Float32Array(length)
  for (let i = 0; i < length; i++) {
    const u = next()
    out[i] = u < 0.02 ? 0 : u < 0.04 ? 0.5 : next() * 2 - 1
  }
  return out
}

/** Weight of rank r in weightedMean cases: 0..3, so some ranks bring no samples. */
export const weightOf = (seed: number, rank: number): number => (seed + rank) % 4

export const hashOf = (data: Float32Array): string =>
  createHash("sha1").update(new Uint8Array(data.buffer, data.byteOffset, data.byteLength)).digest("hex")

/** Float64 reference of an all-reduce over p ranks, and per element the scale its rounding error grows with. */
export const reference = (c: Case, p: number): { ref: Float64Array; scale: Float64Array } => {
  const n = c.length
  const ref = new Float64Array(n)
  const scale = new Float64Array(n)
  const op = c.reduce ?? "sum"
  let total = 0
  for (let r = 0; r < p; r++) {
    const x = inputOf(c.seed, r, n)
    const w = op === "weightedMean" ? weightOf(c.seed, r) : 1
    total += w
    for (let i = 0; i < n; i++) {
      if (op === "max") ref[i] = r === 0 ? x[i] : Math.max(ref[i], x[i])
      else ref[i] += w * x[i]
      scale[i] += Math.abs(w * x[i])
    }
  }
  const divisor = op === "mean" ? p : op === "weightedMean" ? total : 1
  for (let i = 0; i < n; i++) {
    if (op === "weightedMean" && total === 0) ref[i] = 0
    else if (divisor !== 1) ref[i] /= divisor
    scale[i] = op === "max" ? Math.abs(ref[i]) : total === 0 ? 0 : scale[i] / divisor
  }
  return { ref, scale }
}

/**
 * Compares a result with the float64 reference. fp32: error <= p * 2^-22 * scale (each of p-1
 * additions rounds once). fp16: every hop rounds the partial sum to 11 bits, so p * 2^-10 * scale.
 */
export const compare = (got: Float32Array, ref: Float64Array, scale: Float64Array, p: number, half: boolean, start = 0): { ok: boolean; maxErr: number; detail: string } => {
  const rel = half ? p * 2 ** -10 + 2 ** -11 : p * 2 ** -22
  let maxErr = 0
  let worst = ""
  for (let i = 0; i < got.length; i++) {
    const err = Math.abs(got[i] - ref[start + i])
    const tol = rel * scale[start + i] + 1e-30
    if (err > maxErr) maxErr = err
    if (!(err <= tol) && worst === "") worst = `element ${start + i}: got ${got[i]}, want ${ref[start + i]} (tol ${tol})`
  }
  return { ok: worst === "", maxErr, detail: worst }
}

/** Expected all-gather / broadcast results (exact copies; fp16 rounds each value once). */
export const gathered = (c: Case, p: number): Float32Array => {
  const out = new Float32Array(p * c.length)
  for (let r = 0; r < p; r++) out.set(inputOf(c.seed, r, c.length), r * c.length)
  if (c.wire === "f16" && p > 1) roundToHalf(out)
  return out
}

export const broadcasted = (c: Case, p: number): Float32Array => {
  const out = inputOf(c.seed, c.root ?? 0, c.length)
  if (c.wire === "f16" && p > 1) roundToHalf(out)
  return out
}

export const sameBits = (a: Float32Array, b: Float32Array): boolean =>
  a.length === b.length && Buffer.from(a.buffer, a.byteOffset, a.byteLength).equals(Buffer.from(b.buffer, b.byteOffset, b.byteLength))

export { segmentBounds }

/** Results every rank must have bit for bit (a reduce-scatter's parts differ; a barrier has none). */
export const mustMatch = (c: Case): boolean => c.op !== "reduceScatter" && c.op !== "shift" && c.op !== "barrier"

/** Each case's failures on any rank, and results that differ across ranks where they must match. */
export const failuresOf = (cases: ReadonlyArray<Case>, results: ReadonlyArray<ReadonlyArray<CaseResult>>): string[] => {
  const failures: string[] = []
  cases.forEach((c, i) => {
    const per = results.map((r) => r[i])
    per.forEach((r, rank) => {
      if (!r.ok) failures.push(`case ${i} ${JSON.stringify(c)} rank ${rank}: ${r.detail}`)
    })
    if (mustMatch(c) && new Set(per.map((r) => r.hash)).size !== 1) failures.push(`case ${i} ${JSON.stringify(c)}: results differ across ranks`)
  })
  return failures
}
