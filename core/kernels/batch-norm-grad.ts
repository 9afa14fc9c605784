// Batch normalization's backward pass on wasm as one kernel: tfjs-core 4.22 composes the gradient of
// FusedBatchNorm from about fifteen kernels per layer (x − mean, dy · scale, rsqrt, a tile of it,
// four products over the whole activation and four sums over its leading axes), each a pass over
// the activation and a trip through the engine. Here one pass over x and dy sums dy and
// dy · (x − mean) per channel, and a second writes dx = dy · r · scale, with r = 1 / √(variance + ε):
//
//   d mean = −r · scale · Σ dy      d variance = −½ · r³ · scale · Σ dy · (x − mean)
//   d scale = r · Σ dy · (x − mean)  d offset = Σ dy
//
// (sums over every axis but the last; the same formulas as tfjs's, in another order of float32
// operations, with the channel sums kept in float64). The gradient is registered for every backend
// and hands any other backend, and shapes it does not cover (statistics not one per channel of the
// last axis, non-float32), to tfjs's own.
import type { Tf } from "../tf.ts"
import { floats, type KernelArgs, type TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernel's name in tfjs's registry (gradwire's own: no tfjs kernel has it). */
export const BATCH_NORM_GRAD = "GradwireBatchNormGrad"

/** [dx, dmean, dvariance, dscale, doffset] from x, dy, mean, variance and scale (when there is one). */
export const batchNormGrad = ({ inputs, backend, attrs }: KernelArgs): TensorInfo[] => {
  const { x, dy, mean, variance, scale } = inputs as Record<string, TensorInfo> & { scale?: TensorInfo }
  const C = mean.shape[0]!
  const xs = floats(backend, x)
  const dys = floats(backend, dy)
  const m = floats(backend, mean)
  const v = floats(backend, variance)
  const s = scale ? floats(backend, scale) : undefined
  const eps = Number(attrs.varianceEpsilon)
  const sumDy = new Float64Array(C)
  const sumDyXm = new Float64Array(C)
  const n = xs.length
  for (let i = 0; i < n; i += C) {
    for (let c = 0; c < C; c++) {
      const g = dys[i + c]!
      sumDy[c] = sumDy[c]! + g
      sumDyXm[c] = sumDyXm[c]! + g * (xs[i + c]! - m[c]!)
    }
  }
  const r = new Float32Array(C)
  const gain = new Float32Array(C)
  for (let c = 0; c < C; c++) {
    r[c] = 1 / Math.sqrt(v[c]! + eps)
    gain[c] = r[c]! * (s ? s[c]! : 1)
  }
  const dx = backend.makeOutput([...x.shape], "float32")
  const dxs = floats(backend, dx)
  for (let i = 0; i < n; i += C) for (let c = 0; c < C; c++) dxs[i + c] = dys[i + c]! * gain[c]!
  const perChannel = (f: (c: number) => number): TensorInfo => {
    const out = backend.makeOutput([C], "float32")
    const o = floats(backend, out)
    for (let c = 0; c < C; c++) o[c] = f(c)
    return out
  }
  return [
    dx,
    perChannel((c) => -gain[c]! * sumDy[c]!),
    perChannel((c) => -0.5 * r[c]! * r[c]! * gain[c]! * sumDyXm[c]!),
    perChannel((c) => r[c]! * sumDyXm[c]!),
    perChannel((c) => sumDy[c]!)
  ]
}

let registered = false

/**
 * Registers the kernel for wasm and FusedBatchNorm's gradient (wasm through the kernel, everything
 * else through tfjs's own gradient). Returns whether it did (false when tfjs has no such gradient).
 */
export const registerBatchNormGrad = (tf: Tf): boolean => {
  if (registered) return true
  const original = tf.getGradient("FusedBatchNorm")
  if (!original) return false
  if (!tf.getKernel(BATCH_NORM_GRAD, "wasm")) tf.registerKernel({ kernelName: BATCH_NORM_GRAD, backendName: "wasm", kernelFunc: batchNormGrad as never })
  tf.unregisterGradient("FusedBatchNorm")
  tf.registerGradient({
    kernelName: "FusedBatchNorm",
    inputsToSave: ["x", "mean", "variance", "scale"],
    gradFunc: (dy, saved, attrs) => {
      const [x, mean, variance, scale] = saved as [Tensor, Tensor, Tensor, Tensor | undefined]
      const dyT = dy as Tensor
      const fits =
        tf.getBackend() === "wasm" &&
        x.rank >= 1 &&
        mean.rank === 1 &&
        variance.rank === 1 &&
        mean.shape[0] === x.shape[x.rank - 1] &&
        variance.shape[0] === mean.shape[0] &&
        (scale === undefined || scale === null || (scale.rank === 1 && scale.shape[0] === mean.shape[0])) &&
        [x, mean, variance, dyT, ...(scale ? [scale] : [])].every((t) => t.dtype === "float32")
      if (!fits) return original.gradFunc(dy, saved, attrs)
      const [dx, dmean, dvariance, dscale, doffset] = tf.engine().runKernel(
        BATCH_NORM_GRAD,
        { x, dy: dyT, mean, variance, ...(scale ? { scale } : {}) },
        { varianceEpsilon: (attrs as { varianceEpsilon: number }).varianceEpsilon }
      ) as Tensor[]
      return { x: () => dx!, mean: () => dmean!, variance: () => dvariance!, scale: () => dscale!, offset: () => doffset! }
    }
  })
  registered = true
  return true
}
