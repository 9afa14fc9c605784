// Softmax cross-entropy on logits and class ids (PyTorch's `F.cross_entropy(logits, target)`) as one
// kernel, and its gradient as one more. tfjs's `tf.losses.softmaxCrossEntropy` needs one-hot labels
// (a oneHot kernel) and composes the log-softmax, the product with the labels, the sums and the mean
// from some 12 kernels forward and 6 backward. On webgpu each is a program the CPU records (30-40 µs
// apiece on an H200's host, where a batch-32 step is bound by that recording): the zoo MLP's step
// recorded 33 programs before its optimizer, 18 of them the loss. For logits z (N rows of C
// classes), ids y and the incoming gradient g of the mean:
//
//   loss = (1/N) Σ_rows (logsumexp(z_row) − z_row[y_row])
//   dz   = (g/N) · (softmax(z_row) − onehot(y_row))
//
// A row's maximum is subtracted before the exponentials (no overflow); the host side adds in
// float64. An id outside [0, C) contributes logsumexp alone to the loss and no −1 to the gradient,
// as tfjs's one-hot of such an id (all zeros) does.
import type { Tf } from "../tf.ts"
import { columnSums, hostKernels, registerFused, runWgsl, type WebGpuArgs } from "./fused-layers.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar

/** The kernels' names in tfjs's registry (gradwire's own). */
export const CROSS_ENTROPY = "GradwireSoftmaxCrossEntropy"
export const CROSS_ENTROPY_GRAD = "GradwireSoftmaxCrossEntropyGrad"

/** Row r's maximum and Σ exp(z − max), in float64. */
const rowStats = (z: Float32Array, o: number, C: number): [number, number] => {
  let max = -Infinity
  for (let j = 0; j < C; j++) max = Math.max(max, z[o + j]!)
  let sum = 0
  for (let j = 0; j < C; j++) sum += Math.exp(z[o + j]! - max)
  return [max, sum]
}

// wasm and cpu: loops on the backend's arrays (ids arrive as float32 values: exact below 2^24).
const hostForward = hostKernels({
  names: ["logits", "labels"],
  shapes: () => [[]],
  compute: ([z, y], [loss], _attrs, { logits }) => {
    const [N, C] = logits!.shape as [number, number]
    let total = 0
    for (let r = 0; r < N; r++) {
      const [max, sum] = rowStats(z!, r * C, C)
      const id = y![r]!
      total += max + Math.log(sum) - (id >= 0 && id < C ? z![r * C + id]! : 0)
    }
    loss![0] = total / N
  }
})
const hostBackward = hostKernels({
  names: ["logits", "labels", "dy"],
  shapes: ({ logits }) => [[...logits!.shape]],
  compute: ([z, y, dy], [dz], _attrs, { logits }) => {
    const [N, C] = logits!.shape as [number, number]
    const g = dy![0]! / N
    for (let r = 0; r < N; r++) {
      const o = r * C
      const [max, sum] = rowStats(z!, o, C)
      for (let j = 0; j < C; j++) dz![o + j] = (g * Math.exp(z![o + j]! - max)) / sum
      const id = y![r]!
      if (id >= 0 && id < C) dz![o + id] = dz![o + id]! - g
    }
  }
})

// webgpu: the loss as a column sum of the rows' losses (one program for up to 65,536 rows), the
// gradient with one thread per row (three passes over its C classes).
/** The row of C logits at gz[o]: its maximum and Σ exp(z − max) (rowStats's WGSL twin). */
const ROW_STATS = `
fn gwRowStats(o : i32, C : i32) -> vec2<f32> {
  var m = gz[o];
  for (var j = 1; j < C; j++) { m = max(m, gz[o + j]); }
  var s = 0.0;
  for (var j = 0; j < C; j++) { s += exp(gz[o + j] - m); }
  return vec2<f32>(m, s);
}`
const ROW_LOSS = `${ROW_STATS}
fn gwCrossEntropyRow(r : i32) -> f32 {
  let C = uniforms.classes;
  let o = r * C;
  let stats = gwRowStats(o, C);
  let id = gy[r];
  let picked = select(0.0, gz[o + clamp(id, 0, C - 1)], id >= 0 && id < C);
  return stats.x + log(stats.y) - picked;
}`
const webgpuForward = ({ inputs, backend }: WebGpuArgs): TensorInfo => {
  const { logits, labels } = inputs as { logits: TensorInfo; labels: TensorInfo }
  const [N, C] = logits.shape as [number, number]
  return columnSums(backend, {
    key: "cross_entropy",
    names: ["gz", "gy"],
    inputs: [logits, labels],
    rows: N,
    columns: 1,
    functions: ROW_LOSS,
    terms: ["gwCrossEntropyRow(i)"],
    scale: [1 / N],
    shape: [],
    uniforms: { fields: "classes : i32,", values: [{ type: "int32", data: [C] }] }
  })[0]!
}
const webgpuBackward = ({ inputs, backend }: WebGpuArgs): TensorInfo => {
  const { logits, labels, dy } = inputs as { logits: TensorInfo; labels: TensorInfo; dy: TensorInfo }
  const [N, C] = logits.shape as [number, number]
  return runWgsl(backend, {
    key: "gradwire_cross_entropy_grad",
    names: ["gz", "gy", "gdy"],
    inputs: [logits, labels, dy],
    outputShape: [N, C],
    threads: N,
    uniforms: { fields: "rows : i32, classes : i32,", values: [{ type: "int32", data: [N] }, { type: "int32", data: [C] }] },
    code: `${ROW_STATS}
  fn main(t : i32) {
    let C = uniforms.classes;
    if (t < uniforms.rows) {
      let o = t * C;
      let stats = gwRowStats(o, C);
      let g = gdy[0] / f32(uniforms.rows);
      let id = gy[t];
      for (var j = 0; j < C; j++) {
        setOutputAtIndex(o + j, g * exp(gz[o + j] - stats.x) / stats.y - select(0.0, g, j == id));
      }
    }
  }`
  })
}

const KERNELS: Record<string, readonly [unknown, unknown]> = {
  wasm: [hostForward[0], hostBackward[0]],
  cpu: [hostForward[1], hostBackward[1]],
  webgpu: [webgpuForward, webgpuBackward]
}

let installed = false

/** Registers the kernels and the gradient (once per process). */
export const installCrossEntropy = (tf: Tf): void => {
  if (installed) return
  installed = true
  registerFused(tf, CROSS_ENTROPY, CROSS_ENTROPY_GRAD, KERNELS, {
    inputsToSave: ["logits", "labels"],
    gradFunc: (dy, saved) => {
      const [logits, labels] = saved as [Tensor, Tensor]
      return {
        logits: () => tf.engine().runKernel(CROSS_ENTROPY_GRAD, { logits, labels, dy: dy as Tensor }, {}) as unknown as Tensor,
        labels: () => tf.zerosLike(labels)
      }
    }
  })
}

/**
 * The mean softmax cross-entropy of `logits` ([..., C]) against class ids `labels` (the leading
 * shape, any dtype holding integers), as PyTorch's `F.cross_entropy(logits, target)`: one kernel
 * and one for its gradient on wasm, cpu and webgpu (about 18 fewer than `tf.losses.softmaxCrossEntropy`
 * on one-hot labels); on another backend (tfjs-node) `tf.losses.softmaxCrossEntropy` computes it.
 * Differentiable in `logits`.
 */
export const crossEntropy = (tf: Tf, logits: Tensor, labels: Tensor): Scalar => {
  const C = logits.shape[logits.rank - 1]!
  const N = logits.size / C
  if (labels.size !== N)
    throw new RangeError(`crossEntropy: ${N} rows of logits (shape [${logits.shape}]) but ${labels.size} labels (shape [${labels.shape}]); give one class id per row`)
  if (logits.dtype !== "float32") throw new TypeError(`crossEntropy: logits must be float32, got ${logits.dtype}`)
  installCrossEntropy(tf)
  return tf.tidy(() => {
    const ids = tf.reshape(labels.dtype === "int32" ? labels : tf.cast(labels, "int32"), [N])
    const rows = tf.reshape(logits, [N, C])
    if (!tf.getKernel(CROSS_ENTROPY, tf.getBackend())) return tf.losses.softmaxCrossEntropy(tf.oneHot(ids, C), rows) as Scalar
    return tf.engine().runKernel(CROSS_ENTROPY, { logits: rows, labels: ids }, {}) as unknown as Scalar
  })
}
