// Transpose on the wasm heap: tfjs-backend-wasm's took 16 ms to transpose a 2048 x 144 matrix
// (about 18 M elements/s; 36 ms for 1024 x 1024), and every transposed matmul (matmul.ts: each
// dense and convolution filter gradient) and attention's head split go through it. Covers the
// transposes that move one group of axes past another, with leading axes kept (a batch) and
// trailing axes kept (a contiguous run per element): [1, 0], [0, 2, 1], [0, 2, 1, 3], [1, 0, 2],
// [2, 0, 1]. Each is a batched R x C transpose of runs, done in 64 x 64 tiles, so reads and writes
// both stay within a few cache lines: float32 and int32 by gradwire's SIMD kernel on the heap
// (heap-simd.ts; a JavaScript copy per run cost more than the run itself for attention's 16-float
// runs), bool by the loop below. Anything else goes to the backend's own kernel.
import { addressOf, heapKernels } from "./heap-simd.ts"
import { heapArray, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

const TILE = 64

/** The batched R x C transpose (of runs of `inner` elements) that `perm` is, or undefined. Pure. */
export const asBlockTranspose = (shape: readonly number[], perm: readonly number[]): { batch: number; rows: number; cols: number; inner: number } | undefined => {
  const r = perm.length
  let lead = 0
  while (lead < r && perm[lead] === lead) lead++
  if (lead === r) return undefined // the identity: not a transpose
  let tail = r
  while (tail > lead && perm[tail - 1] === tail - 1) tail--
  // The middle axes lead..tail-1 must be B then A for some split A = [lead, k), B = [k, tail).
  const k = perm[lead]!
  for (let i = lead; i < tail; i++) {
    const want = i - lead < tail - k ? k + (i - lead) : lead + (i - lead - (tail - k))
    if (perm[i] !== want) return undefined
  }
  const prod = (from: number, to: number): number => {
    let p = 1
    for (let i = from; i < to; i++) p *= shape[i]!
    return p
  }
  return { batch: prod(0, lead), rows: prod(lead, k), cols: prod(k, tail), inner: prod(tail, r) }
}

type Arr = Float32Array | Int32Array | Uint8Array

/** dst[b][c][r] = src[b][r][c] for runs of `inner` elements, tile by tile. */
export const blockTranspose = (src: Arr, dst: Arr, batch: number, rows: number, cols: number, inner: number): void => {
  const plane = rows * cols * inner
  for (let b = 0; b < batch; b++) {
    const base = b * plane
    for (let r0 = 0; r0 < rows; r0 += TILE) {
      const r1 = Math.min(rows, r0 + TILE)
      for (let c0 = 0; c0 < cols; c0 += TILE) {
        const c1 = Math.min(cols, c0 + TILE)
        if (inner === 1) {
          // Writes run along r (contiguous in dst); reads stride by cols within the tile.
          for (let c = c0; c < c1; c++) {
            let d = base + c * rows + r0
            let s = base + r0 * cols + c
            for (let r = r0; r < r1; r++, d++, s += cols) dst[d] = src[s]!
          }
        } else {
          for (let c = c0; c < c1; c++) {
            for (let r = r0; r < r1; r++) {
              const s = base + (r * cols + c) * inner
              dst.set(src.subarray(s, s + inner), base + (c * rows + r) * inner)
            }
          }
        }
      }
    }
  }
}

/** Transpose for the numeric dtypes where `perm` is a block transpose; `original` otherwise. */
export const transposeKernel =
  (original: KernelFunc): KernelFunc =>
  (args: KernelArgs): TensorInfo | TensorInfo[] => {
    const { inputs, backend, attrs } = args
    const x = inputs.x
    const perm = attrs.perm as number[]
    const plan = x.dtype === "string" || x.dtype === "complex64" ? undefined : asBlockTranspose(x.shape, perm)
    if (!plan) return original(args)
    const out = backend.makeOutput(perm.map((p) => x.shape[p]!), x.dtype)
    // float32 and int32 by gradwire's kernel on the heap (heap-simd.ts), bool (bytes) here.
    const kernels = x.dtype === "float32" || x.dtype === "int32" ? heapKernels(backend) : undefined
    if (kernels) {
      if (plan.batch * plan.rows * plan.cols * plan.inner > 0) kernels.blockTranspose(addressOf(backend, x), addressOf(backend, out), plan.batch, plan.rows, plan.cols, plan.inner)
      return out
    }
    blockTranspose(heapArray(backend, x), heapArray(backend, out), plan.batch, plan.rows, plan.cols, plan.inner)
    return out
  }
