// IEEE binary16 conversion for the optional fp16 wire format of collectives: values travel as
// half-precision bits (half the bytes), every rank accumulates in fp32. Encoding works on the fp32
// bit patterns (F. Giesen's round-to-nearest-even "fast3" method); decoding is a lookup in a
// 65536-entry table built on first use. No allocation per call. Arrays of SIMD_MIN elements or more
// go through the WebAssembly SIMD kernels of simd.ts, which give the same bits; the scalar loops
// here are the reference and the fallback.
import { addHalfIntoHalfSimd, addScaledIntoHalfSimd, decodeHalfSimd, encodeHalfSimd, halfFeedbackBitsSimd, roundHalfSimd } from "./simd.ts"

let table: Float32Array | undefined

/** Value of every binary16 bit pattern (256 KiB, built once). */
export const halfTable = (): Float32Array => {
  if (table) return table
  const t = new Float32Array(65536)
  for (let h = 0; h < 65536; h++) {
    const e = (h >>> 10) & 0x1f
    const m = h & 0x3ff
    let v: number
    if (e === 0) v = m * 2 ** -24
    else if (e === 31) v = m === 0 ? Infinity : NaN
    else v = (1 + m / 1024) * 2 ** (e - 15)
    t[h] = h & 0x8000 ? -v : v
  }
  table = t
  return t
}

/** The rare cases (zero/subnormal, overflow, Inf, NaN) of one conversion, given value and bits. */
const slowHalf = (value: number, bits: number): number => {
  const sign = (bits >>> 16) & 0x8000
  const f = bits & 0x7fffffff
  if (f >= 0x47800000) return sign | (f > 0x7f800000 ? 0x7e00 : 0x7c00)
  // Below 2^-14 the half is subnormal: adding 0.5 (in fp32) puts the half's ulp 2^-24 at fp32's last
  // mantissa bit, so fp32's own rounding does the round-to-nearest-even.
  return sign | ((Math.fround(Math.abs(value) + 0.5) - 0.5) * 16777216)
}

/** binary16 bits of one fp32 value (`bits` its bit pattern), round to nearest even. */
const halfOf = (value: number, bits: number): number => {
  const f = bits & 0x7fffffff
  return f >= 0x38800000 && f < 0x47800000
    ? ((bits >>> 16) & 0x8000) | ((f - 0x38000000 + 0xfff + ((f >>> 13) & 1)) >>> 13)
    : slowHalf(value, bits)
}

/** out[i] = binary16 bits of src[i], round to nearest even. `src` must be 4-byte aligned (a Float32Array is). */
export const encodeHalf = (src: Float32Array, out: Uint16Array): void => {
  if (!encodeHalfSimd(src, out)) encodeHalfScalar(src, out)
}

/** encodeHalf without SIMD (the reference). */
export const encodeHalfScalar = (src: Float32Array, out: Uint16Array): void => {
  const n = src.length
  const bits = new Uint32Array(src.buffer, src.byteOffset, n)
  for (let i = 0; i < n; i++) out[i] = halfOf(src[i], bits[i])
}

/** dst[i] = value of half bits src[i]. */
export const decodeHalf = (src: Uint16Array, dst: Float32Array): void => {
  if (!decodeHalfSimd(src, dst, false)) decodeHalfScalar(src, dst)
}

/** decodeHalf without SIMD (the reference). */
export const decodeHalfScalar = (src: Uint16Array, dst: Float32Array): void => {
  const t = halfTable()
  const n = src.length
  for (let i = 0; i < n; i++) dst[i] = t[src[i]]
}

/**
 * Rounds every value to the nearest binary16 value in place. The rank that computes a final value
 * does this before sending it as fp16, so it keeps exactly what every other rank decodes.
 */
export const roundToHalf = (data: Float32Array): void => {
  if (!roundHalfSimd(data)) roundToHalfScalar(data)
}

/** roundToHalf without SIMD (the reference). */
export const roundToHalfScalar = (data: Float32Array): void => {
  const t = halfTable()
  const n = data.length
  const bits = new Uint32Array(data.buffer, data.byteOffset, n)
  for (let i = 0; i < n; i++) data[i] = t[halfOf(data[i], bits[i])]
}

/** Elements per block of the scalar fused error-feedback loop (64 KiB: stays in L2). */
const FUSE_BLOCK = 16384

/**
 * fp16 error feedback that writes the message as binary16 bits: p = f32(f32(g·scale) + e);
 * out = half(p) (the bits sent); e = p - value(out). `g` is only read. One pass that stores
 * 2 bytes per element for the message instead of rounding g in place, and leaves nothing to
 * encode before sending.
 */
export const halfFeedbackBits = (g: Float32Array, e: Float32Array, scale: number, out: Uint16Array): void => {
  if (g.length !== e.length || out.length !== g.length) {
    throw new RangeError(`halfFeedbackBits: gradient, residual and message lengths differ (${g.length}, ${e.length}, ${out.length})`)
  }
  if (!halfFeedbackBitsSimd(g, e, scale, out)) halfFeedbackBitsScalar(g, e, scale, out)
}

/** halfFeedbackBits without SIMD (the reference): block by block through a scratch block. */
export const halfFeedbackBitsScalar = (g: Float32Array, e: Float32Array, scale: number, out: Uint16Array): void => {
  const t = halfTable()
  const d = new Float32Array(Math.min(FUSE_BLOCK, g.length))
  for (let lo = 0; lo < g.length; lo += FUSE_BLOCK) {
    const hi = Math.min(g.length, lo + FUSE_BLOCK)
    const p = hi - lo === d.length ? d : d.subarray(0, hi - lo)
    const r = e.subarray(lo, hi)
    for (let i = 0; i < p.length; i++) p[i] = Math.fround(g[lo + i] * scale) + r[i]
    const h = out.subarray(lo, hi)
    encodeHalfScalar(p, h)
    for (let i = 0; i < p.length; i++) r[i] = p[i] - t[h[i]]
  }
}

/**
 * h[i] = binary16 bits of f32(value of own[i] + value of h[i]), in place in `h`: a relay's partial
 * sum added into the received message when this rank's own values are binary16 bits.
 */
export const addHalfIntoHalf = (own: Uint16Array, h: Uint16Array): void => {
  if (addHalfIntoHalfSimd(own, h)) return
  const t = halfTable()
  const sum = new Float32Array(h.length)
  for (let i = 0; i < h.length; i++) sum[i] = t[own[i]] + t[h[i]]
  encodeHalfScalar(sum, h)
}

/**
 * h[i] = binary16 bits of f32(x + value of h[i]), in place in `h`, with x = f32(g[i]·scale), or,
 * given a residual `e`, x = f32(f32(g[i]·scale) + e[i]) and then e[i] = 0: a ring relay's (or the
 * owner's) addition of its own compensated values into the received message, when fp16 error
 * feedback is folded into the ring (gradient-reducer.ts). With `store`, g[i] = value of the new
 * h[i] afterwards (the owner's finished values); otherwise `g` is only read.
 */
export const addScaledIntoHalf = (g: Float32Array, scale: number, e: Float32Array | undefined, h: Uint16Array, store = false): void => {
  if (g.length !== h.length || (e !== undefined && e.length !== g.length)) {
    throw new RangeError(`addScaledIntoHalf: gradient, residual and message lengths differ (${g.length}, ${e?.length}, ${h.length})`)
  }
  if (!addScaledIntoHalfSimd(g, scale, e, h, store)) addScaledIntoHalfScalar(g, scale, e, h, store)
}

/** addScaledIntoHalf without SIMD (the reference). */
export const addScaledIntoHalfScalar = (g: Float32Array, scale: number, e: Float32Array | undefined, h: Uint16Array, store = false): void => {
  const t = halfTable()
  const sum = new Float32Array(Math.min(FUSE_BLOCK, g.length))
  for (let lo = 0; lo < g.length; lo += FUSE_BLOCK) {
    const hi = Math.min(g.length, lo + FUSE_BLOCK)
    const s = hi - lo === sum.length ? sum : sum.subarray(0, hi - lo)
    for (let i = 0; i < s.length; i++) {
      let x = Math.fround(g[lo + i] * scale)
      if (e) {
        x = Math.fround(x + e[lo + i])
        e[lo + i] = 0
      }
      s[i] = x + t[h[lo + i]]
    }
    const hs = h.subarray(lo, hi)
    encodeHalfScalar(s, hs)
    if (store) for (let i = 0; i < hs.length; i++) g[lo + i] = t[hs[i]]
  }
}
