// Unpack (tf.unstack) on the wasm heap: tfjs-backend-wasm 4.22 slices each output out element by
// element, and took 5.5-8.3 ms to unstack a [32, 32, 256] tensor into its 32 time steps (an LSTM's
// projected inputs; tfjs-layers' recurrence unstacks its inputs this way on every call). Here each
// output is `outer` runs of `inner` contiguous elements of the input, each one copy: the whole
// tensor is read once.
import { heapArray, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

export const unpack = (own: KernelFunc): KernelFunc => (args: KernelArgs): TensorInfo[] => {
  const { inputs, backend, attrs } = args
  const x = inputs.value
  if (!x || x.dtype === "string" || x.dtype === "complex64") return own(args) as TensorInfo[]
  const shape = x.shape
  const rank = shape.length
  const axis = ((attrs.axis as number) + rank) % rank
  const n = shape[axis]!
  let outer = 1
  for (let i = 0; i < axis; i++) outer *= shape[i]!
  let inner = 1
  for (let i = axis + 1; i < rank; i++) inner *= shape[i]!
  const outShape = shape.filter((_, i) => i !== axis)
  const outs: TensorInfo[] = []
  for (let k = 0; k < n; k++) {
    const out = backend.makeOutput([...outShape], x.dtype)
    // Made before the views: a new output can grow the heap and detach earlier views.
    outs.push(out)
  }
  const from = heapArray(backend, x)
  outs.forEach((out, k) => {
    const dst = heapArray(backend, out)
    if (outer === 1) {
      dst.set(from.subarray(k * inner, (k + 1) * inner))
      return
    }
    for (let o = 0; o < outer; o++) {
      const s = (o * n + k) * inner
      if (inner >= 16) dst.set(from.subarray(s, s + inner), o * inner)
      else for (let i = 0; i < inner; i++) dst[o * inner + i] = from[s + i]!
    }
  })
  return outs
}
