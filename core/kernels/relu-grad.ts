// ReLU's and clipByValue's gradients on wasm as one kernel each. tfjs-core computes ReLU's as
// dy · cast(step(x)): three kernels and two temporaries of the activation's size, which took 116 µs for a residual CNN's
// [32, 8, 8, 16] activation on wasm (Step alone 55 µs); gradwire's SIMD kernel on the heap does
// the same arithmetic in one pass, the same bits (NaN where x is NaN, ±0 or NaN where x ≤ 0 as
// dy · 0 gives). On webgpu the same as one program (below). Other backends, dtypes, and wasm without
// the heap kernels keep tfjs's gradient.
//
// clipByValue (a ReLU layer with maxValue, MobileNet's ReLU6) takes tfjs-core's gradient as
// where(logicalAnd(x ≥ min, x ≤ max), dy, zerosLike(dy)): five kernels and four temporaries, which
// took 17 of a MobileNet-style step's 52 ms on wasm ([32, 8, 8, 128]: LogicalAnd 1.2 ms, Select
// 0.5, each comparison 0.3); the heap kernel clipGrad does it in one pass, the same bits (dy's own,
// or +0; +0 where x is NaN).
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels, wrapGradientOnHeap } from "./heap-simd.ts"
import { runWgsl, type WebGpuArgs } from "./fused-layers.ts"
import { wrapGradient } from "./gradients.ts"
import type { KernelArgs, TensorInfo } from "./wasm-heap.ts"

/** The kernel's name in tfjs's registry. */
export const RELU_GRAD = "GradwireReluGrad"

/** Kernels run in this process (for tests). */
export const reluGradStats = { calls: 0 }

const reluGradKernel = ({ inputs, backend }: KernelArgs): TensorInfo => {
  const { dy, x } = inputs
  const out = backend.makeOutput([...x.shape], "float32")
  reluGradStats.calls++
  heapKernels(backend)!.reluGrad(addressOf(backend, dy), addressOf(backend, x), addressOf(backend, out), x.shape.reduce((a, b) => a * b, 1))
  return out
}

/** The clip gradient kernel's name in tfjs's registry. */
export const CLIP_GRAD = "GradwireClipGrad"

/** Clip gradient kernels run in this process (for tests). */
export const clipGradStats = { calls: 0 }

const clipGradKernel = ({ inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { dy, x } = inputs
  const out = backend.makeOutput([...x.shape], "float32")
  clipGradStats.calls++
  heapKernels(backend)!.clipGrad(addressOf(backend, dy), addressOf(backend, x), addressOf(backend, out), x.shape.reduce((a, b) => a * b, 1), attrs.lo as number, attrs.hi as number)
  return out
}

type Tensor = import("@tensorflow/tfjs").Tensor

/** ReLU's gradient by RELU_GRAD where dy has x's shape; undefined (the wrapped gradient) otherwise. */
const reluGradient = (tf: Tf, dy: Tensor, x: Tensor): Record<string, () => Tensor> | undefined =>
  dy.shape.length === x.shape.length && dy.shape.every((d, i) => d === x.shape[i]) ? { x: () => tf.engine().runKernel(RELU_GRAD, { dy, x }, {}) as Tensor } : undefined

/** Registers the wasm kernel and wraps tfjs's Relu gradient so that wasm runs it (once per process). */
export const registerReluGrad = (tf: Tf): boolean => {
  if (!tf.getKernel(RELU_GRAD, "wasm")) tf.registerKernel({ kernelName: RELU_GRAD, backendName: "wasm", kernelFunc: reluGradKernel as never })
  return wrapGradientOnHeap(tf, "Relu", (dy, saved) => reluGradient(tf, dy, saved[0]!))
}

/** Registers the clip gradient's wasm kernel and wraps tfjs's ClipByValue gradient so that wasm runs it (once per process). */
export const registerClipGrad = (tf: Tf): boolean => {
  if (!tf.getKernel(CLIP_GRAD, "wasm")) tf.registerKernel({ kernelName: CLIP_GRAD, backendName: "wasm", kernelFunc: clipGradKernel as never })
  return wrapGradientOnHeap(tf, "ClipByValue", (dy, saved, attrs) => {
    const x = saved[0]!
    const { clipValueMin: lo, clipValueMax: hi } = attrs as { clipValueMin: number; clipValueMax: number }
    // tfjs compares x with the bounds as float32 scalars: the kernel takes them as f32 too
    return dy.shape.length === x.shape.length && dy.shape.every((d, i) => d === x.shape[i]) ? { x: () => tf.engine().runKernel(CLIP_GRAD, { dy, x }, { lo, hi } as never) as Tensor } : undefined
  })
}

// webgpu: the same gradient as one program (tfjs records Step and Multiply, two programs the CPU
// records at 30-40 µs apiece on an H200's host): dy · step(x), NaN where x is NaN, as tfjs's Step.
const webgpuReluGrad = ({ inputs, backend }: WebGpuArgs): TensorInfo => {
  const { dy, x } = inputs as { dy: TensorInfo; x: TensorInfo }
  const n = x.shape.reduce((a, b) => a * b, 1)
  return runWgsl(backend, {
    key: "gradwire_relu_grad",
    names: ["gdy", "gx"],
    inputs: [dy, x],
    outputShape: [...x.shape],
    threads: n,
    size: true,
    code: `
  fn main(t : i32) {
    if (t < uniforms.size) {
      let v = gx[t];
      setOutputAtIndex(t, gdy[t] * select(select(0.0, 1.0, v > 0.0), v, isnan(v)));
    }
  }`
  })
}
const WEBGPU_WRAPPED = Symbol.for("gradwire.reluGradWebGpu")

/** Registers the webgpu kernel and wraps Relu's gradient (whichever is registered) so that webgpu runs it; true once installed. */
export const installReluGradWebGpu = (tf: Tf): boolean => {
  if (!tf.getKernel(RELU_GRAD, "webgpu")) tf.registerKernel({ kernelName: RELU_GRAD, backendName: "webgpu", kernelFunc: webgpuReluGrad as never })
  return wrapGradient(tf, "Relu", WEBGPU_WRAPPED, (dy, saved) => {
    const x = saved[0]!
    return tf.getBackend() === "webgpu" && dy.dtype === "float32" && x.dtype === "float32" ? reluGradient(tf, dy, x) : undefined
  })
}
