// The SIMD data-path kernels (simd/kernels.wat.mjs, WebAssembly 128-bit SIMD) behind small
// functions over ordinary typed arrays. WebAssembly reads only its own memory, so an array that
// lives elsewhere is streamed through fixed 64 Ki-element scratch blocks: copy in (a memcpy), one
// kernel call, copy out. An array that lives in a kernel instance's memory (a space, see
// simdSpace: the gradient reducer keeps its residuals and working copies there) is worked on in
// place, with no copy at all. The kernels alone take about 0.8 ns per element for a binary16
// encode or decode-add (the scalar loops 1.4-2.1 ns); on arrays far beyond the caches both paths
// are held to memory speed, and what the kernels buy there is fewer passes (fused error feedback,
// PowerSGD's fused passes) and, in a space, none of the copies.
//
// Results are bit-for-bit those of the scalar loops (float16.ts, kernels.ts, compression/; tested),
// so ranks agree whether or not SIMD is available; only which NaN an fp32 sum of NaNs gives may
// differ (a collective's final values are finished on one rank and copied, so ranks still agree).
// Without WebAssembly SIMD, or with GRADWIRE_SIMD=0, every function here declines and the caller
// runs its scalar loop: false from most, -1 from topkCompensateSimd, undefined from
// int8FeedbackSimd and simdSpace (and simdAvailable() is false).
import * as settings from "../core/settings.ts"
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
  readonly memory: { readonly buffer: ArrayBuffer; grow(pages: number): number }
  encode(n: number, a: number, h: number): void
  decode(n: number, a: number, h: number, add: number): void
  decodeAddDivide(n: number, a: number, h: number, divisor: number): void
  addIntoHalf(n: number, a: number, h: number): void
  roundHalf(n: number, a: number): void
  addF32(n: number, a: number, b: number): void
  addDivideF32(n: number, a: number, b: number, d: number): void
  scaleF32(n: number, a: number, s: number, exact: number): void
  divideF32(n: number, a: number, d: number, exact: number): void
  halfFeedbackBits(n: number, a: number, b: number, h: number, scale: number, exact: number): void
  addHalfIntoHalf(n: number, a: number, h: number): void
  addScaledIntoHalf(n: number, a: number, b: number, h: number, scale: number, exact: number, withB: number, store: number): void
  topkCompensate(n: number, a: number, b: number, scale: number, exact: number, thr: number, c: number, cv: number, cap: number, base: number): number
  feedbackMatMul(rows: number, m: number, s: number, exact: number, owed: number, a: number, b: number): void
  matMulT(rows: number, m: number, a: number): void
  decodeOuter(rows: number, m: number, o: number): void
  int8Feedback(n: number, a: number, b: number, scale: number, exact: number, c: number, q: number, sc: number, seed: number): number
  int8AddInto(n: number, a: number, q: number, sc: number, c: number, assign: number): void
}

/** Byte addresses of the scratch blocks (the .wat's A, B, H, O). */
const A_AT = 0
const B_AT = 0x40000
const H_AT = 0x80000
const O_AT = 0x1a0000
/** Bytes of scratch at the start of every instance's memory; a space's regions follow. */
const SCRATCH_BYTES = 0x200000

interface Kernels {
  readonly ex: KernelExports
  readonly a: Float32Array
  readonly b: Float32Array
  readonly bu: Uint32Array
  /** The O block (top-k's candidate values). */
  readonly o: Float32Array
  readonly h: Uint16Array
  /** The whole memory as floats (PowerSGD's regions). */
  readonly f: Float32Array
}

let module: object | null | undefined
/** The scratch-only instance for arrays outside any space. */
let kernels: Kernels | null | undefined
/** Instances by their memory, for arrays that live in a space. */
const spaces = new WeakMap<ArrayBuffer, Kernels>()

const instantiate = (extraBytes: number): Kernels | null => {
  if (module === undefined) {
    module = null
    if (settings.simd.read()) {
      try {
        module = new WebAssembly.Module(Buffer.from(KERNELS_WASM_BASE64, "base64"))
      } catch {
        // no WebAssembly SIMD in this runtime: the scalar loops do the work
      }
    }
  }
  if (module === null) return null
  try {
    const ex = new WebAssembly.Instance(module, {}).exports as unknown as KernelExports
    // grown once, before any view exists: growing later would detach the views
    if (extraBytes > 0) ex.memory.grow(Math.ceil(extraBytes / 65536))
    const buf = ex.memory.buffer
    return {
      ex,
      a: new Float32Array(buf, A_AT, SIMD_BLOCK),
      b: new Float32Array(buf, B_AT, SIMD_BLOCK),
      bu: new Uint32Array(buf, B_AT, SIMD_BLOCK),
      o: new Float32Array(buf, O_AT, SIMD_BLOCK),
      h: new Uint16Array(buf, H_AT, SIMD_BLOCK),
      f: new Float32Array(buf)
    }
  } catch {
    return null // e.g. memory could not grow that far
  }
}

/** The scratch-only instance, made on first use (null without SIMD). */
const scratchKernels = (): Kernels | null => {
  if (kernels === undefined) kernels = instantiate(0)
  return kernels
}

const get = (n: number): Kernels | null => (n < SIMD_MIN ? null : scratchKernels())

/** The instance whose memory holds `x`, if any (then kernels work on it in place). */
const home = (x: ArrayBufferView): Kernels | undefined => spaces.get(x.buffer as ArrayBuffer)

/** Whether the SIMD kernels are in use in this process. */
export const simdAvailable = (): boolean => scratchKernels() !== null

/** Largest space made (bytes of regions); beyond it callers keep ordinary arrays. */
const MAX_SPACE_BYTES = 1536 * 1024 * 1024

/**
 * Zeroed float arrays of the given lengths that live together in the memory of one new kernel
 * instance, so that the functions here work on them in place instead of streaming them through
 * scratch blocks. Undefined when SIMD is unavailable or the total is too large: use ordinary
 * arrays then (the functions accept both).
 */
export const simdSpace = (lengths: ReadonlyArray<number>): Float32Array[] | undefined => {
  const aligned = lengths.map((n) => Math.ceil(n / 4) * 16)
  const total = aligned.reduce((a, b) => a + b, 0)
  if (total > MAX_SPACE_BYTES) return undefined
  const k = instantiate(total)
  if (!k) return undefined
  spaces.set(k.ex.memory.buffer, k)
  let at = SCRATCH_BYTES
  return lengths.map((n, i) => {
    const v = new Float32Array(k.ex.memory.buffer, at, n)
    at += aligned[i]
    return v
  })
}

/** Whether `x` lives in a space (tests). */
export const inSimdSpace = (x: ArrayBufferView): boolean => home(x) !== undefined

/**
 * Fixed-size regions of a space's memory that received payloads are read into (the direct path,
 * through a collective's placement), so that a sum of a payload and an array of the same space
 * runs in place: no block copy of either (a 64 MiB ring all-reduce at p = 4 and 8 on 2 cores:
 * 4-10 ms of CPU a call less, docs/benchmarks.md). A slot goes back to its space after the
 * current task. One a failed call never gave back stays taken; with none free, payloads go to the
 * receive pool as before.
 */
export interface SpaceSlots {
  readonly count: number
  /** Slots free now (tests). */
  readonly free: number
  /** Slots taken since the space was made (tests). */
  readonly taken: number
  /** A free slot's first `bytes` bytes, or undefined when none is free or `bytes` exceeds a slot. */
  take(bytes: number): Uint8Array | undefined
  /** Gives a taken slot back (after the current task); false for a view that is not one of them. */
  give(view: Uint8Array): boolean
}

const slotsBySpace = new WeakMap<ArrayBuffer, SpaceSlots>()

/**
 * simdSpace's arrays plus `count` slots of `slotBytes` in the same memory, for payloads to be summed
 * with them. Undefined where simdSpace is.
 */
export const simdSpaceWithSlots = (lengths: ReadonlyArray<number>, slotBytes: number, count: number): Float32Array[] | undefined => {
  const slot = Math.ceil(slotBytes / 16) * 16
  const made = simdSpace([...lengths, (slot / 4) * count])
  if (!made) return undefined
  const area = made.pop() as Float32Array
  const free: number[] = []
  for (let i = count - 1; i >= 0; i--) free.push(area.byteOffset + i * slot)
  const lent = new Set<number>()
  let taken = 0
  const slots: SpaceSlots = {
    count,
    get free() {
      return free.length
    },
    get taken() {
      return taken
    },
    take: (bytes) => {
      if (bytes > slot || free.length === 0) return undefined
      const at = free.pop() as number
      lent.add(at)
      taken++
      return new Uint8Array(area.buffer, at, bytes)
    },
    give: (view) => {
      if (view.buffer !== area.buffer || !lent.delete(view.byteOffset)) return false
      // after the current task, as the receive pool does: a send of it may still be copying
      setImmediate(() => free.push(view.byteOffset))
      return true
    }
  }
  slotsBySpace.set(area.buffer as ArrayBuffer, slots)
  return made
}

/** The payload slots of the space `x` lives in, if it has any. */
export const spaceSlots = (x: ArrayBufferView): SpaceSlots | undefined => slotsBySpace.get(x.buffer as ArrayBuffer)

/**
 * Streams fp32 `src` (read in place when it lives in a space, else through the A block) into the
 * binary16 `out` through the H block (copied in first when the kernel reads it, and back out).
 */
const intoHalfBlocks = (src: Float32Array, out: Uint16Array, readsOut: boolean, kernel: (k: Kernels, n: number, a: number) => void): boolean => {
  const own = home(src)
  const k = own ?? get(src.length)
  if (!k) return false
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    if (readsOut) k.h.set(out.subarray(lo, lo + n))
    if (!own) k.a.set(src.subarray(lo, lo + n))
    kernel(k, n, own ? src.byteOffset + lo * 4 : A_AT)
    out.set(n === SIMD_BLOCK ? k.h : k.h.subarray(0, n), lo)
  }
  return true
}

/** out[i] = binary16 bits of src[i] (round to nearest even). */
export const encodeHalfSimd = (src: Float32Array, out: Uint16Array): boolean =>
  intoHalfBlocks(src, out, false, (k, n, a) => k.ex.encode(n, a, H_AT))

/**
 * h[i] = binary16 bits of f32(src[i] + value of h[i]), in place in `h`: a ring relay's partial sum
 * written into the received binary16 message, which is then sent on as is. `src` is only read.
 */
export const addIntoHalfSimd = (src: Float32Array, h: Uint16Array): boolean =>
  src.length === h.length && intoHalfBlocks(src, h, true, (k, n, a) => k.ex.addIntoHalf(n, a, H_AT))

/**
 * Streams binary16 `src` through the H block into fp32 `dst`: in place when `dst` lives in a
 * space, else through the A block (copied in first when the kernel reads it, and back out).
 */
const throughHalfBlocks = (src: Uint16Array, dst: Float32Array, readsDst: boolean, kernel: (k: Kernels, n: number, a: number) => void): boolean => {
  const own = home(dst)
  const k = own ?? get(src.length)
  if (!k) return false
  for (let lo = 0; lo < src.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, src.length - lo)
    k.h.set(src.subarray(lo, lo + n))
    if (own) {
      kernel(k, n, dst.byteOffset + lo * 4)
      continue
    }
    const d = dst.subarray(lo, lo + n)
    if (readsDst) k.a.set(d)
    kernel(k, n, A_AT)
    d.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
  return true
}

/** dst[i] = value of src[i] (add = false) or dst[i] += value of src[i] (add = true). */
export const decodeHalfSimd = (src: Uint16Array, dst: Float32Array, add: boolean): boolean =>
  throughHalfBlocks(src, dst, add, (k, n, a) => k.ex.decode(n, a, H_AT, add ? 1 : 0))

/** dst[i] = f32((dst[i] + value of src[i]) / divisor), the sum and division in double as JS does. */
export const decodeAddDivideSimd = (src: Uint16Array, dst: Float32Array, divisor: number): boolean =>
  throughHalfBlocks(src, dst, true, (k, n, a) => k.ex.decodeAddDivide(n, a, H_AT, divisor))

/** Runs `kernel` on `a` in place: directly when it lives in a space, else through the A block. */
const inPlace = (a: Float32Array, kernel: (k: Kernels, n: number, a: number) => void): boolean => {
  const own = home(a)
  if (own) {
    kernel(own, a.length, a.byteOffset)
    return true
  }
  const k = get(a.length)
  if (!k) return false
  for (let lo = 0; lo < a.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, a.length - lo)
    const as = a.subarray(lo, lo + n)
    k.a.set(as)
    kernel(k, n, A_AT)
    as.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
  return true
}

/** data[i] = nearest binary16 value of data[i], in place. */
export const roundHalfSimd = (data: Float32Array): boolean => inPlace(data, (k, n, a) => k.ex.roundHalf(n, a))

/** Whether `scale` is an f32 value (then the kernels' f32 product equals Math.fround(x * scale)). */
const exactScale = (scale: number): number => (Math.fround(scale) === scale ? 1 : 0)

// ---- fp32 reductions (the plain all-reduce's arithmetic) ----

/**
 * Runs `kernel` on `a` (read and written) and `b` (read), equal lengths: in place for an array
 * that lives in the kernel instance's space, else streamed through the A and B blocks.
 */
const pairBlocks = (a: Float32Array, b: Float32Array, kernel: (k: Kernels, n: number, a: number, b: number) => void): boolean => {
  if (a.length !== b.length) return false
  const k = home(a) ?? home(b) ?? get(a.length)
  if (!k) return false
  const aOwn = home(a) === k
  const bOwn = home(b) === k
  if (aOwn && bOwn) {
    kernel(k, a.length, a.byteOffset, b.byteOffset)
    return true
  }
  for (let lo = 0; lo < a.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, a.length - lo)
    const as = aOwn ? undefined : a.subarray(lo, lo + n)
    if (as) k.a.set(as)
    if (!bOwn) k.b.set(b.subarray(lo, lo + n))
    kernel(k, n, as ? A_AT : a.byteOffset + lo * 4, bOwn ? b.byteOffset + lo * 4 : B_AT)
    if (as) as.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
  }
  return true
}

/** a[i] += b[i] (f32 addition, as a Float32Array store of the JS sum). `b` is only read. */
export const addF32Simd = (a: Float32Array, b: Float32Array): boolean => pairBlocks(a, b, (k, n, pa, pb) => k.ex.addF32(n, pa, pb))

/** a[i] = f32((a[i] + b[i]) / divisor), the sum and division in double as JS does. `b` is only read. */
export const addDivideF32Simd = (a: Float32Array, b: Float32Array, divisor: number): boolean =>
  pairBlocks(a, b, (k, n, pa, pb) => k.ex.addDivideF32(n, pa, pb, divisor))

/** a[i] = f32(a[i] * factor), the product in double as JS does. */
export const scaleF32Simd = (a: Float32Array, factor: number): boolean => {
  const exact = exactScale(factor)
  return inPlace(a, (k, n, pa) => k.ex.scaleF32(n, pa, factor, exact))
}

/** a[i] = f32(a[i] / divisor), the quotient in double as JS does. */
export const divideF32Simd = (a: Float32Array, divisor: number): boolean => {
  const exact = exactScale(divisor)
  return inPlace(a, (k, n, pa) => k.ex.divideF32(n, pa, divisor, exact))
}

/**
 * fp16 error feedback into binary16 bits, in one pass: p = f32(f32(g·scale) + e); out = half(p)
 * (the bits sent); e = p - value(out). `g` is only read. `g` and `e` are read in place
 * when they live in a space, else through the A and B blocks; `out` is written through the H block
 * unless it lives in `e`'s space.
 */
export const halfFeedbackBitsSimd = (g: Float32Array, e: Float32Array, scale: number, out: Uint16Array): boolean => {
  if (g.length !== e.length || out.length !== g.length) return false
  const exact = exactScale(scale)
  const own = home(e)
  const k = own ?? get(g.length)
  if (!k) return false
  const gOwn = home(g) === k
  const outOwn = home(out) === k
  for (let lo = 0; lo < g.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, g.length - lo)
    if (!gOwn) k.a.set(g.subarray(lo, lo + n))
    const es = own ? undefined : e.subarray(lo, lo + n)
    if (es) k.b.set(es)
    k.ex.halfFeedbackBits(
      n,
      gOwn ? g.byteOffset + lo * 4 : A_AT,
      own ? e.byteOffset + lo * 4 : B_AT,
      outOwn ? out.byteOffset + lo * 2 : H_AT,
      scale,
      exact
    )
    if (es) es.set(n === SIMD_BLOCK ? k.b : k.b.subarray(0, n))
    if (!outOwn) out.set(n === SIMD_BLOCK ? k.h : k.h.subarray(0, n), lo)
  }
  return true
}

/**
 * h[i] = binary16 bits of f32(value of own[i] + value of h[i]), in place in `h`: addIntoHalfSimd
 * for a rank whose own values are binary16 bits (its input was encoded by its error feedback).
 * One kernel decodes both and adds; `own` is read in place when it lives in a space (the fp16
 * reducer's halfInput does), else block by block through the A block; `h` goes through the H block.
 */
export const addHalfIntoHalfSimd = (own: Uint16Array, h: Uint16Array): boolean => {
  if (own.length !== h.length) return false
  const space = home(own)
  const k = space ?? get(h.length)
  if (!k) return false
  const a16 = space ? undefined : new Uint16Array(k.a.buffer, k.a.byteOffset, SIMD_BLOCK)
  for (let lo = 0; lo < h.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, h.length - lo)
    if (a16) a16.set(own.subarray(lo, lo + n))
    const hs = h.subarray(lo, lo + n)
    k.h.set(hs)
    k.ex.addHalfIntoHalf(n, a16 ? A_AT : own.byteOffset + lo * 2, H_AT)
    hs.set(n === SIMD_BLOCK ? k.h : k.h.subarray(0, n))
  }
  return true
}

/**
 * h[i] = binary16 bits of f32(x + value of h[i]), in place in `h`, where x = f32(g[i]·scale), or
 * with a residual `e`: x = f32(f32(g[i]·scale) + e[i]) and then e[i] = 0. A relay's partial sum when
 * its own values are a gradient still to be scaled and compensated (fp16 error feedback on a ring:
 * see gradient-reducer.ts). With `store`, g[i] = value of the new h[i] (a segment owner's finished
 * values, in the same pass); otherwise `g` is only read. `g` and `e` are read in place when they
 * live in a space, else through the A and B blocks; `h` goes through the H block.
 */
export const addScaledIntoHalfSimd = (g: Float32Array, scale: number, e: Float32Array | undefined, h: Uint16Array, store = false): boolean => {
  if (g.length !== h.length || (e !== undefined && e.length !== g.length)) return false
  const k = home(g) ?? (e && home(e)) ?? get(g.length)
  if (!k) return false
  const exact = exactScale(scale)
  const gOwn = home(g) === k
  const eOwn = e !== undefined && home(e) === k
  for (let lo = 0; lo < g.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, g.length - lo)
    const gs = gOwn ? undefined : g.subarray(lo, lo + n)
    if (gs) k.a.set(gs)
    const es = e && !eOwn ? e.subarray(lo, lo + n) : undefined
    if (es) k.b.set(es)
    const hs = h.subarray(lo, lo + n)
    k.h.set(hs)
    k.ex.addScaledIntoHalf(n, gs ? A_AT : g.byteOffset + lo * 4, eOwn ? e.byteOffset + lo * 4 : B_AT, H_AT, scale, exact, e ? 1 : 0, store ? 1 : 0)
    if (es) es.fill(0)
    if (gs && store) gs.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n))
    hs.set(n === SIMD_BLOCK ? k.h : k.h.subarray(0, n))
  }
  return true
}

/** The address of g[lo, lo + n) for a kernel that only reads it: in place when `own`, else copied into the A block. */
const readAt = (k: Kernels, g: Float32Array, own: boolean, lo: number, n: number): number => {
  if (own) return g.byteOffset + lo * 4
  k.a.set(g.subarray(lo, lo + n))
  return A_AT
}

/**
 * Top-k error feedback in one pass, for a residual `e` that lives in a space: e = f32(e +
 * f32(g·scale)); the ascending indices of the elements with |e| >= thr (or NaN) are written to
 * `cand` and their new values to `vals`, at most cand.length of them. Returns how many there were
 * (more than cand.length when the threshold was too low), or -1 when the kernels cannot take it
 * (`e` is not in a space). `g` is only read.
 */
export const topkCompensateSimd = (g: Float32Array, scale: number, e: Float32Array, thr: number, cand: Uint32Array, vals: Float32Array): number => {
  const k = home(e)
  if (!k || g.length !== e.length || vals.length < cand.length) return -1
  const exact = exactScale(scale)
  const gOwn = home(g) === k
  let count = 0
  for (let lo = 0; lo < g.length; lo += SIMD_BLOCK) {
    const n = Math.min(SIMD_BLOCK, g.length - lo)
    const a = readAt(k, g, gOwn, lo, n)
    const room = Math.max(0, cand.length - count)
    const found = k.ex.topkCompensate(n, a, e.byteOffset + lo * 4, scale, exact, thr, B_AT, O_AT, Math.min(room, SIMD_BLOCK), lo)
    if (room > 0) {
      const kept = Math.min(found, room)
      cand.set(k.bu.subarray(0, kept), count)
      vals.set(k.o.subarray(0, kept), count)
    }
    count += found
  }
  return count
}

// ---- int8 (QSGD) ----

/** Elements per kernel call for int8 chunks of c: whole chunks, at most SIMD_BLOCK (0 when a chunk is longer). */
const int8Block = (c: number): number => Math.floor(SIMD_BLOCK / c) * c

/**
 * int8 error feedback in one kernel pass per block, for a residual `e` that lives in a space:
 * e = f32(e + f32(g·scale)); the levels of e per chunk of `c` into `q` and the chunks' scales into
 * `scales`, the dither drawn from mulberry32 state `seed` on; then e -= the message's decoded
 * values. The same bytes and residual bits as int8.ts's encode after the compensation, then
 * accumulate(message, e, -1). Returns the state after the last draw, or undefined when the kernels
 * cannot take it (`e` outside a space, or a chunk longer than a block). `g` is only read.
 */
export const int8FeedbackSimd = (g: Float32Array, scale: number, e: Float32Array, c: number, seed: number, q: Int8Array, scales: Float32Array): number | undefined => {
  const k = home(e)
  const block = int8Block(c)
  if (!k || block === 0 || g.length !== e.length || q.length !== e.length || scales.length !== Math.ceil(e.length / c)) return undefined
  const exact = exactScale(scale)
  const gOwn = home(g) === k
  const levels = new Int8Array(k.ex.memory.buffer, H_AT, block)
  let s = seed | 0
  for (let lo = 0; lo < g.length; lo += block) {
    const n = Math.min(block, g.length - lo)
    const a = readAt(k, g, gOwn, lo, n)
    s = k.ex.int8Feedback(n, a, e.byteOffset + lo * 4, scale, exact, c, H_AT, B_AT, s)
    q.set(n === block ? levels : levels.subarray(0, n), lo)
    scales.set(k.b.subarray(0, Math.ceil(n / c)), lo / c)
  }
  return s
}

/**
 * into = the sum of int8 messages' decoded values, each given as its levels and scales with chunk
 * `c`: the first assigned, the others added in order, as fill(0) then accumulate(message, into, 1)
 * for each. False when the kernels cannot take it.
 */
export const int8SumSimd = (msgs: ReadonlyArray<{ readonly q: Int8Array; readonly scales: Float32Array }>, c: number, into: Float32Array): boolean => {
  const block = int8Block(c)
  const k = home(into) ?? get(into.length)
  if (!k || block === 0 || msgs.length === 0) return false
  const own = home(into) === k
  const levels = new Int8Array(k.ex.memory.buffer, H_AT, block)
  for (let lo = 0; lo < into.length; lo += block) {
    const n = Math.min(block, into.length - lo)
    const a = own ? into.byteOffset + lo * 4 : A_AT
    for (let r = 0; r < msgs.length; r++) {
      levels.set(msgs[r].q.subarray(lo, lo + n))
      k.b.set(msgs[r].scales.subarray(lo / c, lo / c + Math.ceil(n / c)))
      k.ex.int8AddInto(n, a, H_AT, B_AT, c, r === 0 ? 1 : 0)
    }
    if (!own) into.set(n === SIMD_BLOCK ? k.a : k.a.subarray(0, n), lo)
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

/** Rows of P the PR region holds (one kernel call's most rows when nothing is copied). */
const PR_ROWS = SIMD_BLOCK / 4

/** The instance to use: the one holding `x` (no copies), else the scratch-only one. */
const psgd = (n: number, m: number, r: number, x: Float32Array | undefined): Kernels | null =>
  r >= 1 && r <= 4 && m >= 4 && m % 4 === 0 && m <= PSGD_MAXM && n * m >= SIMD_MIN ? ((x && home(x)) ?? get(n * m)) : null

/** The r columns of a row-major m×r factor into a column region, columns r..3 zero. */
const setColumns = (f: Float32Array, at: number, F: Float32Array, m: number, r: number): void => {
  for (let c = 0; c < 4; c++) {
    const base = at + c * COL
    if (c >= r) f.fill(0, base, base + m)
    else for (let j = 0; j < m; j++) f[base + j] = F[j * r + c]
  }
}

/** Rows i0..i0+rows of an n×r factor into `at` (PR by default), 4 columns each, zero-padded. */
const setRows = (f: Float32Array, P: Float32Array, i0: number, rows: number, r: number, at = PR): void => {
  if (r === 4) {
    f.set(P.subarray(i0 * 4, (i0 + rows) * 4), at)
    return
  }
  for (let i = 0; i < rows; i++) for (let c = 0; c < 4; c++) f[at + i * 4 + c] = c < r ? P[(i0 + i) * r + c] : 0
}

/**
 * E = f32(E + f32(G·s)); P (n×r) = E·Q with f32 lane sums. False when the kernels cannot take it.
 * E in a space is updated in place; G in the same space is read in place. With `owed` (last step's
 * P̂ and this rank's Q_w), E first pays E = f32(E - P̂·Q_wᵀ) with decodeOuterSimd's fp32 formula.
 */
export const feedbackMatMulSimd = (
  G: Float32Array,
  s: number,
  E: Float32Array,
  n: number,
  m: number,
  Q: Float32Array,
  r: number,
  P: Float32Array,
  owed?: OwedProduct
): boolean => {
  const k = psgd(n, m, r, E)
  if (!k) return false
  const { f, ex } = k
  const eOwn = home(E) === k
  const gOwn = home(G) === k
  setColumns(f, QC, Q, m, r)
  if (owed) setColumns(f, WC, owed.Qw, m, r)
  const exact = exactScale(s)
  const per = eOwn && gOwn ? PR_ROWS : Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    const lo = i0 * m
    const hi = lo + rows * m
    if (!gOwn) k.a.set(G.subarray(lo, hi))
    if (!eOwn) k.b.set(E.subarray(lo, hi))
    if (owed) setRows(f, owed.P, i0, rows, r, O)
    ex.feedbackMatMul(rows, m, s, exact, owed ? 1 : 0, gOwn ? G.byteOffset + lo * 4 : A_AT, eOwn ? E.byteOffset + lo * 4 : B_AT)
    if (!eOwn) E.set(k.b.subarray(0, hi - lo), lo)
    for (let i = 0; i < rows; i++) for (let c = 0; c < r; c++) P[(i0 + i) * r + c] = f[PR + i * 4 + c]
  }
  return true
}

/** A product P·Q_wᵀ (n×r times m×r) still to be subtracted from a residual. */
export interface OwedProduct {
  readonly P: Float32Array
  readonly Qw: Float32Array
}

/** Q (m×r) = Mᵀ·P with f32 sums (M read in place when it lives in a space). False when the kernels cannot take it. */
export const matMulTSimd = (M: Float32Array, n: number, m: number, P: Float32Array, r: number, Q: Float32Array): boolean => {
  const k = psgd(n, m, r, M)
  if (!k) return false
  const { f, ex } = k
  const own = home(M) === k
  for (let c = 0; c < 4; c++) f.fill(0, ACC + c * COL, ACC + c * COL + m)
  const per = own ? PR_ROWS : Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    if (!own) k.a.set(M.subarray(i0 * m, (i0 + rows) * m))
    setRows(f, P, i0, rows, r)
    ex.matMulT(rows, m, own ? M.byteOffset + i0 * m * 4 : A_AT)
  }
  for (let j = 0; j < m; j++) for (let c = 0; c < r; c++) Q[j * r + c] = f[ACC + c * COL + j]
  return true
}

/**
 * out = P·Qᵀ, each element ((p0·q0 + p1·q1) + p2·q2) + p3·q3 in f32 (as matrix.ts's scalar loop).
 * False when the kernels cannot take it. out is written in place when it lives in a space.
 */
export const decodeOuterSimd = (P: Float32Array, Q: Float32Array, n: number, m: number, r: number, out: Float32Array): boolean => {
  const k = psgd(n, m, r, out)
  if (!k) return false
  const { f, ex } = k
  const outOwn = home(out) === k
  setColumns(f, QC, Q, m, r)
  const per = outOwn ? PR_ROWS : Math.floor(SIMD_BLOCK / m)
  for (let i0 = 0; i0 < n; i0 += per) {
    const rows = Math.min(per, n - i0)
    const lo = i0 * m
    setRows(f, P, i0, rows, r)
    ex.decodeOuter(rows, m, outOwn ? out.byteOffset + lo * 4 : O_AT)
    if (!outOwn) out.set(f.subarray(O, O + rows * m), lo)
  }
  return true
}
