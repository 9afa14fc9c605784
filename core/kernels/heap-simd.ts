// gradwire's SIMD kernels on tfjs-backend-wasm's heap (simd/heap-kernels.wat.mjs): one small
// WebAssembly module instantiated with the backend's own memory as its memory, so a kernel reads
// and writes tensors where tfjs keeps them, with no copy. The heap may grow later (the same Memory
// object: the module sees the new size at once); addresses are taken afresh at every call.
//
// Undefined (the callers keep their JavaScript or tfjs path) without WebAssembly SIMD, with
// GRADWIRE_SIMD=0, or on a backend that does not expose its memory.
//
// Two binaries are built from the same text: one multiplies, then adds (two roundings, the same
// bits on every CPU), the other sums the products, convolutions, layer normalization and the LSTM
// and GRU cells with relaxed SIMD's fused multiply-add (one instruction and one rounding where the CPU has an FMA:
// x86 with FMA3, arm64). The fused one is used where the runtime takes relaxed SIMD, unless
// GRADWIRE_FMA=0; the kernel maddProbe tells whether the CPU really fuses.
import * as settings from "../settings.ts"
import type { Tf } from "../tf.ts"
import { wrapGradient, type GradientOver } from "./gradients.ts"
import { HEAP_KERNELS_FMA_WASM_BASE64, HEAP_KERNELS_WASM_BASE64 } from "./simd/heap-kernels-wasm.ts"
import { heapArray, type TensorInfo, type WasmBackend } from "./wasm-heap.ts"

declare const WebAssembly: {
  Module: new (bytes: Uint8Array) => object
  Instance: new (module: object, imports: object) => { readonly exports: unknown }
}

/** The kernels, as the module exports them (byte addresses on the heap). */
/** A side of a Winograd tile in outputs: F(4, 3), F(3, 3) or F(2, 3) (wgPlan in conv2d.ts). */
export type WinogradSide = 2 | 3 | 4
type WinogradShape = `${WinogradSide}${WinogradSide}`

/** The Winograd kernels, one of each for every tile shape mh x mw (wgFilter44, wgConv42, ...). */
type WinogradKernels = {
  /** The outputs in rows R0 .. R0 + RH − 1 and columns C0 .. C0 + RW − 1 of each image of a 3x3 convolution at stride 1, from x padded past those tiles and u from wgFilter4; C and O multiples of 4. */
  [S in WinogradShape as `wgConv${S}`]: (x: number, u: number, bias: number, y: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, O: number, relu: number, scratch: number, T: number, R0: number, C0: number, RH: number, RW: number) => void
} & {
  /** Its filter gradient's sums over those outputs, from x padded as wgConv reads it and dy [N, OH, OW, O], added into sums in scratch that every shape shares (zeroed with first 1; dw from them with last 1; the same T in every call). */
  [S in WinogradShape as `wgFilterGrad${S}`]: (x: number, dy: number, dw: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, O: number, scratch: number, T: number, R0: number, C0: number, RH: number, RW: number, first: number, last: number) => void
}

export interface HeapKernels extends WinogradKernels {
  matmul(a: number, b: number, c: number, batches: number, m: number, k: number, n: number, sa: number, sb: number, ai: number, ak: number): void
  /** C = A·Bᵀ per batch, k a multiple of 4. */
  matmulTB(a: number, b: number, c: number, batches: number, m: number, k: number, n: number, sa: number, sb: number): void
  /** Channels C a multiple of 4. */
  bnTrainForward(x: number, gamma: number, beta: number, y: number, mean: number, variance: number, M: number, C: number, eps: number, scratch: number): void
  /** Channels C a multiple of 4. */
  bnTrainBackward(dy: number, x: number, gamma: number, mean: number, variance: number, dmean: number, dvariance: number, dx: number, dgamma: number, dbeta: number, M: number, C: number, eps: number, scratch: number): void
  /** Row length D a multiple of 4. */
  lnForward(x: number, gamma: number, beta: number, y: number, N: number, D: number, eps: number): void
  /** Row length D a multiple of 4. */
  lnBackward(dy: number, x: number, gamma: number, dx: number, dgamma: number, dbeta: number, N: number, D: number, eps: number): void
  /** LSTM units H a multiple of 4, more than 0; hard 1 for hardSigmoid, 0 for sigmoid. */
  lstmCellForward(z: number, c: number, h: number, cNext: number, B: number, H: number, hard: number): void
  /** As lstmCellForward. */
  lstmCellBackward(dh: number, dcNext: number, z: number, c: number, dz: number, dc: number, B: number, H: number, hard: number): void
  /** x read as [B, R, C], R ≥ 1; isMin 1 for min, 0 for max. */
  reduceMaxMin(x: number, out: number, B: number, R: number, C: number, isMin: number): void
  /** dx [B, R, C] of a max or min over R, from dy and y [B, C] and x. */
  maxMinGrad(dy: number, x: number, y: number, dx: number, B: number, R: number, C: number): void
  /** dst[b][c][r] = src[b][r][c], runs of `inner` 4-byte elements. */
  blockTranspose(src: number, dst: number, batch: number, rows: number, cols: number, inner: number): void
  /** out[b, c] = scale · Σ_r x[b, r, c], as reduce.ts's sumBlock loop (the same bits). */
  sumBlock(x: number, out: number, B: number, R: number, C: number, scale: number): void
  /** Rows named by int32 ids (in range) copied from each of `outer` blocks of src into dst. */
  gatherRows(src: number, dst: number, ids: number, count: number, outer: number, rowsBytes: number, rowBytes: number): void
  /** tfjs's ReLU gradient dy · step(x) over n floats. */
  reluGrad(dy: number, x: number, out: number, n: number): void
  /** tfjs's Adam update of n weights p into q, moments m and v in place (fused-adam.ts). */
  adam(p: number, q: number, m: number, v: number, g: number, n: number, b1: number, c1: number, b2: number, c2: number, d1: number, d2: number, eps: number, negLr: number): void
  /** A channels-last 2-D convolution (dilation 1) of an input padded so that every tap is inside it; bias 0 for none, relu 1 for ReLU. */
  conv2d(x: number, w: number, bias: number, y: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, O: number, FH: number, FW: number, SH: number, SW: number, relu: number): void
  /** A channels-last 2-D convolution's filter gradient (dilation 1); acc 1 adds to dW's values (the batch in chunks). */
  convFilterGrad(x: number, dy: number, dw: number, N: number, H: number, W: number, C: number, OH: number, OW: number, O: number, FH: number, FW: number, SH: number, SW: number, top: number, left: number, acc: number): void
  /** A channels-last max pool's gradient for windows that do not overlap; dx written inside windows only; reads up to 12 bytes past x and dy. */
  maxPoolGrad(x: number, dy: number, dx: number, N: number, H: number, W: number, C: number, OH: number, OW: number, FH: number, FW: number, SH: number, SW: number, top: number, left: number): void
  /** The same from x padded as conv2d reads it, four taps of a row at a time (for few output columns); reads up to 28 bytes past dy and 12 past x. */
  convFilterGradTaps(x: number, dy: number, dw: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, O: number, FH: number, FW: number, SH: number, SW: number): void
  /** A depthwise convolution's filter gradient (multiplier 1, dilation 1) from x padded as conv2d reads it; C a multiple of 4. */
  dwFilterGrad(x: number, dy: number, dw: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, FH: number, FW: number, SH: number, SW: number): void
  /** A depthwise convolution's input gradient (multiplier 1, dilation 1) added into dx (zeroed by the caller); C a multiple of 4. */
  dwInputGrad(dy: number, w: number, dx: number, N: number, H: number, W: number, C: number, OH: number, OW: number, FH: number, FW: number, SH: number, SW: number, top: number, left: number): void
  /** tfjs's clipByValue gradient over n floats: dy where lo ≤ x ≤ hi, else +0. */
  clipGrad(dy: number, x: number, out: number, n: number, lo: number, hi: number): void
  /** A GRU step's r·h (gru-cell.ts); H a multiple of 4; hard 1 for hardSigmoid, 0 for sigmoid. */
  gruReset(mx: number, inner: number, h: number, rh: number, B: number, H: number, hard: number): void
  /** Its gradient: dmx, dinner (0 outside the reset blocks) and dh from d(r·h). */
  gruResetGrad(drh: number, mx: number, inner: number, h: number, dmx: number, dinner: number, dh: number, B: number, H: number, hard: number): void
  /** A GRU step's h' from the gates' inputs and rec = (r·h)·U_h. */
  gruUpdate(mx: number, inner: number, h: number, rec: number, hn: number, B: number, H: number, hard: number): void
  /** Its gradient: dmx, dinner (0 in the reset blocks), dh and drec from dh'. */
  gruUpdateGrad(dhn: number, mx: number, inner: number, h: number, rec: number, dmx: number, dinner: number, dh: number, drec: number, B: number, H: number, hard: number): void
  /** Patch gradients dcol [N·OH·OW, FH·FW·C] added into dx [N, H, W, C] where their patches were read; C a multiple of 4. */
  col2im(dcol: number, dx: number, N: number, H: number, W: number, C: number, OH: number, OW: number, FH: number, FW: number, SH: number, SW: number, top: number, left: number): void
  /** The patch matrix [N·OH·OW, FH·FW·C] of x padded as conv2d reads it; C a multiple of 4. */
  im2col(x: number, col: number, N: number, HP: number, WP: number, C: number, OH: number, OW: number, FH: number, FW: number, SH: number, SW: number): void
  /** x [N, H, W, C] into a zeroed [N, HP, WP, C] at row top, column left; C a multiple of 4. */
  padImage(x: number, out: number, N: number, H: number, W: number, C: number, HP: number, WP: number, top: number, left: number): void
  /** A 3x3 filter [3, 3, C, O] transformed for Winograd's F(4x4, 3x3) into u: 36 planes of [C, O], each a cache line (64 bytes) longer, which every tile shape's wgConv reads; O a multiple of 4; tmp 288 bytes. */
  wgFilter4(w: number, u: number, C: number, O: number, tmp: number): void
  /** Lane 0 of c + a·b as the kernels sum (fused in the FMA binary where the CPU fuses). */
  maddProbe(a: number, b: number, c: number): number
}

let module: object | null | undefined
const instances = new WeakMap<object, HeapKernels | null>()
let enabled = true

/** Turns the heap kernels off (their callers' other paths run) or on again: for tests and benchmarks of those paths. */
export const useHeapKernels = (on: boolean): void => {
  enabled = on
}

/** Why the kernels are off, once a call found them so (explain.txt says it). */
let offReason: string | undefined
/** How the loaded kernels multiply and add: "fused multiply-add", or "multiply, then add (<why>)". */
let arithmetic = ""

/** For explain.txt: "in use, <arithmetic>", "off: <why>", or "not asked for yet" (wasm not loaded in this process: registerWasmKernels instantiates them). */
export const heapKernelsStatus = (): string => (module ? `in use, ${arithmetic}` : offReason ? `off: ${offReason}` : "not asked for yet")

/** Whether the loaded kernels' multiply-adds are fused (rounded once); undefined before they load. */
export const heapKernelsFused = (): boolean | undefined => (module ? arithmetic === FUSED_ARITHMETIC : undefined)

const FUSED_ARITHMETIC = "fused multiply-add"
/** a = b = 1 + 2⁻¹², c = -(1 + 2⁻¹¹): a·b + c is 2⁻²⁴ rounded once, 0 when a·b is rounded first. */
const PROBE = [1 + 2 ** -12, 1 + 2 ** -12, -(1 + 2 ** -11)] as const

/** The module to instantiate: the fused one where it loads and is wanted, else the plain one (null without SIMD). */
const loadModule = (): object | null => {
  if (!settings.simd.read()) {
    offReason = "GRADWIRE_SIMD=0"
    return null
  }
  let why = "GRADWIRE_FMA=0"
  if (settings.fma.read()) {
    try {
      arithmetic = FUSED_ARITHMETIC
      return new WebAssembly.Module(Buffer.from(HEAP_KERNELS_FMA_WASM_BASE64, "base64"))
    } catch {
      why = "this runtime has no relaxed SIMD"
    }
  }
  try {
    arithmetic = `multiply, then add (${why})`
    return new WebAssembly.Module(Buffer.from(HEAP_KERNELS_WASM_BASE64, "base64"))
  } catch {
    // no WebAssembly SIMD here: the callers' own paths do the work
    offReason = "this runtime has no WebAssembly SIMD"
    return null
  }
}

/** For A/B runs (bench/fma.ts): the binary that multiplies, then adds, in place of the fused one. */
let plainOnly = false
const plainInstances = new WeakMap<object, HeapKernels>()

/** Runs the kernels from the binary that multiplies, then adds (true), or from the one chosen at load (false): for benchmarks and tests of the two. */
export const usePlainMultiplyAdd = (on: boolean): void => {
  plainOnly = on
}

/** The kernels working on `backend`'s heap, or undefined (see above). */
export const heapKernels = (backend: WasmBackend): HeapKernels | undefined => {
  const memory = (backend as unknown as { wasm?: { asm?: { memory?: object } } }).wasm?.asm?.memory
  if (!memory) offReason = "the wasm backend does not expose its memory"
  if (!memory || !enabled) return undefined
  if (plainOnly && module) {
    let plain = plainInstances.get(memory)
    if (!plain) plainInstances.set(memory, (plain = new WebAssembly.Instance(new WebAssembly.Module(Buffer.from(HEAP_KERNELS_WASM_BASE64, "base64")), { env: { memory } }).exports as HeapKernels))
    return plain
  }
  const known = instances.get(memory)
  if (known !== undefined) return known ?? undefined
  if (module === undefined) module = loadModule()
  let made: HeapKernels | null = null
  if (module !== null) {
    try {
      made = new WebAssembly.Instance(module, { env: { memory } }).exports as HeapKernels
    } catch {
      made = null
    }
  }
  // relaxed_madd is fused or not as the CPU has it: say which
  if (made && arithmetic === FUSED_ARITHMETIC && made.maddProbe(...PROBE) === 0) arithmetic = "multiply, then add (this CPU has no fused multiply-add)"
  instances.set(memory, made)
  return made ?? undefined
}

/** A tensor's byte address on the heap. */
export const addressOf = (backend: WasmBackend, t: TensorInfo): number => heapArray(backend, t).byteOffset

/** Whether the heap goes on at least `bytes` past the end of t's data: for kernels that read past their last row lanes they never store. */
export const roomAfter = (backend: WasmBackend, t: TensorInfo, bytes: number): boolean => {
  const a = heapArray(backend, t)
  return a.byteOffset + a.byteLength + bytes <= a.buffer.byteLength
}

type Tensor = import("@tensorflow/tfjs").Tensor

/** A gradient on the heap: tfjs's map of input gradients, or undefined to leave the call to tfjs's own gradient. */
export type HeapGradient = GradientOver

const HEAP_GRADIENT = Symbol.for("gradwire.heapGradient")

/**
 * Wraps tfjs's registered gradient of `kernelName` (once per process, over tfjs-core's own): on
 * wasm with the heap kernels, for float32 dy and saved tensors, `onHeap` may give the gradient;
 * everywhere else, and where it gives undefined, tfjs's own runs. False where tfjs has none.
 */
export const wrapGradientOnHeap = (tf: Tf, kernelName: string, onHeap: HeapGradient): boolean =>
  wrapGradient(tf, kernelName, HEAP_GRADIENT, (dy, saved, attrs) => {
    const fits = tf.getBackend() === "wasm" && dy.dtype === "float32" && saved.every((t) => t.dtype === "float32") && heapKernels(tf.backend() as unknown as WasmBackend) !== undefined
    return fits ? onHeap(dy, saved, attrs) : undefined
  })
