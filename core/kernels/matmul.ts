// BatchMatMul and _FusedMatMul on wasm. tfjs-backend-wasm multiplies a transposed operand through
// a slow loop (0.8-3 GFLOP/s here, against 14-37 for the same product untransposed), and every
// dense layer's backward pass asks for one (dW = xᵀ·dy, dx = dy·Wᵀ): the operand is transposed
// first with the backend's own Transpose (O(m·k), small next to the O(m·k·n) product). Its
// batched products (more than one matrix: attention's Q·Kᵀ and weights·V) take that slow loop
// even untransposed, 2 GFLOP/s for a transformer's [64, 32, 32]·[64, 32, 16]. BatchMatMul runs
// them, and single products whose right operand fits the caches (k·n ≤ 32768 floats), through
// gradwire's SIMD kernel on the heap (heap-simd.ts: 23-33 GFLOP/s on those shapes, XNNPACK's
// 19-28 on the single ones; any single product of at most 64 rows, whose weights XNNPACK would
// pack again every training step), a transposed left operand read in place (xᵀ·dy: 16-27 GFLOP/s,
// against 9-17 for a transpose and XNNPACK; transposed first where its columns would share one L1
// cache set, 1024 or 2048 features: setConflicting), and a·bᵀ with k ≥ 32 and at most 256 rows as dot
// products of rows read in place (dx = dy·Wᵀ, an LSTM's dh = dz·Uᵀ: 13-18 GFLOP/s against 2-5 for a
// transpose and the product); larger single products run on it with b packed in blocks of 16
// columns and a's rows in cache-sized blocks where n is a multiple of 16 (46-50 GFLOP/s from 512
// rows on, against XNNPACK's 25-32, which had kept every product of more than 256 rows: [1024,
// 512]·[512, 512] 18.4 -> 11.2 ms, [512, 1024]·[1024, 1024] 40.0 -> 22.7, [4096, 256]·[256, 256]
// 18.2 -> 11.4, [8192, 576]·[576, 128] 38.7 -> 26.0, each with a fresh b), and the others of more
// rows stay with XNNPACK, which blocks for the caches. The products
// sum over k in order (with fused multiply-adds where the CPU has them, heap-simd.ts); the dot
// products in four partial sums added at the end. _FusedMatMul (a dense layer's forward: the
// product, its bias and activation) takes the same SIMD product where it applies, then the bias and
// the activation as their kernels (fusedMatMulKernel).
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels } from "./heap-simd.ts"
import { callKernel, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

const swapLast = (t: TensorInfo): number[] => {
  const perm = t.shape.map((_, i) => i)
  const r = perm.length
  ;[perm[r - 2], perm[r - 1]] = [perm[r - 1]!, perm[r - 2]!]
  return perm
}

/**
 * A single product's right operand that still fits the caches (floats): above it, with more than
 * SIMD_SINGLE_MAX_ROWS rows and b not packed (PACK_COLUMNS), XNNPACK's blocked kernel is faster.
 */
export const SIMD_SINGLE_MAX_KN = 32768
/**
 * Up to this many rows a single product runs on the SIMD kernel at any size. XNNPACK packs b into
 * its blocked layout once per b tensor, and a training step's weights are a new tensor every step,
 * so a dense layer's forward pays the packing every time. Each with a fresh b, alternated in one
 * process (ms, XNNPACK against the SIMD kernel, a 512 KiB copy making the fresh b in both):
 * [32, 1024]·[1024, 128] 1.87 / 0.90, [32, 3136]·[3136, 128] 6.23 / 3.29, [16, 1024]·[1024, 1024]
 * 12.5 / 6.7, [64, 1024]·[1024, 128] 2.29 / 1.66, [64, 512]·[512, 512] 4.52 / 3.46; even at 96-128
 * rows ([96, 1024]·[1024, 128] 2.78 / 2.66, [128, 512]·[512, 256] 2.77 / 2.91), XNNPACK ahead at
 * 256 ([256, 512]·[512, 512] 10.7 / 15.1).
 */
export const SIMD_SINGLE_MAX_ROWS = 64

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
 * Columns of b per block when a single product packs b first. The SIMD kernel's accumulators take
 * 16 columns of b at a time down all k of its rows, for every row of a: with b read in place those
 * 16 floats are one piece of each of k rows 4·n bytes apart, which an L2 of 512 KiB cannot keep for
 * the next row of a once b outgrows it, or once n is a power of two (all of them in a few cache
 * sets). Packed as contiguous [k, 16] blocks (one pass over b, the blocked result put back in one
 * pass over c) each block stays in cache for every row of a (for b over PACK_MIN_KN floats, or with
 * rows 4 KiB apart: setConflicting). The same bits; alternated in one
 * process, ms: [32, 1024]·[1024, 1024] 10.1 -> 5.3, [32, 784]·[784, 1024] 5.7 -> 3.7, [1024, 32]·[32,
 * 1024] 8.1 -> 3.1, [32, 1024]·[1024, 128] 0.71 -> 0.35, [32, 256]·[256, 256] 0.29 -> 0.17, [64,
 * 512]·[512, 512] 3.1 -> 1.5.
 */
const PACK_COLUMNS = 16
/**
 * Bytes of a's rows a packed product takes at a time (an even count of rows, at least 32): the
 * kernel goes over every block of b's columns for each of its pairs of rows, so a's rows are read
 * once per 16 columns of the product; in blocks that stay in the second-level cache they come from
 * memory once, and b's blocks once per block of rows instead. [8192, 576]·[576, 128] (a's 18.9 MB
 * read 8 times) 34.5 -> 26.0 ms, the square products unchanged (46-50 GFLOP/s either way); 128 and
 * 256 KiB measured alike, 512 KiB lost on the smaller ones.
 */
const PACK_ROW_BLOCK_BYTES = 256 * 1024
/**
 * Packing b takes a pass over b and one over the product: below this many floats of b (64 KiB), with
 * b's rows not 4 KiB apart, it cost more than it saved ([1024, 32]·[32, 32] 0.094 -> 0.112 ms,
 * [32, 128]·[128, 128] 0.051 -> 0.061; [64, 128]·[128, 256] 0.237 -> 0.223 above it).
 */
const PACK_MIN_KN = 16384

/**
 * Whether aᵀ·b read in place would go down columns of a whose elements all share one L1 cache set
 * (32 KiB, 8 ways of 64-byte lines: addresses 4 KiB apart): a's rows are 4·m bytes apart, so with m
 * a multiple of 1024 and k over the set's 8 ways each element is fetched from L2 again for every 16
 * columns of the product. Such products take a transposed first. xᵀ·dy, the SIMD kernel reading x in
 * place against BatchMatMul with this rule, alternated in one process (the second with the engine's
 * call around it): x [32, 1024] by dy [32, 128] 1.01 -> 0.68 ms, [32, 2048] by [32, 128] 2.15 ->
 * 1.38, [64, 1024] by [64, 128] 1.82 -> 1.45; not where fewer rows share a set or k is small
 * ([32, 512] by [32, 128] 0.30 against 0.40 transposed; [16, 1024] by [16, 32] 0.12 against 0.21).
 */
export const setConflicting = (m: number, k: number): boolean => m % 1024 === 0 && k >= 32

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
  if (ta && setConflicting(m, k)) return undefined
  const outer = batchShape(a.shape.slice(0, -2), b.shape.slice(0, -2))
  if (!outer) return undefined
  const batches = size(outer)
  const packed = !tb && batches === 1 && n % PACK_COLUMNS === 0 && n > PACK_COLUMNS && (k * n > PACK_MIN_KN || setConflicting(n, k))
  if (!tb && batches <= 1 && !packed && k * n > SIMD_SINGLE_MAX_KN && m > SIMD_SINGLE_MAX_ROWS) return undefined
  const kernels = heapKernels(backend)
  if (!kernels) return undefined
  const out = backend.makeOutput([...outer, m, n], "float32")
  const sa = size(a.shape.slice(0, -2)) === 1 ? 0 : m * k * 4
  const sb = size(b.shape.slice(0, -2)) === 1 ? 0 : k * n * 4
  const [pa, pb, pc] = [addressOf(backend, a), addressOf(backend, b), addressOf(backend, out)]
  simdMatMulStats.calls++
  const [ai, ak] = ta ? [4, 4 * m] : [4 * k, 4]
  if (tb) kernels.matmulTB(pa, pb, pc, batches, m, k, n, sa, sb)
  else if (packed) {
    // b as n/16 blocks of 16 columns, each k·16 floats in a row, multiplied as a batch of [rows, k]·[k,
    // 16] products by the same rows of a (PACK_ROW_BLOCK_BYTES of them at a time), and each block's
    // [n/16, rows, 16] result put back as its rows of [m, n].
    const rowsPerBlock = Math.min(m, Math.max(32, 2 * Math.floor(PACK_ROW_BLOCK_BYTES / (8 * k))))
    const columnBlocks = backend.makeOutput([k, n], "float32")
    const blocks = backend.makeOutput([rowsPerBlock, n], "float32")
    try {
      const [pp, pq] = [addressOf(backend, columnBlocks), addressOf(backend, blocks)]
      kernels.blockTranspose(pb, pp, 1, k, n / PACK_COLUMNS, PACK_COLUMNS)
      for (let r0 = 0; r0 < m; r0 += rowsPerBlock) {
        const rows = Math.min(rowsPerBlock, m - r0)
        kernels.matmul(pa + r0 * ai, pp, pq, n / PACK_COLUMNS, rows, k, PACK_COLUMNS, 0, k * PACK_COLUMNS * 4, ai, ak)
        kernels.blockTranspose(pq, pc + r0 * n * 4, 1, n / PACK_COLUMNS, rows, PACK_COLUMNS)
      }
    } finally {
      backend.disposeData(columnBlocks.dataId)
      backend.disposeData(blocks.dataId)
    }
  } else kernels.matmul(pa, pb, pc, batches, m, k, n, sa, sb, ai, ak)
  return out
}

/** _FusedMatMul's activations and the kernels that apply them after the product (prelu and others keep the backend's fused kernel). */
const ACTIVATION_KERNELS: Record<string, string | null> = { linear: null, relu: "Relu", relu6: "Relu6", elu: "Elu", sigmoid: "Sigmoid", leakyrelu: "LeakyRelu" }

/** _FusedMatMul calls that ran as gradwire's SIMD product, bias and activation in this process (for tests). */
export const fusedMatMulStats = { calls: 0 }

let fusedProducts = true

/** Whether _FusedMatMul may run as the SIMD product, bias and activation (on by default; off: the backend's kernel, for A/B benches). */
export const useFusedMatMulProducts = (on: boolean): void => {
  fusedProducts = on
}

/**
 * _FusedMatMul (tfjs-layers' Dense forward: a·b + bias, then the activation) as gradwire's SIMD
 * product where it applies (simdProduct), then the bias's Add and the activation's kernel, else
 * `original`. tfjs-core fuses a dense layer while recording gradients only for a linear activation
 * (a transformer's projections, a model's logits), and every dense layer in inference. The backend's
 * kernel, XNNPACK's fully connected operator, packs the weights on every call: with a new b each
 * call, alternated in one process (µs, the backend's kernel against the product, bias and activation
 * here): [32, 16]·[16, 10] 66.9 / 31.1, [32, 64]·[64, 64] 43.1 / 19.9, [32, 256]·[256, 128] 194 /
 * 64, [32, 1024]·[1024, 128] 725 / 217; with the same b (inference) [32, 256]·[256, 128] 208 / 71,
 * [64, 512]·[512, 512] 1073 / 727, [256, 784]·[784, 512] 6470 / 4179, but [32, 64]·[64, 10] 43 /
 * 53 (the two kernels after the product cost more than they save there). The zoo's plain training
 * steps: the transformer 1.03x, the rest within 1.02x.
 */
export const fusedMatMulKernel =
  (tf: Tf, original: KernelFunc): KernelFunc =>
  (args: KernelArgs) => {
    const { inputs, backend, attrs } = args
    const { a, b, bias, preluActivationWeights } = inputs
    const activation = (attrs.activation as string | undefined) ?? "linear"
    const after = ACTIVATION_KERNELS[activation]
    if (!fusedProducts || after === undefined || preluActivationWeights || a!.dtype !== "float32" || b!.dtype !== "float32" || (bias && bias.dtype !== "float32")) return original(args)
    let y = simdProduct(args, a!, b!, attrs.transposeA === true, attrs.transposeB === true)
    if (!y) return original(args)
    fusedMatMulStats.calls++
    const step = (name: string, ins: Record<string, TensorInfo>, kernelAttrs: Record<string, unknown> = {}): void => {
      const next = callKernel(tf, name, { inputs: ins, backend, attrs: kernelAttrs })
      backend.disposeData(y!.dataId)
      y = next
    }
    if (bias) step("Add", { a: y, b: bias })
    if (after) step(after, { x: y }, activation === "leakyrelu" ? { alpha: attrs.leakyreluAlpha } : {})
    return y
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
