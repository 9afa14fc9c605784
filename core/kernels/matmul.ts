// BatchMatMul and _FusedMatMul on wasm. tfjs-backend-wasm multiplies a transposed operand through
// a slow loop (0.8-3 GFLOP/s here, against 14-37 for the same product untransposed), and every
// dense layer's backward pass asks for one (dW = xᵀ·dy, dx = dy·Wᵀ): the operand is transposed
// first with the backend's own Transpose (O(m·k), small next to the O(m·k·n) product). Its
// batched products (more than one matrix: attention's Q·Kᵀ and weights·V) take that slow loop
// even untransposed, 2 GFLOP/s for a transformer's [64, 32, 32]·[64, 32, 16]. BatchMatMul runs
// them, and single products whose right operand fits the caches (k·n ≤ 32768 floats), through
// gradwire's SIMD kernel on the heap (heap-simd.ts: 23-33 GFLOP/s on those shapes, XNNPACK's
// 19-28 on the single ones), a transposed left operand read in place (xᵀ·dy: 16-27 GFLOP/s,
// against 9-17 for a transpose and XNNPACK), and a·bᵀ with k ≥ 32 and at most 256 rows as dot
// products of rows read in place (dx = dy·Wᵀ, an LSTM's dh = dz·Uᵀ: 13-18 GFLOP/s against 2-5 for a
// transpose and the product); larger single products stay with XNNPACK, which blocks for the caches. The products
// sum over k in order, a multiply then an add, as the backend's do (the same bits); the dot
// products in four partial sums added at the end.
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels } from "./heap-simd.ts"
import { callKernel, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

const swapLast = (t: TensorInfo): number[] => {
  const perm = t.shape.map((_, i) => i)
  const r = perm.length
  ;[perm[r - 2], perm[r - 1]] = [perm[r - 1]!, perm[r - 2]!]
  return perm
}

/** A single product's right operand that still fits the caches (floats): above it, XNNPACK's blocked kernel is faster. */
export const SIMD_SINGLE_MAX_KN = 32768

const size = (dims: readonly number[]): number => dims.reduce((x, y) => x * y, 1)

/** The outer (batch) dims of a product of a and b, or undefined where the SIMD kernel does not take them (one side's must be all 1, or both the same). */
const batchShape = (a: readonly number[], b: readonly number[]): number[] | undefined => {
  if (size(a) === 1) return b.length >= a.length ? [...b] : [...a.slice(0, a.length - b.length).map(() => 1), ...b]
  if (size(b) === 1) return a.length >= b.length ? [...a] : [...b.slice(0, b.length - a.length).map(() => 1), ...a]
  return a.length === b.length && a.every((d, i) => d === b[i]) ? [...a] : undefined
}

/** Products the SIMD kernel ran in this process (for tests). */
export const simdMatMulStats = { calls: 0 }

/** Below this inner length a·bᵀ is faster with b transposed first (the dot products' closing sums outweigh the transpose). */
export const SIMD_TB_MIN_K = 32
/**
 * Above this many rows of a, a·bᵀ is as fast or faster with b transposed once and the plain kernel
 * (1024·64 by 128·64: 0.57-0.66 against 0.67-0.69 ms; 32·512 by 512·512: 0.70 against 1.76 the
 * other way).
 */
export const SIMD_TB_MAX_M = 256

/**
 * a·b, aᵀ·b (`ta`: a read transposed in place) or a·bᵀ (`tb`: as dot products of rows) for float32
 * operands on the heap, by the SIMD kernels, or undefined where they do not apply.
 */
const simdProduct = (args: KernelArgs, a: TensorInfo, b: TensorInfo, ta: boolean, tb: boolean): TensorInfo | undefined => {
  const { backend } = args
  const ra = a.shape.length
  const rb = b.shape.length
  if (ra < 2 || rb < 2 || (ta && tb)) return undefined
  const m = a.shape[ta ? ra - 1 : ra - 2]!
  const k = a.shape[ta ? ra - 2 : ra - 1]!
  const n = b.shape[tb ? rb - 2 : rb - 1]!
  if (b.shape[tb ? rb - 1 : rb - 2] !== k) return undefined
  if (tb && (k % 4 !== 0 || k < SIMD_TB_MIN_K || m > SIMD_TB_MAX_M)) return undefined
  const outer = batchShape(a.shape.slice(0, -2), b.shape.slice(0, -2))
  if (!outer) return undefined
  const batches = size(outer)
  if (!tb && batches <= 1 && k * n > SIMD_SINGLE_MAX_KN) return undefined
  const kernels = heapKernels(backend)
  if (!kernels) return undefined
  const out = backend.makeOutput([...outer, m, n], "float32")
  const sa = size(a.shape.slice(0, -2)) === 1 ? 0 : m * k * 4
  const sb = size(b.shape.slice(0, -2)) === 1 ? 0 : k * n * 4
  const [pa, pb, pc] = [addressOf(backend, a), addressOf(backend, b), addressOf(backend, out)]
  simdMatMulStats.calls++
  if (tb) kernels.matmulTB(pa, pb, pc, batches, m, k, n, sa, sb)
  else kernels.matmul(pa, pb, pc, batches, m, k, n, sa, sb, ta ? 4 : 4 * k, ta ? 4 * m : 4)
  return out
}

/**
 * `original` (the backend's matmul kernel), fed untransposed operands; with `simd` (BatchMatMul),
 * gradwire's SIMD kernel where it applies.
 */
export const untransposedMatMul =
  (tf: Tf, original: KernelFunc, simd = false): KernelFunc =>
  (args: KernelArgs) => {
    const { inputs, backend, attrs } = args
    const ta = attrs.transposeA === true
    const tb = attrs.transposeB === true
    if (inputs.a.dtype !== "float32" || inputs.b.dtype !== "float32") return original(args)
    if (simd) {
      const direct = simdProduct(args, inputs.a, inputs.b, ta, tb)
      if (direct) return direct
    }
    if (!ta && !tb) return original(args)
    const temps: TensorInfo[] = []
    const plain = (t: TensorInfo): TensorInfo => {
      const out = callKernel(tf, "Transpose", { inputs: { x: t }, backend, attrs: { perm: swapLast(t) } })
      temps.push(out)
      return out
    }
    try {
      const a = ta ? plain(inputs.a) : inputs.a
      const b = tb ? plain(inputs.b) : inputs.b
      return (simd && simdProduct(args, a, b, false, false)) || original({ inputs: { ...inputs, a, b }, backend, attrs: { ...attrs, transposeA: false, transposeB: false } })
    } finally {
      for (const t of temps) backend.disposeData(t.dataId)
    }
  }
