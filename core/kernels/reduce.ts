// Sum and Mean over a contiguous block of axes that is not the innermost: tfjs-backend-wasm
// transposes the reduced axes to the end first, then reduces. Batch norm reduces a [32, 8, 8, 16]
// activation over [0, 1, 2] (its statistics forward, four sums per layer backward), every conv and
// dense layer's bias gradient sums over the leading axes, and global average pooling means over
// [1, 2]; the backend took 92 µs for the batch-norm shape here and 513 µs for a [32, 16, 16, 32]
// one, against 17 µs for the innermost axis. Here the input is read as [B, R, C] (B the axes before
// the block, R the block, C the axes after) and each of the B slices' R rows are added into C sums,
// eight rows at a time, straight from the wasm heap: 14 and 123 µs for those two shapes (in
// JavaScript; gradwire's SIMD kernel on the heap runs the same loop, the same bits, faster). (A product
// with a row of ones through the backend's BatchMatMul was as fast on a tensor it had seen, but
// XNNPACK packs its right operand anew for every new tensor, which made a training step slower.)
// Mean scales the sums by 1 / R. Max and Min over such a block run as gradwire's SIMD kernel on
// the heap (heap-simd.ts), and so does their gradient (a global max pool's). Other reductions
// (innermost axes, every axis, axes apart, non-float32) keep the backend's kernel.
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels, wrapGradientOnHeap } from "./heap-simd.ts"
import type { KernelArgs, KernelFunc, TensorInfo } from "./wasm-heap.ts"

/** A reduction's input as [before, reduced, after], with the reduced axes (non-negative, ascending). */
export interface ReducedBlock {
  readonly before: number
  readonly reduced: number
  readonly after: number
  readonly axes: ReadonlyArray<number>
}

/** The input as [before, reduced, after] when `axes` are one contiguous block with axes after it; else undefined. */
export const asReducedBlock = (shape: ReadonlyArray<number>, axis: number | ReadonlyArray<number> | null | undefined): ReducedBlock | undefined => {
  // null: every axis, which the backend reduces without a transpose.
  if (axis === null || axis === undefined) return undefined
  const rank = shape.length
  const axes = [...new Set((typeof axis === "number" ? [axis] : axis).map((a) => (a < 0 ? a + rank : a)))].sort((a, b) => a - b)
  if (axes.length === 0 || axes.some((a) => a < 0 || a >= rank)) return undefined
  const first = axes[0]!
  const last = axes.at(-1)!
  // Not one block, or nothing after it (the backend reduces the innermost axes without a transpose).
  if (last - first + 1 !== axes.length || last === rank - 1) return undefined
  const size = (from: number, to: number) => shape.slice(from, to).reduce((a, b) => a * b, 1)
  return { before: size(0, first), reduced: size(first, last + 1), after: size(last + 1, rank), axes }
}

/** The output shape of a reduction over `axes`, as tfjs gives it. */
const reducedShape = (shape: ReadonlyArray<number>, axes: ReadonlyArray<number>, keepDims: boolean): number[] =>
  keepDims ? shape.map((d, i) => (axes.includes(i) ? 1 : d)) : shape.filter((_, i) => !axes.includes(i))

/**
 * out[b, c] = scale x sum over r of x[b, r, c], for x laid out as [before, reduced, after]: eight
 * rows added pairwise, then into the sums.
 */
export const sumBlock = (x: Float32Array, out: Float32Array, block: Omit<ReducedBlock, "axes">, scale: number): void => {
  const { before: B, reduced: R, after: C } = block
  const acc = new Float32Array(C)
  for (let b = 0; b < B; b++) {
    acc.fill(0)
    const start = b * R * C
    let r = 0
    for (; r + 8 <= R; r += 8) {
      const r0 = start + r * C
      const r1 = r0 + C
      const r2 = r1 + C
      const r3 = r2 + C
      const r4 = r3 + C
      const r5 = r4 + C
      const r6 = r5 + C
      const r7 = r6 + C
      for (let c = 0; c < C; c++) acc[c] = acc[c]! + (x[r0 + c]! + x[r1 + c]! + (x[r2 + c]! + x[r3 + c]!) + (x[r4 + c]! + x[r5 + c]! + (x[r6 + c]! + x[r7 + c]!)))
    }
    for (; r < R; r++) {
      const r0 = start + r * C
      for (let c = 0; c < C; c++) acc[c] = acc[c]! + x[r0 + c]!
    }
    const o = b * C
    if (scale === 1) out.set(acc, o)
    else for (let c = 0; c < C; c++) out[o + c] = acc[c]! * scale
  }
}

/** `original` (the backend's Sum or Mean), or the sums in JavaScript for a block of leading or middle axes. */
export const blockReduce = (original: KernelFunc, mean: boolean): KernelFunc => (args: KernelArgs) => {
  const { inputs, backend, attrs } = args
  const x = inputs.x!
  const block = x.dtype === "float32" ? asReducedBlock(x.shape, attrs.axis as number | number[] | null) : undefined
  if (!block || block.reduced === 0 || block.before * block.after === 0) return original(args)
  const out = backend.makeOutput(reducedShape(x.shape, block.axes, attrs.keepDims === true), "float32")
  const scale = mean ? 1 / block.reduced : 1
  // The same loop as gradwire's SIMD kernel on the heap, two channels at a time in float64 (the same
  // bits): LeNet's bias gradient over [32, 28, 28, 6] 236 -> 41 µs, a global average pool over [32, 8, 8, 16] 68 -> 34.
  const kernels = heapKernels(backend)
  if (kernels) kernels.sumBlock(addressOf(backend, x), addressOf(backend, out), block.before, block.reduced, block.after, scale)
  else sumBlock(backend.typedArrayFromHeap(x) as Float32Array, backend.typedArrayFromHeap(out) as Float32Array, block, scale)
  return out
}

/** `original` (the backend's Max or Min), or gradwire's SIMD kernel for a block of leading or middle axes (the backend transposed the block to the end first: 0.28 ms for a global max pool over [32, 56, 32]'s middle axis). */
export const blockMaxMin =
  (original: KernelFunc, min: boolean): KernelFunc =>
  (args: KernelArgs) => {
    const { inputs, backend, attrs } = args
    const x = inputs.x!
    const kernels = x.dtype === "float32" ? heapKernels(backend) : undefined
    // Max's attribute is reductionIndices, Min's axis.
    const block = kernels ? asReducedBlock(x.shape, (min ? attrs.axis : attrs.reductionIndices) as number | number[] | null) : undefined
    if (!kernels || !block || block.reduced === 0 || block.before * block.after === 0) return original(args)
    const out = backend.makeOutput(reducedShape(x.shape, block.axes, attrs.keepDims === true), "float32")
    kernels.reduceMaxMin(addressOf(backend, x), addressOf(backend, out), block.before, block.reduced, block.after, min ? 1 : 0)
    return out
  }

/** gradwire's kernel for the gradient of a Max or Min over a block of leading or middle axes (below). */
export const MAX_MIN_GRAD = "GradwireMaxMinGrad"

/** dx = dy · (x == y), every tie taking dy, as tfjs's gradient computes it, in one pass on the heap. */
const maxMinGrad = ({ inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { dy, x, y } = inputs as { dy: TensorInfo; x: TensorInfo; y: TensorInfo }
  const block = asReducedBlock(x.shape, attrs.axes as number[])!
  const dx = backend.makeOutput([...x.shape], "float32")
  heapKernels(backend)!.maxMinGrad(addressOf(backend, dy), addressOf(backend, x), addressOf(backend, y), addressOf(backend, dx), block.before, block.reduced, block.after)
  return dx
}

/**
 * On wasm, the gradients of Max and Min over a block of leading or middle axes (a global max pool)
 * as one kernel (maxMinGrad) where tfjs's takes reshapes, a broadcasting Equal, a Cast and a
 * broadcasting Multiply; tfjs's own gradient everywhere else (other backends, innermost axes,
 * non-float32, without the heap kernels). Registered once, over tfjs-core's own.
 */
export const registerBlockMaxMinGradients = (tf: Tf): void => {
  if (!tf.getKernel(MAX_MIN_GRAD, "wasm")) tf.registerKernel({ kernelName: MAX_MIN_GRAD, backendName: "wasm", kernelFunc: maxMinGrad as never })
  type Tensor = import("@tensorflow/tfjs").Tensor
  for (const [name, axisAttr] of [["Max", "reductionIndices"], ["Min", "axis"]] as const) {
    wrapGradientOnHeap(tf, name, (dy, saved, attrs) => {
      const [x, y] = saved as [Tensor, Tensor]
      const axes = tf.util.parseAxisParam(attrs[axisAttr] as number | number[], x.shape)
      return asReducedBlock(x.shape, axes) ? { x: () => tf.engine().runKernel(MAX_MIN_GRAD, { dy, x, y }, { axes }) as Tensor } : undefined
    })
  }
}
