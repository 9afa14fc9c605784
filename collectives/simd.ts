// The SIMD data-path kernels (simd/kernels.wat.mjs, WebAssembly 128-bit SIMD) behind small
// functions over ordinary typed arrays. WebAssembly reads only its own memory, so each call streams
// the arrays through fixed 64 Ki-element scratch blocks: copy in (a memcpy), one kernel call, copy
// out. The kernels alone take about 0.8 ns per element for a binary16 encode or decode-add (the
// scalar loops 1.4-2.1 ns); on arrays far beyond the caches both paths are held to memory speed,
// and what the kernels buy there is fewer passes (fused error feedback, PowerSGD's fused passes).
//
// Results are bit-for-bit those of the scalar loops (float16.ts, kernels.ts; tested), so ranks
// agree whether or not SIMD is available. Without WebAssembly SIMD, or with GRADWIRE_SIMD=0, every
// function here returns false and the caller runs its scalar loop.
import { KERNELS_WASM_BASE64 } from "./simd/kernels-wasm.ts"

/** Elements per scratch block (the .wat's BLOCK). */
export const SIMD_BLOCK = 65536
/** Below this many elements the scalar loop wins (no call and copy overhead). */
export const SIMD_MIN = 256

// The few WebAssembly globals used here (the project's TypeScript lib has no DOM types).
declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object, imports: object) => { readonly exports: unknown }
}

interface KernelExports {
  readonly memory: { readonly buffer: ArrayBuffer }
  encode(n: number): void
  decode(n: number, add: number): void
  decodeAddDivide(n: number, divisor: number): void
  roundHalf(n: number): void
  halfFeedback(n: number, scale: number, exact: number): void
  feedbackMatMul(rows: number, m: number, s: number, exact: number): void
  matMulT(rows: number, m: number): void
  feedbackOuter(rows: number, m: number, residual: number): void
}

interface Kernels {
  readonly ex: KernelExports
  readonly a: Float32Array
  readonly b: Float32Array
  readonly h: Uint16Array
  /** The whole memory as floats (PowerSGD's regions). */
  readonly f: Float32Array
}

let kernels: Kernels | null | undefined

const load = (): Kernels | null => {
  if (process.env.GRADWIRE_SIMD === "0") return null
  try {
    const bytes = Buffer.from(KERNELS_WASM_BASE64, "base64")
    const ex = new WebAssembly.Instance(new WebAssembly.Module(bytes), {}).exports as unknown as KernelExports
    const buf = ex.memory.buffer
    return {
      ex,
      a: new Float32Array(buf, 0, SIMD_BLOCK),
      b: new Float32Array(buf, 0x40000, SIMD_BLOCK),
      h: new Uint16Array(buf, 0x80000, SIMD_BLOCK),
      f: new Float32Array(buf)
    }
  } catch {
    return null // no WebAssembly SIMD in this runtime: the scalar loops do the work
  }
}

const get = (n: number): Kernels | null => {
  if (n < SIMD_MIN) return null
  if (kernels === undefined) kernels = load()
  return kernels
}

/** Whether the SIMD kernels are in use in this process. */
export const simdAvailable = (): boolean => {
  if (kernels === undefined) kernels = load()
  return kernels !== null
}

/** out[i] = binary16 bits of src[i] (round to nearest even). */
export const encodeHalfSimd = (src: Float32Array, out: Uint16Array): boolean => {
  const k = get(src.length)
  if (!k) return false
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    k.a.set(src.subarray(lo, lo + n))
    k.ex.encode(n)
    out.set(n === SIMD_BLOCK ? k.h : k.h.subarray(0, n), lo)
  }
  return true
}

/**
 * Streams binary16 `src` and fp32 `dst` through the H and A blocks: `dst` is copied in first when
 * the kernel reads it, the kernel runs on each block, and A is copied back into `dst`.
 */
const throughHalfBlocks = (k: Kernels, src: Uint16Array, dst: Float32Array, readsDst: boolean, kernel: (n: number) => void): void => {
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    k.h.set(src.subarray(lo, lo + n))
    const d = dst.subarray(lo, lo + n)
    if (readsDst) k.a.set(d)
    kernel(n)
    d.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
}

/** dst[i] = value of src[i] (add = false) or dst[i] += value of src[i] (add = true). */
export const decodeHalfSimd = (src: Uint16Array, dst: Float32Array, add: boolean): boolean => {
  const k = get(src.length)
  if (!k) return false
  throughHalfBlocks(k, src, dst, add, (n) => k.ex.decode(n, add ? 1 : 0))
  return true
}

/** dst[i] = f32((dst[i] + value of src[i]) / divisor), the sum and division in double as JS does. */
export const decodeAddDivideSimd = (src: Uint16Array, dst: Float32Array, divisor: number): boolean => {
  const k = get(src.length)
  if (!k) return false
  throughHalfBlocks(k, src, dst, true, (n) => k.ex.decodeAddDivide(n, divisor))
  return true
}

/** data[i] = nearest binary16 value of data[i], in place. */
export const roundHalfSimd = (data: Float32Array): boolean => {
  const k = get(data.length)
  if (!k) return false
  for (let lo = 0; lo < data.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, data.length - lo)
    const d = data.subarray(lo, lo + n)
    k.a.set(d)
    k.ex.roundHalf(n)
    d.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
  return true
}

/**
 * fp16 error feedback in one pass: p = f32(f32(g·scale) + e); g = half(p) (the value sent);
 * e = p - g (what rounding dropped). `g` and `e` have equal length.
 */
export const halfFeedbackSimd = (g: Float32Array, e: Float32Array, scale: number): boolean => {
  const k = get(g.length)
  if (!k) return false
  const exact = Math.fround(scale) === scale ? 1 : 0
  for (let lo = 0; lo < g.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, g.length - lo)
    const gs = g.subarray(lo, lo + n)
    const es = e.subarray(lo, lo + n)
    k.a.set(gs)
    k.b.set(es)
    k.ex.halfFeedback(n, scale, exact)
    gs.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
    es.set(n === SIMD_BLOCK ? k.b : k.b.subarray(0, n))
  }
  return true
}

// ---- PowerSGD (rank r <= 4, rows of m floats, m a multiple of 4 and at most PSGD_MAXM) ----

/** Longest matrix row the PowerSGD kernels take (their column regions hold this many floats). */
export const PSGD_MAXM = 16384
const QC = 0x0a0000 / 4
const WC = 0x0e0000 / 4
const ACC = 0x120000 / 4
const PR = 0x160000 / 4
const O = 0x1a0000 / 4
const COL = 16384 // floats between two columns

const psgd = (n: number, m: number, r: number): Kernels | null =>
  r >= 1 && r <= 4 && m >= 4 && m % 4 === 0 && m <= PSGD_MAXM && n * m >= SIMD_MIN ? get(n * m) : null

/** The r columns of a row-major m×r factor into a column region, columns r..3 zero. */
const setColumns = (f: Float32Array, at: number, F: Float32Array, m: number, r: number): void => {
  for (let c = 0; c < 4; c++) {
    const base = at + c * COL
    if (c >= r) f.fill(0, base, base + m)
    else for (let j = 0; j < m; j++) f[base + j] = F[j * r + c]
  }
}

/** Rows i0..i0+rows of an n×r factor into PR, 4 columns each, zero-padded. */
const setRows = (f: Float32Array, P: Float32Array, i0: number, rows: number, r: number): void => {
  if (r === 4) {
    f.set(P.subarray(i0 * 4, (i0 + rows) * 4), PR)
    return
  }
  for (let i = 0; i < rows; i++) for (let c = 0; c < 4; c++) f[PR + i * 4 + c] = c < r ? P[(i0 + i) * r + c] : 0
}

/** E = f32(E + f32(G·s)); P (n×r) = E·Q with f32 lane sums. False when the kernels cannot take it. */
export const feedbackMatMulSimd = (G: Float32Array, s: number, E: Float32Array, n: number, m: number, Q: Float32Array, r: number, P: Float32Array): boolean => {
  const k = psgd(n, m, r)
  if (!k) return false
  const { f, ex } = k
  setColumns(f, QC, Q, m, r)
  const exact = Math.fround(s) === s ? 1 : 0
  const per = Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    const lo = i0 * m
    const hi = lo + rows * m
    k.a.set(G.subarray(lo, hi))
    k.b.set(E.subarray(lo, hi))
    ex.feedbackMatMul(rows, m, s, exact)
    E.set(k.b.subarray(0, hi - lo), lo)
    for (let i = 0; i < rows; i++) for (let c = 0; c < r; c++) P[(i0 + i) * r + c] = f[PR + i * 4 + c]
  }
  return true
}

/** Q (m×r) = Mᵀ·P with f32 sums. False when the kernels cannot take it. */
export const matMulTSimd = (M: Float32Array, n: number, m: number, P: Float32Array, r: number, Q: Float32Array): boolean => {
  const k = psgd(n, m, r)
  if (!k) return false
  const { f, ex } = k
  for (let c = 0; c < 4; c++) f.fill(0, ACC + c * COL, ACC + c * COL + m)
  const per = Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    k.a.set(M.subarray(i0 * m, (i0 + rows) * m))
    setRows(f, P, i0, rows, r)
    ex.matMulT(rows, m)
  }
  for (let j = 0; j < m; j++) for (let c = 0; c < r; c++) Q[j * r + c] = f[ACC + c * COL + j]
  return true
}

/**
 * out = P·Qᵀ, each element ((p0·q0 + p1·q1) + p2·q2) + p3·q3 in f32 (as matrix.ts's scalar loop),
 * and, with a residual E, E -= P·Qwᵀ. False when the kernels cannot take it.
 */
export const feedbackOuterSimd = (
  P: Float32Array,
  Qw: Float32Array | undefined,
  Q: Float32Array,
  n: number,
  m: number,
  r: number,
  E: Float32Array | undefined,
  out: Float32Array
): boolean => {
  const k = psgd(n, m, r)
  if (!k) return false
  const { f, ex } = k
  setColumns(f, QC, Q, m, r)
  const residual = E !== undefined && Qw !== undefined
  if (residual) setColumns(f, WC, Qw, m, r)
  const per = Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    const lo = i0 * m
    const hi = lo + rows * m
    setRows(f, P, i0, rows, r)
    if (residual) k.b.set(E.subarray(lo, hi))
    ex.feedbackOuter(rows, m, residual ? 1 : 0)
    out.set(f.subarray(O, O + (hi - lo)), lo)
    if (residual) E.set(k.b.subarray(0, hi - lo), lo)
  }
  return true
}
