// The element loops of the data path: reduce a received payload into a region of the buffer, copy
// one in, finish a final value (mean, weighted mean), and read payloads as typed-array views.
// The sums, divisions and scalings run in the SIMD kernels (simd.ts) when they are available, with
// the same bits as the plain loops here, which run otherwise; no allocation except the scratch for
// misaligned payloads.
import { decodeHalf, encodeHalf, halfTable } from "./float16.ts"
import { addDivideF32Simd, addF32Simd, addIntoHalfSimd, decodeAddDivideSimd, decodeHalfSimd, divideF32Simd, scaleF32Simd } from "./simd.ts"

export type ReduceOp = "sum" | "mean" | "max" | "weightedMean"

let scratch = new ArrayBuffer(1 << 16)
const scratchFor = (bytes: number): ArrayBuffer => {
  if (scratch.byteLength < bytes) scratch = new ArrayBuffer(Math.max(bytes, scratch.byteLength * 2))
  return scratch
}

/** The payload as a Float32Array: a view when aligned (large messages always are), else a scratch copy. */
export const f32View = (payload: Uint8Array, n: number): Float32Array => {
  if ((payload.byteOffset & 3) === 0) return new Float32Array(payload.buffer, payload.byteOffset, n)
  const buf = scratchFor(n * 4)
  new Uint8Array(buf, 0, n * 4).set(payload.subarray(0, n * 4))
  return new Float32Array(buf, 0, n)
}

/** The payload as binary16 bits: a view when aligned, else a scratch copy. */
export const u16View = (payload: Uint8Array, n: number): Uint16Array => {
  if ((payload.byteOffset & 1) === 0) return new Uint16Array(payload.buffer, payload.byteOffset, n)
  const buf = scratchFor(n * 2)
  new Uint8Array(buf, 0, n * 2).set(payload.subarray(0, n * 2))
  return new Uint16Array(buf, 0, n)
}

/** dst[off..off+n) op= payload, where op is + (sum, mean, weightedMean) or max. */
export const accumulate = (dst: Float32Array, off: number, payload: Uint8Array, n: number, half: boolean, op: ReduceOp): void => {
  if (half) {
    const src = u16View(payload, n)
    const t = halfTable()
    if (op === "max") {
      for (let i = 0; i < n; i++) {
        const v = t[src[i]]
        if (v > dst[off + i] || v !== v) dst[off + i] = v
      }
    } else if (!decodeHalfSimd(src, dst.subarray(off, off + n), true)) {
      for (let i = 0; i < n; i++) dst[off + i] += t[src[i]]
    }
    return
  }
  const src = f32View(payload, n)
  if (op === "max") {
    for (let i = 0; i < n; i++) {
      const v = src[i]
      // NaN wins, as in torch.max: a NaN gradient should not be hidden.
      if (v > dst[off + i] || v !== v) dst[off + i] = v
    }
  } else if (!addF32Simd(dst.subarray(off, off + n), src)) {
    for (let i = 0; i < n; i++) dst[off + i] += src[i]
  }
}

/**
 * payload op= buf[off..off+n), written into the payload itself (a received fp32 message that this
 * rank passes on next). The buffer is only read: a partial sum on its way to another rank never
 * needs to be stored here, which halves the memory traffic of a relay step. `payload` must be
 * 4-byte aligned (checked by the caller).
 */
export const accumulateIntoPayload = (payload: Uint8Array, buf: Float32Array, off: number, n: number, op: ReduceOp): void => {
  const p = new Float32Array(payload.buffer, payload.byteOffset, n)
  if (op === "max") {
    for (let i = 0; i < n; i++) {
      const own = buf[off + i]
      const v = p[i]
      if (!(v > own || v !== v)) p[i] = own
    }
  } else if (!addF32Simd(p, buf.subarray(off, off + n))) {
    for (let i = 0; i < n; i++) p[i] += buf[off + i]
  }
}

/**
 * The binary16 payload = half(payload + buf[off..off+n)), f32 addition, written into the payload
 * itself: accumulateIntoPayload for a message on the wire as fp16. The same bits as adding the
 * payload into the buffer and encoding that region for the next hop, in one pass instead of two,
 * and the buffer is only read. `payload` must be 2-byte aligned (checked by the caller).
 */
export const accumulateIntoHalfPayload = (payload: Uint8Array, buf: Float32Array, off: number, n: number): void => {
  const h = new Uint16Array(payload.buffer, payload.byteOffset, n)
  const own = buf.subarray(off, off + n)
  if (addIntoHalfSimd(own, h)) return
  const t = halfTable()
  const sum = new Float32Array(n)
  for (let i = 0; i < n; i++) sum[i] = own[i] + t[h[i]]
  encodeHalf(sum, h)
}

/**
 * dst[off..off+n) = (dst + payload) / divisor: the last addition and a mean's division in one pass
 * over memory, for the rank that finishes a region.
 */
export const accumulateDivide = (dst: Float32Array, off: number, payload: Uint8Array, n: number, half: boolean, divisor: number): void => {
  if (half) {
    const src = u16View(payload, n)
    if (decodeAddDivideSimd(src, dst.subarray(off, off + n), divisor)) return
    const t = halfTable()
    for (let i = 0; i < n; i++) dst[off + i] = (dst[off + i] + t[src[i]]) / divisor
    return
  }
  const src = f32View(payload, n)
  if (addDivideF32Simd(dst.subarray(off, off + n), src, divisor)) return
  for (let i = 0; i < n; i++) dst[off + i] = (dst[off + i] + src[i]) / divisor
}

/** dst[off..off+n) = payload. */
export const assign = (dst: Float32Array, off: number, payload: Uint8Array, n: number, half: boolean): void => {
  if (half) {
    decodeHalf(u16View(payload, n), dst.subarray(off, off + n))
    return
  }
  // a payload the link read straight into its place (collectives/direct.ts `place`): nothing to copy
  if (payload.buffer === dst.buffer && payload.byteOffset === dst.byteOffset + off * 4) return
  if ((payload.byteOffset & 3) === 0) {
    dst.set(new Float32Array(payload.buffer, payload.byteOffset, n), off)
  } else {
    new Uint8Array(dst.buffer, dst.byteOffset + off * 4, n * 4).set(payload.subarray(0, n * 4))
  }
}

/**
 * data *= factor, in place (weights before a weighted mean). A factor of 1 changes no value and
 * costs no pass.
 */
export const scale = (data: Float32Array, off: number, n: number, factor: number): void => {
  if (factor === 1 || n === 0 || scaleF32Simd(data.subarray(off, off + n), factor)) return
  for (let i = off, end = off + n; i < end; i++) data[i] *= factor
}

/** data /= divisor, in place. Division (not multiplication by 1/d) so a mean equals sum / p exactly. */
export const divide = (data: Float32Array, off: number, n: number, divisor: number): void => {
  if (n === 0 || divideF32Simd(data.subarray(off, off + n), divisor)) return
  for (let i = off, end = off + n; i < end; i++) data[i] /= divisor
}
