// What "reduce" means for one call: the element op, the divisor of a mean, this participant's
// weight, and the one place a final value is finished (divided, rounded to fp16 when the wire is
// fp16). Finishing happens exactly once per element, on the rank that owns it; everyone else gets
// a copy of those bits, which is what makes results bitwise identical across ranks.
import { roundToHalf } from "./float16.ts"
import { accumulate, accumulateDivide, divide, type ReduceOp } from "./kernels.ts"

export interface Reduction {
  readonly op: ReduceOp
  /** Ranks in the whole group: the divisor of a mean. */
  readonly count: number
  /** The weight this participant brings into the reduction (weightedMean; the sum of its members' for a node leader). */
  readonly weight: number
  /** fp16 on the wire: final values are rounded to fp16 at the owner so all ranks hold the same bits. */
  readonly half: boolean
}

/** Element op used while accumulating partial results. */
export const accumulateOp = (op: ReduceOp): ReduceOp => (op === "max" ? "max" : "sum")

/**
 * Turns the fully reduced region [off, off+n) into final values. `totalWeight` is the sum of all
 * ranks' weights (weightedMean). A total weight of 0 (no rank had samples) gives zeros, not NaN.
 */
export const finish = (buf: Float32Array, off: number, n: number, r: Reduction, totalWeight: number): void => {
  if (n === 0) return
  if (r.op === "mean") divide(buf, off, n, r.count)
  else if (r.op === "weightedMean") {
    if (totalWeight > 0) divide(buf, off, n, totalWeight)
    else buf.fill(0, off, off + n)
  }
  if (r.half) roundToHalf(buf.subarray(off, off + n))
}

/**
 * Adds the last contribution to the region [off, off+n) and finishes it, in one pass where the
 * op allows (sum, mean, weighted mean with a positive total). `totalWeight` as for finish().
 */
export const accumulateAndFinish = (buf: Float32Array, off: number, payload: Uint8Array, n: number, r: Reduction, totalWeight: number): void => {
  if (n === 0) return
  const divisor = r.op === "mean" ? r.count : r.op === "weightedMean" && totalWeight > 0 ? totalWeight : 0
  if (divisor > 0) accumulateDivide(buf, off, payload, n, r.half, divisor)
  else {
    accumulate(buf, off, payload, n, r.half, accumulateOp(r.op))
    finish(buf, off, n, { ...r, half: false }, totalWeight)
  }
  if (r.half) roundToHalf(buf.subarray(off, off + n))
}
