// Layer normalization over the last axis as one kernel, and its gradient as one more. tfjs-layers'
// LayerNormalization computes moments (mean, squared difference, mean), tiles the statistics and
// the scale and offset to the input's whole shape and calls batchNorm with them; its backward pass
// runs through all of that again: some 15 kernels forward and 40 backward per layer, over tensors
// the input's size. Here, for each row x (the last axis, D values) with mean μ and population
// variance σ² (as tf.moments gives them), r = 1 / √(σ² + ε) and x̂ = (x − μ) · r:
//
//   y = x̂ · γ + β                                      (γ = 1, β = 0 when the layer has none)
//   dx = r · (g − mean(g) − x̂ · mean(g · x̂)),  g = dy · γ
//   dγ = Σ_rows dy · x̂      dβ = Σ_rows dy
//
// The row statistics and sums are kept in float64 on wasm and cpu (float32 on webgpu), so results
// differ from tfjs's own in the last bits. LayerNormalization.call is replaced for layers
// normalizing over the last axis alone of a float32 input, on a backend that has the kernels (wasm,
// cpu, webgpu); other layers and backends keep tfjs-layers' own. Installed once the engine's
// backend is up (`../engine.ts`).
import type { Tf } from "../tf.ts"
import { columnSums, hostKernels, oneInput, patchLayerCall, registerFused, runWgsl, withTfjsCalls, type WebGpuArgs, type WebGpuBackend } from "./fused-layers.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own). */
export const LAYER_NORM = "GradwireLayerNorm"
export const LAYER_NORM_GRAD = "GradwireLayerNormGrad"

/** The mean of x[o, o + D). */
const rowMean = (x: Float32Array, o: number, D: number): number => {
  let sum = 0
  for (let j = 0; j < D; j++) sum += x[o + j]!
  return sum / D
}
/** 1 / √(σ² + ε) of x[o, o + D) about its mean, σ² the population variance. */
const rowR = (x: Float32Array, o: number, D: number, mean: number, eps: number): number => {
  let sq = 0
  for (let j = 0; j < D; j++) {
    const d = x[o + j]! - mean
    sq += d * d
  }
  return 1 / Math.sqrt(sq / D + eps)
}

/** y from x ([N, D]), the scale and offset ([D]) and ε. */
export const layerNormForward = (x: Float32Array, gamma: Float32Array, beta: Float32Array, D: number, eps: number, y: Float32Array): void => {
  const N = x.length / D
  for (let n = 0; n < N; n++) {
    const o = n * D
    const mean = rowMean(x, o, D)
    const r = rowR(x, o, D, mean, eps)
    for (let j = 0; j < D; j++) {
      const xh = (x[o + j]! - mean) * r
      y[o + j] = xh * gamma[j]! + beta[j]!
    }
  }
}

/** dx ([N, D]), dγ and dβ ([D]) from dy, x and the scale. */
export const layerNormBackward = (
  dy: Float32Array,
  x: Float32Array,
  gamma: Float32Array,
  D: number,
  eps: number,
  dx: Float32Array,
  dgamma: Float32Array,
  dbeta: Float32Array
): void => {
  const N = x.length / D
  const sg = new Float64Array(D)
  const sb = new Float64Array(D)
  for (let n = 0; n < N; n++) {
    const o = n * D
    const mean = rowMean(x, o, D)
    const r = rowR(x, o, D, mean, eps)
    let meanG = 0
    let meanGx = 0
    for (let j = 0; j < D; j++) {
      const xh = (x[o + j]! - mean) * r
      const d = dy[o + j]!
      const g = d * gamma[j]!
      meanG += g
      meanGx += g * xh
      sg[j] = sg[j]! + d * xh
      sb[j] = sb[j]! + d
    }
    meanG /= D
    meanGx /= D
    for (let j = 0; j < D; j++) {
      const xh = (x[o + j]! - mean) * r
      const g = dy[o + j]! * gamma[j]!
      dx[o + j] = r * (g - meanG - xh * meanGx)
    }
  }
  for (let j = 0; j < D; j++) {
    dgamma[j] = sg[j]!
    dbeta[j] = sb[j]!
  }
}

const eps = (attrs: Record<string, unknown>): number => Number(attrs.epsilon)

// wasm and cpu: the functions above on the backend's arrays.
const hostForward = hostKernels({
  names: ["x", "gamma", "beta"],
  shapes: ({ x }) => [[...x!.shape]],
  compute: ([x, gamma, beta], [y], attrs, { x: xi }) => layerNormForward(x!, gamma!, beta!, xi!.shape[1]!, eps(attrs), y!),
  heap: (k, [x, gamma, beta], [y], attrs, { x: xi }) => {
    const [N, D] = xi!.shape as [number, number]
    if (D % 4 !== 0) return false
    k.lnForward(x!, gamma!, beta!, y!, N, D, eps(attrs))
    return true
  }
})
const hostBackward = hostKernels({
  names: ["dy", "x", "gamma"],
  shapes: ({ x }) => [[...x!.shape], [x!.shape[1]!], [x!.shape[1]!]],
  compute: ([dy, x, gamma], [dx, dg, db], attrs, { x: xi }) => layerNormBackward(dy!, x!, gamma!, xi!.shape[1]!, eps(attrs), dx!, dg!, db!),
  heap: (k, [dy, x, gamma], [dx, dg, db], attrs, { x: xi }) => {
    const [N, D] = xi!.shape as [number, number]
    if (D % 4 !== 0) return false
    k.lnBackward(dy!, x!, gamma!, dx!, dg!, db!, N, D, eps(attrs))
    return true
  }
})

// webgpu: a row's statistics (mean, r) once per row, then y with one thread per element, dx with one
// thread per row (D is the layer's width: tens to a few thousand), and dγ and dβ summed down the
// rows in parallel (columnSums).
/** A program writing `shape`, one thread for each of `threads`; `body` sees t, and N and D from the first input's shape ([N, D]). */
const run = (backend: WebGpuBackend, attrs: Record<string, unknown>, name: string, names: string[], inputs: TensorInfo[], shape: number[], threads: number, body: string): TensorInfo =>
  runWgsl(backend, {
    key: `gradwire_layernorm_${name}`,
    names,
    inputs,
    outputShape: shape,
    threads,
    uniforms: { fields: "eps : f32,", values: [{ type: "float32", data: [eps(attrs)] }] },
    code: `
  fn main(t : i32) {
    let N = uniforms.${names[0]}Shape[0];
    let D = uniforms.${names[0]}Shape[1];
    ${body}
  }`
  })
/** [N, 2]: each row's mean and r. */
const rowStats = (backend: WebGpuBackend, attrs: Record<string, unknown>, x: TensorInfo): TensorInfo =>
  run(backend, attrs, "stats", ["gx"], [x], [x.shape[0]!, 2], x.shape[0]!, `
    let row = t;
    if (row < N) {
      var s = 0.0;
      for (var j = 0; j < D; j++) { s += gx[row * D + j]; }
      let mean = s / f32(D);
      var q = 0.0;
      for (var j = 0; j < D; j++) { let d = gx[row * D + j] - mean; q += d * d; }
      setOutputAtIndex(row * 2, mean);
      setOutputAtIndex(row * 2 + 1, inverseSqrt(q / f32(D) + uniforms.eps));
    }`)
const webgpuForward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo => {
  const { x, gamma, beta } = inputs as { x: TensorInfo; gamma: TensorInfo; beta: TensorInfo }
  const stats = rowStats(backend, attrs, x)
  try {
    return run(backend, attrs, "y", ["gx", "gs", "gg", "gb"], [x, stats, gamma, beta], [...x.shape], x.shape[0]! * x.shape[1]!, `
    if (t < N * D) {
      let row = t / D;
      let j = t % D;
      setOutputAtIndex(t, (gx[t] - gs[row * 2]) * gs[row * 2 + 1] * gg[j] + gb[j]);
    }`)
  } finally {
    backend.disposeData(stats.dataId)
  }
}
const webgpuBackward = ({ inputs, backend, attrs }: WebGpuArgs): TensorInfo[] => {
  const { dy, x, gamma } = inputs as { dy: TensorInfo; x: TensorInfo; gamma: TensorInfo }
  const D = x.shape[1]!
  const stats = rowStats(backend, attrs, x)
  const names = ["gx", "gs", "gdy", "gg"]
  const ins = [x, stats, dy, gamma]
  try {
    const dx = run(backend, attrs, "dx", names, ins, [...x.shape], x.shape[0]!, `
    let row = t;
    if (row < N) {
      let mean = gs[row * 2];
      let r = gs[row * 2 + 1];
      var mg = 0.0;
      var mgx = 0.0;
      for (var j = 0; j < D; j++) { let g = gdy[row * D + j] * gg[j]; mg += g; mgx += g * (gx[row * D + j] - mean) * r; }
      mg = mg / f32(D);
      mgx = mgx / f32(D);
      for (var j = 0; j < D; j++) {
        let g = gdy[row * D + j] * gg[j];
        setOutputAtIndex(row * D + j, r * (g - mg - (gx[row * D + j] - mean) * r * mgx));
      }
    }`)
    // dγ and dβ: sums down the rows, in parallel (columnSums).
    const [dgamma, dbeta] = columnSums(backend, {
      key: "layernorm_grad",
      names: ["gx", "gs", "gdy"],
      inputs: [x, stats, dy],
      rows: x.shape[0]!,
      columns: D,
      terms: ["gdy[i * C + c] * (gx[i * C + c] - gs[i * 2]) * gs[i * 2 + 1]", "gdy[i * C + c]"]
    }) as [TensorInfo, TensorInfo]
    return [dx, dgamma, dbeta]
  } finally {
    backend.disposeData(stats.dataId)
  }
}

const KERNELS: Record<string, readonly [unknown, unknown]> = {
  wasm: [hostForward[0], hostBackward[0]],
  cpu: [hostForward[1], hostBackward[1]],
  webgpu: [webgpuForward, webgpuBackward]
}

/** Layer normalization of x over its last axis; differentiable in x, gamma and beta. */
export const layerNorm = (tf: Tf, x: Tensor, gamma: Tensor | null, beta: Tensor | null, epsilon: number): Tensor => {
  const D = x.shape[x.rank - 1]!
  const rows = tf.reshape(x, [x.size / D, D])
  // Always both (ones and zeros for a layer without them): tfjs cannot save an absent input for the gradient.
  const y = tf.engine().runKernel(LAYER_NORM, { x: rows, gamma: gamma ?? tf.ones([D]), beta: beta ?? tf.zeros([D]) }, { epsilon }) as unknown as Tensor
  return tf.reshape(y, x.shape)
}

interface LayerNormLike {
  axis: number[] | number
  epsilon: number
  center: boolean
  scale: boolean
  gamma: { read(): Tensor } | null
  beta: { read(): Tensor } | null
}

let installed = false

/** Registers the kernels and their gradient, and makes tfjs-layers' LayerNormalization use them where it can. */
export const installLayerNorm = (tf: Tf): boolean => {
  if (installed) return true
  registerFused(tf, LAYER_NORM, LAYER_NORM_GRAD, KERNELS, {
    inputsToSave: ["x", "gamma"],
    gradFunc: (dy, saved, attrs) => {
      const [x, gamma] = saved as [Tensor, Tensor]
      const [dx, dgamma, dbeta] = tf.engine().runKernel(LAYER_NORM_GRAD, { dy: dy as Tensor, x, gamma }, attrs as never) as unknown as [Tensor, Tensor, Tensor]
      return { x: () => dx, gamma: () => dgamma, beta: () => dbeta }
    }
  })
  installed = patchLayerCall<LayerNormLike>(tf, "LayerNormalization", (own) =>
    function (inputs, kwargs) {
      const x = oneInput(inputs)
      const axes = typeof this.axis === "number" ? [this.axis] : this.axis
      const fits =
        x !== undefined &&
        x.rank >= 2 &&
        x.dtype === "float32" &&
        axes.length === 1 &&
        (axes[0] === x.rank - 1 || axes[0] === -1) &&
        (!this.scale || this.gamma !== null) &&
        (!this.center || this.beta !== null) &&
        tf.getKernel(LAYER_NORM, tf.getBackend()) !== undefined
      if (!fits) return own.call(this, inputs, kwargs)
      return tf.tidy(() => layerNorm(tf, x, this.scale ? this.gamma!.read() : null, this.center ? this.beta!.read() : null, this.epsilon))
    }
  )
  return installed
}

/** Runs `f` with tfjs-layers' own LayerNormalization.call (for tests and benchmarks that compare the two). */
export const withTfjsLayerNorm = <T>(tf: Tf, f: () => T): T => withTfjsCalls(tf, ["LayerNormalization"], f)
