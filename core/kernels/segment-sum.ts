// UnsortedSegmentSum on the wasm heap: the gradient of a gather, so of every embedding layer.
// One pass over the rows (the cpu backend's version builds a mask per segment, O(rows x segments)).
import { floats, ints, type KernelArgs, type TensorInfo } from "./wasm-heap.ts"

export const unsortedSegmentSum = ({ inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { x, segmentIds } = inputs
  const numSegments = attrs.numSegments as number
  const rows = segmentIds.shape.reduce((a, b) => a * b, 1)
  const inner = x.shape.slice(segmentIds.shape.length).reduce((a, b) => a * b, 1)
  const outShape = [numSegments, ...x.shape.slice(segmentIds.shape.length)]
  const out = backend.makeOutput(outShape, x.dtype)
  const ids = ints(backend, segmentIds)
  const dst = x.dtype === "int32" ? ints(backend, out) : floats(backend, out)
  const src = x.dtype === "int32" ? ints(backend, x) : floats(backend, x)
  dst.fill(0)
  for (let r = 0; r < rows; r++) {
    const s = ids[r]
    // TensorFlow drops rows whose id is negative or past numSegments.
    if (s < 0 || s >= numSegments) continue
    const so = r * inner
    const d = s * inner
    for (let i = 0; i < inner; i++) dst[d + i] += src[so + i]
  }
  return out
}
