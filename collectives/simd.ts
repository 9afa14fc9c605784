// The SIMD data-path kernels (simd/kernels.wat, WebAssembly 128-bit SIMD) behind small functions
// over ordinary typed arrays. WebAssembly reads only its own memory, so each call streams the
// arrays through fixed 64 Ki-element scratch blocks: copy in (a memcpy), one kernel call, copy out.
// The copies stay in cache and cost far less than the scalar conversions they replace: binary16
// encode/decode drop from 2-8 ns to well under 1 ns per element (`npm run bench -- codec`).
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
}

interface Kernels {
  readonly ex: KernelExports
  readonly a: Float32Array
  readonly b: Float32Array
  readonly h: Uint16Array
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
      h: new Uint16Array(buf, 0x80000, SIMD_BLOCK)
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

/** dst[i] = value of src[i] (add = false) or dst[i] += value of src[i] (add = true). */
export const decodeHalfSimd = (src: Uint16Array, dst: Float32Array, add: boolean): boolean => {
  const k = get(src.length)
  if (!k) return false
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    k.h.set(src.subarray(lo, lo + n))
    const d = dst.subarray(lo, lo + n)
    if (add) k.a.set(d)
    k.ex.decode(n, add ? 1 : 0)
    d.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
  return true
}

/** dst[i] = f32((dst[i] + value of src[i]) / divisor), the sum and division in double as JS does. */
export const decodeAddDivideSimd = (src: Uint16Array, dst: Float32Array, divisor: number): boolean => {
  const k = get(src.length)
  if (!k) return false
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    k.h.set(src.subarray(lo, lo + n))
    const d = dst.subarray(lo, lo + n)
    k.a.set(d)
    k.ex.decodeAddDivide(n, divisor)
    d.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
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
