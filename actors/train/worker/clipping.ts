// Gradient clipping on flat gradients (prepareModel's clipValue and clipNorm): on the whole reduced
// gradient (data-parallel.ts), or on a rank's segment by the group's norm (ZeRO stage 2).

/**
 * The sum of the squares of `flat`'s elements, each clamped to [-clampAt, clampAt] first where
 * given (without changing `flat`): clipNorm's norm after clipValue.
 */
export const sumOfSquares = (flat: Float32Array, clampAt?: number): number => {
  const n = flat.length
  // four sums, so that consecutive multiply-adds do not wait for each other
  let s0 = 0
  let s1 = 0
  let s2 = 0
  let s3 = 0
  const n4 = n - (n % 4)
  if (clampAt === undefined) {
    for (let i = 0; i < n4; i += 4) {
      const a = flat[i]!
      const b = flat[i + 1]!
      const c = flat[i + 2]!
      const d = flat[i + 3]!
      s0 += a * a
      s1 += b * b
      s2 += c * c
      s3 += d * d
    }
    for (let i = n4; i < n; i++) s0 += flat[i]! * flat[i]!
    return s0 + s1 + s2 + s3
  }
  const cap = clampAt * clampAt
  for (let i = 0; i < n; i++) {
    const v = flat[i]! * flat[i]!
    s0 += v > cap ? cap : v
  }
  return s0
}

/** Scales `flat` in place to L2 norm `norm` when its norm `l2` is larger (clipNorm). */
export const scaleToNorm = (flat: Float32Array, l2: number, norm: number): void => {
  if (!(l2 > norm)) return
  const scale = norm / l2
  const n = flat.length
  for (let i = 0; i < n; i++) flat[i]! *= scale
}

/**
 * Gradient clipping on a flat gradient, in place: every element clamped to [-value, value], then
 * the whole scaled to `norm` when its L2 norm is larger (PrepareOptions.clipValue / clipNorm).
 * Returns the norm before the scaling.
 */
export const clipFlat = (flat: Float32Array, value: number | undefined, norm: number | undefined): number => {
  const n = flat.length
  if (value !== undefined) {
    const lo = -value
    for (let i = 0; i < n; i++) {
      const v = flat[i]!
      if (v > value) flat[i] = value
      else if (v < lo) flat[i] = lo
    }
  }
  if (norm === undefined) return Number.NaN
  const l2 = Math.sqrt(sumOfSquares(flat))
  scaleToNorm(flat, l2, norm)
  return l2
}
