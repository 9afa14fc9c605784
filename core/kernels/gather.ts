// GatherV2 on the wasm heap for batchDims 0 (every embedding lookup): row copies, by gradwire's
// kernel on the heap for 4-byte elements and int32 ids, else in JavaScript. tfjs-backend-wasm's
// took 0.55 ms to look up 2,048 rows of 8 floats. Indices out of range go to the backend's own
// kernel, which reports them as tfjs does.
import { addressOf, heapKernels } from "./heap-simd.ts"
import { ints, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

export const gatherRows = (original: KernelFunc): KernelFunc => (args: KernelArgs): TensorInfo | TensorInfo[] => {
  const { inputs, backend, attrs } = args
  const { x, indices } = inputs
  const batchDims = (attrs.batchDims as number | undefined) ?? 0
  if (batchDims !== 0 || x.dtype === "string" || x.dtype === "complex64") return original(args)
  const rank = x.shape.length
  const axis = (((attrs.axis as number | undefined) ?? 0) % rank + rank) % rank
  const outer = x.shape.slice(0, axis).reduce((a, b) => a * b, 1)
  const n = x.shape[axis]!
  const inner = x.shape.slice(axis + 1).reduce((a, b) => a * b, 1)
  const idx = ints(backend, indices)
  for (let i = 0; i < idx.length; i++) if (idx[i]! < 0 || idx[i]! >= n) return original(args)
  const out = backend.makeOutput([...x.shape.slice(0, axis), ...indices.shape, ...x.shape.slice(axis + 1)], x.dtype)
  // 4-byte elements and int32 ids on the heap: gradwire's kernel on the heap copies each row
  // with no view per row (tf.gather of 2,048 rows of 8 floats, alternated in one process with the
  // loop below: 77-139 -> 31-50 µs, most of what is left tfjs's own overhead around the kernel).
  const kernels = (x.dtype === "float32" || x.dtype === "int32") && indices.dtype === "int32" ? heapKernels(backend) : undefined
  if (kernels) {
    kernels.gatherRows(addressOf(backend, x), addressOf(backend, out), addressOf(backend, indices), idx.length, outer, n * inner * 4, inner * 4)
    return out
  }
  // Views after the allocation: growing the heap would detach earlier ones.
  const src = backend.typedArrayFromHeap(x)
  const dst = backend.typedArrayFromHeap(out)
  const ids = ints(backend, indices)
  let d = 0
  for (let o = 0; o < outer; o++) {
    const base = o * n * inner
    for (let i = 0; i < ids.length; i++, d += inner) {
      const s = base + ids[i]! * inner
      // Short rows element by element: a subarray and set per row cost more than the copy (an
      // embedding's 2,048 rows of 8 floats: 121 -> 70 µs a call in its training step).
      if (inner <= 32) for (let k = 0; k < inner; k++) dst[d + k] = src[s + k]!
      else dst.set(src.subarray(s, s + inner), d)
    }
  }
  return out
}
