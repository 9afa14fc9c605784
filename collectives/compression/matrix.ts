// The few dense kernels PowerSGD needs, on row-major fp32 matrices with a small rank r. In the
// scalar loops sums are accumulated in float64 (JS numbers) and rounded once. For r <= 4 and rows
// of a multiple of 4 floats the WebAssembly SIMD kernels (../simd.ts) take over, with fp32 lane
// sums: P = M·Q and Q_w = Mᵀ·P̂ are this rank's own contributions to a sum, so their rounding
// may differ between the two paths; the decoded aggregate P̂ Qᵀ, which must be bitwise the same
// on every rank, has one fixed fp32 formula in both (decodeOuter).

// The kernels walk M (the big operand) row by row, contiguously, and handle the r columns of the
// thin factor in groups of up to 4 held in scalar accumulators: V8 keeps those in registers, where
// a Float64Array accumulator or a loop over c would go through memory for every multiply-add.

import { decodeOuterSimd, feedbackMatMulSimd, matMulTSimd, type OwedProduct } from "../simd.ts"

export type { OwedProduct }

/** Columns c0..c0+3 of a row-major k×r factor, transposed into 4 contiguous rows of length k. */
const columns = (F: Float32Array, k: number, r: number, c0: number): [Float64Array, Float64Array, Float64Array, Float64Array] => {
  const cols: [Float64Array, Float64Array, Float64Array, Float64Array] = [new Float64Array(k), new Float64Array(k), new Float64Array(k), new Float64Array(k)]
  for (let d = 0; d < 4 && c0 + d < r; d++) {
    const col = cols[d]
    for (let j = 0; j < k; j++) col[j] = F[j * r + c0 + d]
  }
  return cols
}

/** P (n×r) = M (n×m) · Q (m×r). */
export const matMul = (M: Float32Array, n: number, m: number, Q: Float32Array, r: number, P: Float32Array): void => {
  for (let c0 = 0; c0 < r; c0 += 4) {
    const [q0, q1, q2, q3] = columns(Q, m, r, c0)
    const w = Math.min(4, r - c0)
    for (let i = 0; i < n; i++) {
      const row = i * m
      let a0 = 0
      let a1 = 0
      let a2 = 0
      let a3 = 0
      for (let j = 0; j < m; j++) {
        const v = M[row + j]
        a0 += v * q0[j]
        a1 += v * q1[j]
        a2 += v * q2[j]
        a3 += v * q3[j]
      }
      const o = i * r + c0
      P[o] = a0
      if (w > 1) P[o + 1] = a1
      if (w > 2) P[o + 2] = a2
      if (w > 3) P[o + 3] = a3
    }
  }
}

/**
 * Error feedback and the first factor in one pass over the rows, for r <= 4:
 * E = fround(E + fround(G·s)) (the residual becomes M = G·s + e), then P (n×r) = E · Q.
 * The same values as scaling G, adding it into E and calling matMul, with a third of the memory traffic.
 * With `owed`, E first pays subtractOwn(owed) in the same pass: the same values as calling it first.
 */
export const feedbackMatMul = (
  G: Float32Array,
  s: number,
  E: Float32Array,
  n: number,
  m: number,
  Q: Float32Array,
  r: number,
  P: Float32Array,
  owed?: OwedProduct
): void => {
  if (r > 4) throw new RangeError(`feedbackMatMul handles r <= 4, got ${r}`)
  if (feedbackMatMulSimd(G, s, E, n, m, Q, r, P, owed)) return
  if (owed) subtractOwn(owed, n, m, r, E)
  const [q0, q1, q2, q3] = columns(Q, m, r, 0)
  for (let i = 0; i < n; i++) {
    const row = i * m
    let a0 = 0
    let a1 = 0
    let a2 = 0
    let a3 = 0
    for (let j = 0; j < m; j++) {
      const v = Math.fround(E[row + j] + Math.fround(G[row + j] * s))
      E[row + j] = v
      a0 += v * q0[j]
      a1 += v * q1[j]
      a2 += v * q2[j]
      a3 += v * q3[j]
    }
    const o = i * r
    P[o] = a0
    if (r > 1) P[o + 1] = a1
    if (r > 2) P[o + 2] = a2
    if (r > 3) P[o + 3] = a3
  }
}

/**
 * The decoded aggregate out = P Qᵀ (the all-reduced Q), for r <= 4. Every rank must decode
 * bitwise the same aggregate, so its arithmetic is fixed: per element
 * ((p0·q0 + p1·q1) + p2·q2) + p3·q3 in fp32, exactly what the SIMD kernel computes.
 */
export const decodeOuter = (P: Float32Array, Q: Float32Array, n: number, m: number, r: number, out: Float32Array): void => {
  if (r > 4) throw new RangeError(`decodeOuter handles r <= 4, got ${r}`)
  if (decodeOuterSimd(P, Q, n, m, r, out)) return
  fixedOuter(P, Q, n, m, r, out, false)
}

/**
 * E -= P Qwᵀ for r <= 4, each element f32(E - ((p0·w0 + p1·w1) + p2·w2) + p3·w3) in fp32: this
 * rank's own share of the aggregate, as feedbackMatMul's owed correction subtracts it.
 */
export const subtractOwn = ({ P, Qw }: OwedProduct, n: number, m: number, r: number, E: Float32Array): void => {
  if (r > 4) throw new RangeError(`subtractOwn handles r <= 4, got ${r}`)
  fixedOuter(P, Qw, n, m, r, E, true)
}

/** dst = P Fᵀ, or dst -= P Fᵀ, with the fixed fp32 formula of decodeOuter (r <= 4). */
const fixedOuter = (P: Float32Array, F: Float32Array, n: number, m: number, r: number, dst: Float32Array, subtract: boolean): void => {
  const f = Math.fround
  const [c0, c1, c2, c3] = columns(F, m, r, 0)
  for (let i = 0; i < n; i++) {
    const row = i * m
    const o = i * r
    const p0 = P[o]
    const p1 = r > 1 ? P[o + 1] : 0
    const p2 = r > 2 ? P[o + 2] : 0
    const p3 = r > 3 ? P[o + 3] : 0
    if (subtract) for (let j = 0; j < m; j++) dst[row + j] = f(dst[row + j] - f(f(f(f(p0 * c0[j]) + f(p1 * c1[j])) + f(p2 * c2[j])) + f(p3 * c3[j])))
    else for (let j = 0; j < m; j++) dst[row + j] = f(f(f(f(p0 * c0[j]) + f(p1 * c1[j])) + f(p2 * c2[j])) + f(p3 * c3[j]))
  }
}

/** Q (m×r) = Mᵀ (m×n) · P (n×r), without forming Mᵀ. */
export const matMulT = (M: Float32Array, n: number, m: number, P: Float32Array, r: number, Q: Float32Array): void => {
  if (matMulTSimd(M, n, m, P, r, Q)) return
  for (let c0 = 0; c0 < r; c0 += 4) {
    const w = Math.min(4, r - c0)
    const [a0, a1, a2, a3] = [new Float64Array(m), new Float64Array(m), new Float64Array(m), new Float64Array(m)]
    for (let i = 0; i < n; i++) {
      const row = i * m
      const o = i * r + c0
      const p0 = P[o]
      const p1 = w > 1 ? P[o + 1] : 0
      const p2 = w > 2 ? P[o + 2] : 0
      const p3 = w > 3 ? P[o + 3] : 0
      for (let j = 0; j < m; j++) {
        const v = M[row + j]
        a0[j] += v * p0
        a1[j] += v * p1
        a2[j] += v * p2
        a3[j] += v * p3
      }
    }
    const acc = [a0, a1, a2, a3]
    for (let d = 0; d < w; d++) {
      const a = acc[d]
      for (let j = 0; j < m; j++) Q[j * r + c0 + d] = a[j]
    }
  }
}

/** out (n×m) = w·(P Qᵀ), added to out when `add` (each term rounded to fp32 first), else assigned. */
export const outer = (P: Float32Array, Q: Float32Array, n: number, m: number, r: number, out: Float32Array, add: boolean, w = 1): void => {
  // s accumulates over all r columns before rounding; with r > 4 the groups are summed in a
  // float64 row buffer so the result is the same single rounding
  const groups = Math.ceil(r / 4)
  const cols = Array.from({ length: groups }, (_, g) => columns(Q, m, r, 4 * g))
  const rowSum = new Float64Array(m)
  for (let i = 0; i < n; i++) {
    const row = i * m
    const o = i * r
    if (groups === 1 && !add) {
      // the common case (r <= 4, decoding): straight into the output row
      const [q0, q1, q2, q3] = cols[0]
      const p0 = P[o]
      const p1 = r > 1 ? P[o + 1] : 0
      const p2 = r > 2 ? P[o + 2] : 0
      const p3 = r > 3 ? P[o + 3] : 0
      for (let j = 0; j < m; j++) out[row + j] = w * (p0 * q0[j] + p1 * q1[j] + p2 * q2[j] + p3 * q3[j])
      continue
    }
    for (let g = 0; g < groups; g++) {
      const [q0, q1, q2, q3] = cols[g]
      const c0 = 4 * g
      const p0 = P[o + c0]
      const p1 = c0 + 1 < r ? P[o + c0 + 1] : 0
      const p2 = c0 + 2 < r ? P[o + c0 + 2] : 0
      const p3 = c0 + 3 < r ? P[o + c0 + 3] : 0
      if (g === 0) for (let j = 0; j < m; j++) rowSum[j] = p0 * q0[j] + p1 * q1[j] + p2 * q2[j] + p3 * q3[j]
      else for (let j = 0; j < m; j++) rowSum[j] += p0 * q0[j] + p1 * q1[j] + p2 * q2[j] + p3 * q3[j]
    }
    if (!add) for (let j = 0; j < m; j++) out[row + j] = w * rowSum[j]
    else if (w === -1) for (let j = 0; j < m; j++) out[row + j] -= Math.fround(rowSum[j])
    else for (let j = 0; j < m; j++) out[row + j] += w * Math.fround(rowSum[j])
  }
}

/**
 * Orthonormalizes the r columns of P (n×r) in place: modified Gram-Schmidt, run twice ("twice is
 * enough") so nearly dependent columns still come out orthogonal. A column with (numerically) no
 * component outside the previous ones becomes zero. Returns a bit mask of the zero columns.
 */
export const orthonormalize = (P: Float32Array, n: number, r: number): number => {
  const W = Float64Array.from(P)
  const norms0 = new Float64Array(r)
  for (let c = 0; c < r; c++) {
    let s = 0
    for (let i = 0; i < n; i++) s += W[i * r + c] * W[i * r + c]
    norms0[c] = Math.sqrt(s)
  }
  let zero = 0
  for (let c = 0; c < r; c++) {
    for (let pass = 0; pass < 2; pass++) {
      for (let d = 0; d < c; d++) {
        if (zero & (1 << d)) continue
        let dot = 0
        for (let i = 0; i < n; i++) dot += W[i * r + c] * W[i * r + d]
        for (let i = 0; i < n; i++) W[i * r + c] -= dot * W[i * r + d]
      }
    }
    let s = 0
    for (let i = 0; i < n; i++) s += W[i * r + c] * W[i * r + c]
    const norm = Math.sqrt(s)
    if (norm !== norm || norms0[c] === Infinity) continue // a diverged gradient stays NaN, visibly
    // P comes from fp32 sums: a column within ~1e-4 of the span of the previous ones is noise
    if (!(norm > 1e-4 * norms0[c])) {
      zero |= 1 << c
      for (let i = 0; i < n; i++) W[i * r + c] = 0
    } else {
      for (let i = 0; i < n; i++) W[i * r + c] /= norm
    }
  }
  for (let k = 0; k < n * r; k++) P[k] = W[k]
  return zero
}
