// Batch normalization while training, over every axis but the channels (the last), as one kernel
// forward and one backward. tfjs-layers' BatchNormalization computes the batch's moments (a mean, a
// squared difference, another mean), normalizes with batchNorm and differentiates through all of it:
// some 10 kernels forward and 25 backward per layer, each a pass over the activation and, on webgpu,
// a kernel the CPU records. Here, per channel c over the M = N·H·W rows, with μ and the population
// variance σ² (as tf.moments gives them), r = 1 / √(σ² + ε) and x̂ = (x − μ) · r:
//
//   y = x̂ · γ + β            (the kernel also returns μ and σ², for the moving averages)
//   dx = r · γ · (dy − Σdy / M − x̂ · (Σ(dy · x̂) / M)) + dμ / M + (dσ² · 2 / M) · (x − μ)
//   dγ = Σ dy · x̂            dβ = Σ dy
//
// (dμ and dσ² are zero unless the loss uses the batch statistics themselves.) Sums are float64 on
// wasm and cpu, float32 on webgpu; the element-wise passes float32 everywhere (on wasm and cpu with
// per-channel factors rounded to float32, below). The moving mean and variance are updated as tfjs-layers updates
// them, v − (v − batch)·(1 − momentum), as one kernel per statistic instead of three.
// BatchNormalization.call is replaced while training for layers over the last axis of a float32
// input, on a backend with the kernels (wasm, cpu, webgpu); inference, other axes and other
// backends keep tfjs-layers' own. A layer without offset or scale trains too (tfjs-layers' own
// cannot: it reads the missing weight). Installed once the engine's backend is up (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { columnSums, hostKernels, oneInput, patchLayerCall, registerFused, registerKernels, runWgsl, withTfjsCalls, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own). */
export const BATCH_NORM_TRAIN = "GradwireBatchNormTrain"
export const BATCH_NORM_TRAIN_GRAD = "GradwireBatchNormTrainGrad"
/** A moving statistic's update, v − (v − batch) · (1 − momentum), as one kernel (gradwire's own; not differentiated). */
export const MOVING_AVERAGE = "GradwireMovingAverage"

/** Per channel of x ([M, C]): the mean and the population variance. */
const moments = (x: Float32Array, C: number): { mean: Float64Array; variance: Float64Array } => {
  const M = x.length / C
  const mean = new Float64Array(C)
  const variance = new Float64Array(C)
  for (let i = 0; i < x.length; i += C) for (let c = 0; c < C; c++) mean[c] = mean[c]! + x[i + c]!
  for (let c = 0; c < C; c++) mean[c] = mean[c]! / M
  for (let i = 0; i < x.length; i += C) {
    for (let c = 0; c < C; c++) {
      const d = x[i + c]! - mean[c]!
      variance[c] = variance[c]! + d * d
    }
  }
  for (let c = 0; c < C; c++) variance[c] = variance[c]! / M
  return { mean, variance }
}

const f32 = Math.fround

/**
 * y ([M, C]), and the batch's mean and variance ([C]): the statistics summed in float64, y in
 * float32 arithmetic as ((x − μ) − μ')·s + β, μ the float64 mean rounded to float32 and μ' what
 * that rounding left (x − μ keeps its precision where the mean is large next to the spread), s =
 * γ / √(σ² + ε) rounded to float32, as the SIMD kernel computes it (heap-kernels.wat.mjs
 * bnTrainForward: the same bits).
 */
export const batchNormTrainForward = (x: Float32Array, gamma: Float32Array, beta: Float32Array, C: number, eps: number, y: Float32Array, meanOut: Float32Array, varianceOut: Float32Array): void => {
  const { mean, variance } = moments(x, C)
  const scale = new Float32Array(C)
  const rest = new Float32Array(C)
  for (let c = 0; c < C; c++) {
    scale[c] = gamma[c]! / Math.sqrt(variance[c]! + eps)
    meanOut[c] = mean[c]!
    rest[c] = mean[c]! - meanOut[c]!
    varianceOut[c] = variance[c]!
  }
  for (let i = 0; i < x.length; i += C) for (let c = 0; c < C; c++) y[i + c] = f32(f32(f32(x[i + c]! - meanOut[c]!) - rest[c]!) * scale[c]!) + beta[c]!
}

/**
 * dx ([M, C]), dγ and dβ ([C]) from dy, x, γ, the batch's mean and variance (the forward kernel's)
 * and the gradients reaching them: Σdy and Σdy·(x − μ) in float64 (each product a float32 one),
 * then dx = P·dy + Q·(x − μ) + R in float32 with per-channel P = r·γ, Q = 2·dσ²/M − P·r·(Σdy·x̂/M),
 * R = dμ/M − P·(Σdy/M) rounded to float32 (the formula above, its terms gathered per channel), as
 * the SIMD kernel computes it (bnTrainBackward: the same bits).
 */
export const batchNormTrainBackward = (
  dy: Float32Array,
  x: Float32Array,
  gamma: Float32Array,
  mean: Float32Array,
  variance: Float32Array,
  dmean: Float32Array,
  dvariance: Float32Array,
  C: number,
  eps: number,
  dx: Float32Array,
  dgamma: Float32Array,
  dbeta: Float32Array
): void => {
  const M = x.length / C
  const r = new Float64Array(C)
  for (let c = 0; c < C; c++) r[c] = 1 / Math.sqrt(variance[c]! + eps)
  const sumDy = new Float64Array(C)
  const sumDyXm = new Float64Array(C)
  for (let i = 0; i < x.length; i += C) {
    for (let c = 0; c < C; c++) {
      const d = dy[i + c]!
      sumDy[c] = sumDy[c]! + d
      sumDyXm[c] = sumDyXm[c]! + f32(d * f32(x[i + c]! - mean[c]!))
    }
  }
  // Per channel, the factors (the quotients by M taken once: a division per element cost the SIMD kernel half its time)
  const P = new Float32Array(C)
  const Q = new Float32Array(C)
  const R = new Float32Array(C)
  for (let c = 0; c < C; c++) {
    const sumDyXh = sumDyXm[c]! * r[c]!
    const ka = r[c]! * gamma[c]!
    P[c] = ka
    Q[c] = (dvariance[c]! * 2) / M - ka * r[c]! * (sumDyXh / M)
    R[c] = dmean[c]! / M - ka * (sumDy[c]! / M)
    dgamma[c] = sumDyXh
    dbeta[c] = sumDy[c]!
  }
  for (let i = 0; i < x.length; i += C) {
    for (let c = 0; c < C; c++) dx[i + c] = f32(f32(P[c]! * dy[i + c]!) + f32(Q[c]! * f32(x[i + c]! - mean[c]!))) + R[c]!
  }
}

const eps = (attrs: Record<string, unknown>): number => Number(attrs.epsilon)

/** x of any rank as [M, C]: the channels its last axis, every other axis a row (no reshape kernel needed). */
const rowsOf = (shape: readonly number[]): [number, number] => {
  const C = shape[shape.length - 1]!
  return [shape.reduce((a, b) => a * b, 1) / C, C]
}

// wasm and cpu: the functions above on the backend's arrays.
const hostForward = hostKernels({
  names: ["x", "gamma", "beta"],
  shapes: ({ x }) => [[...x!.shape], [rowsOf(x!.shape)[1]], [rowsOf(x!.shape)[1]]],
  compute: ([x, gamma, beta], [y, mean, variance], attrs, { x: xi }) => batchNormTrainForward(x!, gamma!, beta!, rowsOf(xi!.shape)[1], eps(attrs), y!, mean!, variance!),
  heap: (k, [x, gamma, beta], [y, mean, variance], attrs, { x: xi }, scratch) => {
    const [M, C] = rowsOf(xi!.shape)
    if (C % 4 !== 0) return false
    k.bnTrainForward(x!, gamma!, beta!, y!, mean!, variance!, M, C, eps(attrs), scratch)
    return true
  },
  scratch: ({ x }) => 8 * rowsOf(x!.shape)[1]
})
const hostBackward = hostKernels({
  names: ["dy", "x", "gamma", "mean", "variance", "dmean", "dvariance"],
  shapes: ({ x }) => [[...x!.shape], [rowsOf(x!.shape)[1]], [rowsOf(x!.shape)[1]]],
  compute: ([dy, x, gamma, mean, variance, dmean, dvariance], [dx, dg, db], attrs, { x: xi }) =>
    batchNormTrainBackward(dy!, x!, gamma!, mean!, variance!, dmean!, dvariance!, rowsOf(xi!.shape)[1], eps(attrs), dx!, dg!, db!),
  heap: (k, [dy, x, gamma, mean, variance, dmean, dvariance], [dx, dg, db], attrs, { x: xi }, scratch) => {
    const [M, C] = rowsOf(xi!.shape)
    if (C % 4 !== 0) return false
    k.bnTrainBackward(dy!, x!, gamma!, mean!, variance!, dmean!, dvariance!, dx!, dg!, db!, M, C, eps(attrs), scratch)
    return true
  },
  scratch: ({ x }) => 8 * rowsOf(x!.shape)[1]
})

// webgpu: a channel's sums in parallel over its rows (columnSums), the elementwise parts with one
// thread per element.
/** A program writing `shape` with one thread per element of it; `body` sees t, M (rows) and C (channels). */
const gpu = (backend: WebGpuBackend, attrs: Record<string, unknown>, name: string, names: string[], inputs: TensorInfo[], shape: number[], M: number, C: number, body: string): TensorInfo =>
  runWgsl(backend, {
    key: `gradwire_batchnorm_train_${name}`,
    names,
    inputs,
    outputShape: shape,
    threads: shape.reduce((a, b) => a * b, 1),
    uniforms: {
      fields: "eps : f32, rows : i32, channels : i32,",
      values: [
        { type: "float32", data: [eps(attrs)] },
        { type: "int32", data: [M] },
        { type: "int32", data: [C] }
      ]
    },
    code: `
  fn main(t : i32) {
    let M = uniforms.rows;
    let C = uniforms.channels;
    ${body}
  }`
  })
const webgpuForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { x, gamma, beta } = inputs as { x: TensorInfo; gamma: TensorInfo; beta: TensorInfo }
  const [M, C] = rowsOf(x.shape)
  const [mean] = columnSums(backend, { key: "batchnorm_mean", names: ["gx"], inputs: [x], rows: M, columns: C, terms: ["gx[i * C + c]"], scale: [1 / M] })
  const [variance] = columnSums(backend, {
    key: "batchnorm_variance",
    names: ["gx", "gm"],
    inputs: [x, mean!],
    rows: M,
    columns: C,
    prelude: "let m = gm[c];",
    terms: ["(gx[i * C + c] - m) * (gx[i * C + c] - m)"],
    scale: [1 / M]
  })
  const y = gpu(backend, attrs, "y", ["gx", "gm", "gv", "gg", "gb"], [x, mean!, variance!, gamma, beta], [...x.shape], M, C, `
    if (t < M * C) {
      let c = t % C;
      setOutputAtIndex(t, (gx[t] - gm[c]) * inverseSqrt(gv[c] + uniforms.eps) * gg[c] + gb[c]);
    }`)
  return [y, mean!, variance!]
}
const webgpuBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { dy, x, gamma, mean, variance, dmean, dvariance } = inputs as Record<string, TensorInfo>
  const [M, C] = rowsOf(x!.shape)
  const [dbeta, dgamma] = columnSums(backend, {
    key: "batchnorm_grad",
    names: ["gx", "gdy", "gm", "gv"],
    inputs: [x!, dy!, mean!, variance!],
    rows: M,
    columns: C,
    prelude: "let m = gm[c]; let r = inverseSqrt(gv[c] + uniforms.eps);",
    terms: ["gdy[i * C + c]", "gdy[i * C + c] * (gx[i * C + c] - m) * r"],
    uniforms: { fields: "eps : f32,", values: [{ type: "float32", data: [eps(attrs)] }] }
  }) as [TensorInfo, TensorInfo]
  // dx = A·dy + B·x + K per channel (A = r·γ, B = 2·dσ²/M − r²·γ·Σ(dy·x̂)/M, K = dμ/M − r·γ·Σdy/M − B·μ):
  // the coefficients first, so that no program binds more than WebGPU's 8 storage buffers.
  const coef = gpu(backend, attrs, "coef", ["gm", "gv", "gg", "gsb", "gsg", "gdm", "gdv"], [mean, variance, gamma!, dbeta, dgamma, dmean!, dvariance!], [3, C], M, C, `
    if (t < C) {
      let m = f32(M);
      let r = inverseSqrt(gv[t] + uniforms.eps);
      let a = r * gg[t];
      let b = 2.0 * gdv[t] / m - r * a * gsg[t] / m;
      setOutputAtIndex(t, a);
      setOutputAtIndex(C + t, b);
      setOutputAtIndex(2 * C + t, gdm[t] / m - a * gsb[t] / m - b * gm[t]);
    }`)
  const dx = gpu(backend, attrs, "dx", ["gx", "gdy", "gc"], [x!, dy!, coef], [...x!.shape], M, C, `
    if (t < M * C) {
      let c = t % C;
      setOutputAtIndex(t, gc[c] * gdy[t] + gc[C + c] * gx[t] + gc[2 * C + c]);
    }`)
  backend.disposeData(coef.dataId)
  return [dx, dgamma, dbeta]
}

// The moving statistics' update: tfjs-layers' three kernels (sub, mul, sub) per statistic and layer
// as one, with the same float32 roundings on wasm and cpu.
const movingAverage = (v: Float32Array, batch: Float32Array, keep: number, out: Float32Array): void => {
  for (let i = 0; i < v.length; i++) out[i] = Math.fround(v[i]! - Math.fround(Math.fround(v[i]! - batch[i]!) * keep))
}
const keepOf = (attrs: Record<string, unknown>): number => Math.fround(1 - Number(attrs.momentum))
const hostMoving = hostKernels({
  names: ["value", "batch"],
  shapes: ({ value }) => [[...value!.shape]],
  compute: ([v, batch], [out], attrs) => movingAverage(v!, batch!, keepOf(attrs), out!)
})
const webgpuMoving = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { value, batch } = inputs as { value: TensorInfo; batch: TensorInfo }
  const n = value.shape.reduce((a, b) => a * b, 1)
  return runWgsl(backend, {
    key: "gradwire_moving_average",
    names: ["gv", "gb"],
    inputs: [value, batch],
    outputShape: [...value.shape],
    threads: n,
    size: true,
    uniforms: { fields: "keep : f32,", values: [{ type: "float32", data: [keepOf(attrs)] }] },
    code: `
  fn main(t : i32) {
    if (t < uniforms.size) { setOutputAtIndex(t, gv[t] - (gv[t] - gb[t]) * uniforms.keep); }
  }`
  })
}
const MOVING: Record<string, unknown> = { wasm: hostMoving[0], cpu: hostMoving[1], webgpu: webgpuMoving }

const KERNELS: Record<string, readonly [unknown, unknown]> = {
  wasm: [hostForward[0], hostBackward[0]],
  cpu: [hostForward[1], hostBackward[1]],
  webgpu: [webgpuForward, webgpuBackward]
}

/** [y, the batch's mean, its variance] of x over every axis but the last; differentiable in x, gamma and beta. */
export const batchNormTrain = (tf: Tf, x: Tensor, gamma: Tensor, beta: Tensor, epsilon: number): [Tensor, Tensor, Tensor] =>
  // x as it is: the kernels read any rank as [M, C] (rowsOf), where a reshape each way, and two
  // more in the gradient, had cost four kernels of tfjs's bookkeeping per layer and step
  tf.engine().runKernel(BATCH_NORM_TRAIN, { x, gamma, beta }, { epsilon }) as unknown as [Tensor, Tensor, Tensor]

interface Weight {
  read(): Tensor
  write(t: Tensor): void
}
interface BatchNormLike {
  axis: number
  epsilon: number
  momentum: number
  center: boolean
  scale: boolean
  gamma: Weight | null
  beta: Weight | null
  movingMean: Weight
  movingVariance: Weight
}

let installed = false

/** Registers the kernels and their gradient, and makes tfjs-layers' BatchNormalization use them while training where it can. */
export const installBatchNormTrain = (tf: Tf): boolean => {
  if (installed) return true
  registerKernels(tf, MOVING_AVERAGE, MOVING)
  registerFused(tf, BATCH_NORM_TRAIN, BATCH_NORM_TRAIN_GRAD, KERNELS, {
    inputsToSave: ["x", "gamma"],
    // The batch's mean and variance as the forward kernel computed them, not computed again.
    outputsToSave: [false, true, true],
    gradFunc: (dys, saved, attrs) => {
      const [dy, dmean, dvariance] = dys as Tensor[]
      const [x, gamma, mean, variance] = saved as [Tensor, Tensor, Tensor, Tensor]
      const [dx, dgamma, dbeta] = tf.engine().runKernel(BATCH_NORM_TRAIN_GRAD, { dy: dy!, x, gamma, mean, variance, dmean: dmean!, dvariance: dvariance! }, attrs as never) as unknown as [
        Tensor,
        Tensor,
        Tensor
      ]
      return { x: () => dx, gamma: () => dgamma, beta: () => dbeta }
    }
  })
  installed = patchLayerCall<BatchNormLike>(tf, "BatchNormalization", (own) =>
    function (inputs, kwargs) {
      const x = oneInput(inputs)
      const fits =
        kwargs?.training === true &&
        x !== undefined &&
        x.rank >= 2 &&
        x.dtype === "float32" &&
        (this.axis === -1 || this.axis === x.rank - 1) &&
        tf.getKernel(BATCH_NORM_TRAIN, tf.getBackend()) !== undefined
      if (!fits) return own.call(this, inputs, kwargs)
      return tf.tidy(() => {
        const C = x.shape[x.rank - 1]!
        const gamma = this.scale && this.gamma ? this.gamma.read() : tf.ones([C])
        const beta = this.center && this.beta ? this.beta.read() : tf.zeros([C])
        const [y, mean, variance] = batchNormTrain(tf, x, gamma, beta, this.epsilon)
        // tfjs-layers' moving averages, as it computes them: v − (v − batch) · (1 − momentum), one kernel each.
        for (const [moving, batch] of [
          [this.movingMean, mean],
          [this.movingVariance, variance]
        ] as const) {
          tf.tidy(() => {
            const value = moving.read()
            // (registered for the same backends as the batch kernels this path requires)
            moving.write(tf.engine().runKernel(MOVING_AVERAGE, { value, batch }, { momentum: this.momentum }) as unknown as Tensor)
          })
        }
        return y
      })
    }
  )
  return installed
}

/** Runs `f` with tfjs-layers' own BatchNormalization.call (for tests and benchmarks that compare the two). */
export const withTfjsBatchNorm = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["BatchNormalization"], f)
