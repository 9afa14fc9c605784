// A compiled model's cross-entropy on probabilities (`compile({ loss: "categoricalCrossentropy" })`
// or "sparseCategoricalCrossentropy" on a softmax output) as one kernel, its gradient as one more,
// and softmax's gradient as one kernel, on wasm and cpu. tfjs-layers composes the loss from the
// row sums, a division, a clip, a log, a product, a sum and a negation (about 17 kernels with the
// casts and identities) and its gradient from about 20 more; softmax's gradient is a product, a
// sum, a second product and a difference. For the digits MLP (64-64-10) those were 45 of a
// training step's 92 kernels and about a third of its CPU on wasm. The same arithmetic as tfjs's,
// for probabilities p (N rows of C), targets t (one-hot or soft rows, or class ids) and the
// incoming gradient g of each row's loss (g/N each for the mean), with ε the backend's epsilon:
//
//   S = Σ_j p_j,  q_j = p_j / S,  loss = −Σ_j t_j · log(clip(q_j, ε, 1 − ε))
//   dq_j = −g · t_j / q_j where ε ≤ q_j ≤ 1 − ε, else 0
//   dp_i = dq_i / S − (Σ_j dq_j · p_j) / S²
//   softmax: dx_j = y_j · (dy_j − Σ_k dy_k · y_k)
//
// Sums are float64 (tfjs's are float32), so a loss or gradient may differ from tfjs's in its last
// float32 bits. A class id outside [0, C) contributes nothing, as tfjs's one-hot of it (all zeros).
// Other backends (webgpu, tfjs-node) keep tfjs-layers' composition.
import type { Tf } from "../tf.ts"
import { hostKernels, registerFused, registerKernels } from "./fused-layers.ts"
import { wrapGradient } from "./gradients.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The kernels' names in tfjs's registry (gradwire's own). */
export const PROB_CROSS_ENTROPY = "GradwireProbCrossEntropy"
export const PROB_CROSS_ENTROPY_GRAD = "GradwireProbCrossEntropyGrad"
export const SOFTMAX_GRAD = "GradwireSoftmaxGrad"
export const CORRECT_COUNT = "GradwireCorrectCount"

/** Kernels run in this process (for tests). */
export const probCrossEntropyStats = { forward: 0, backward: 0, softmaxGrad: 0, correct: 0 }

interface Attrs {
  /** The clip's lower bound (the backend's epsilon); the upper is 1 − eps. */
  eps: number
  /** One scalar, the rows' mean, instead of each row's loss. */
  mean: boolean
  /** Targets are class ids, one per row, instead of rows of C. */
  sparse: boolean
}

/** Row r's sum of probabilities, in float64. */
const rowSum = (p: Float32Array, o: number, C: number): number => {
  let s = 0
  for (let j = 0; j < C; j++) s += p[o + j]!
  return s
}

/** Each row's loss into `out`, or their mean into `out[0]`. */
const forward = (p: Float32Array, t: Float32Array, out: Float32Array, N: number, C: number, a: Attrs): void => {
  const lo = Math.fround(a.eps)
  const hi = Math.fround(1 - a.eps)
  const clipped = (x: number): number => Math.min(hi, Math.max(lo, Math.fround(x)))
  let total = 0
  for (let r = 0; r < N; r++) {
    const o = r * C
    const S = rowSum(p, o, C)
    let loss = 0
    if (a.sparse) {
      const id = t[r]!
      // a NaN anywhere in the row makes its loss NaN, as tfjs's sum and division do
      loss = id >= 0 && id < C ? -Math.log(clipped(p[o + id]! / S)) : 0
      if (Number.isNaN(S)) loss = Number.NaN
    } else {
      for (let j = 0; j < C; j++) loss -= t[o + j]! * Math.log(clipped(p[o + j]! / S))
    }
    if (a.mean) total += loss
    else out[r] = loss
  }
  if (a.mean) out[0] = total / N
}

/** The gradient in the probabilities, given the gradient of the mean (dy[0]) or of each row's loss. */
const backward = (p: Float32Array, t: Float32Array, dy: Float32Array, dp: Float32Array, N: number, C: number, a: Attrs): void => {
  const lo = Math.fround(a.eps)
  const hi = Math.fround(1 - a.eps)
  for (let r = 0; r < N; r++) {
    const o = r * C
    const g = a.mean ? dy[0]! / N : dy[r]!
    const S = rowSum(p, o, C)
    // dq_j into dp first (the log's gradient where the clip passes it), then the division's two terms.
    let dot = 0
    for (let j = 0; j < C; j++) {
      const tj = a.sparse ? (j === t[r] ? 1 : 0) : t[o + j]!
      const q = Math.fround(p[o + j]! / S)
      const dq = q >= lo && q <= hi ? (-g * tj) / q : 0
      dp[o + j] = dq
      dot += dq * p[o + j]!
    }
    const k = dot / (S * S)
    for (let j = 0; j < C; j++) dp[o + j] = dp[o + j]! / S - k
  }
}

const attrsOf = (attrs: Record<string, unknown>): Attrs => attrs as unknown as Attrs
const rowsOf = (probs: TensorInfo): [number, number] => probs.shape as [number, number]

// wasm and cpu: loops on the backend's arrays (ids arrive as float32 values: exact below 2^24).
const hostLoss = hostKernels({
  names: ["probs", "targets"],
  shapes: ({ probs }, attrs) => (attrsOf(attrs).mean ? [[]] : [[rowsOf(probs!)[0]]]),
  compute: ([p, t], [out], attrs, { probs }) => {
    probCrossEntropyStats.forward++
    forward(p!, t!, out!, ...rowsOf(probs!), attrsOf(attrs))
  }
})
const hostLossGrad = hostKernels({
  names: ["probs", "targets", "dy"],
  shapes: ({ probs }) => [[...probs!.shape]],
  compute: ([p, t, dy], [dp], attrs, { probs }) => {
    probCrossEntropyStats.backward++
    backward(p!, t!, dy!, dp!, ...rowsOf(probs!), attrsOf(attrs))
  }
})
const hostSoftmaxGrad = hostKernels({
  names: ["dy", "y"],
  shapes: ({ y }) => [[...y!.shape]],
  compute: ([dy, y], [dx], _attrs, inputs) => {
    probCrossEntropyStats.softmaxGrad++
    const shape = inputs.y!.shape
    const C = shape[shape.length - 1]!
    const rows = C === 0 ? 0 : y!.length / C
    for (let r = 0; r < rows; r++) {
      const o = r * C
      let dot = 0
      for (let j = 0; j < C; j++) dot += dy![o + j]! * y![o + j]!
      for (let j = 0; j < C; j++) dx![o + j] = y![o + j]! * (dy![o + j]! - dot)
    }
  }
})

/** The first index of row r's largest value (tfjs's argMax; NaN is never the largest). */
const argMaxRow = (v: Float32Array, o: number, C: number): number => {
  let best = 0
  for (let j = 1; j < C; j++) if (v[o + j]! > v[o + best]!) best = j
  return best
}
// The rows whose prediction's argMax is their label: the targets' argMax (rows of C) or the class id
// (ids arrive as float32 values: a float id counts as its integer part, as tfjs's toInt).
const hostCorrect = hostKernels({
  names: ["probs", "targets"],
  shapes: () => [[]],
  compute: ([p, t], [out], attrs, { probs }) => {
    probCrossEntropyStats.correct++
    const [N, C] = rowsOf(probs!)
    const sparse = attrsOf(attrs).sparse
    let n = 0
    for (let r = 0; r < N; r++) if (argMaxRow(p!, r * C, C) === (sparse ? Math.trunc(t![r]!) : argMaxRow(t!, r * C, C))) n++
    out![0] = n
  }
})

const HOST_BACKENDS = ["wasm", "cpu"] as const
const KERNELS: Record<string, readonly [unknown, unknown]> = { wasm: [hostLoss[0], hostLossGrad[0]], cpu: [hostLoss[1], hostLossGrad[1]] }
const SOFTMAX_WRAPPED = Symbol.for("gradwire.softmaxGrad")

let installed = false
let enabled = true
/** Turns the kernels off (tfjs-layers' composition and tfjs's softmax gradient) or back on, for tests and A/B runs. */
export const useProbCrossEntropy = (on: boolean): void => void (enabled = on)

/**
 * Registers the kernels and their gradient on wasm and cpu, and wraps softmax's gradient so that
 * those two backends take it as one kernel (once per process; true once installed).
 */
export const installProbCrossEntropy = (tf: Tf): boolean => {
  if (installed) return true
  installed = true
  registerFused(tf, PROB_CROSS_ENTROPY, PROB_CROSS_ENTROPY_GRAD, KERNELS, {
    inputsToSave: ["probs", "targets"],
    gradFunc: (dy, saved, attrs) => {
      const [probs, targets] = saved as [Tensor, Tensor]
      return {
        probs: () => tf.engine().runKernel(PROB_CROSS_ENTROPY_GRAD, { probs, targets, dy: dy as Tensor }, attrs as never) as unknown as Tensor,
        targets: () => tf.zerosLike(targets)
      }
    }
  })
  registerKernels(tf, SOFTMAX_GRAD, { wasm: hostSoftmaxGrad[0], cpu: hostSoftmaxGrad[1] })
  registerKernels(tf, CORRECT_COUNT, { wasm: hostCorrect[0], cpu: hostCorrect[1] })
  wrapGradient(tf, "Softmax", SOFTMAX_WRAPPED, (dy, saved, attrs) => {
    const y = saved[0]!
    const dim = (attrs as { dim?: number }).dim ?? -1
    const last = dim === -1 || dim === y.rank - 1
    const fits = enabled && last && dy.dtype === "float32" && y.dtype === "float32" && (HOST_BACKENDS as readonly string[]).includes(tf.getBackend()) && dy.shape.every((d, i) => d === y.shape[i]) && dy.rank === y.rank
    return fits ? { logits: () => tf.engine().runKernel(SOFTMAX_GRAD, { dy, y }, {}) as unknown as Tensor } : undefined
  })
  return true
}

/** `t` in `shape`: itself where it has that shape already (a reshape is a kernel call of its own). */
const shaped = (tf: Tf, t: Tensor, shape: number[]): Tensor => (t.rank === shape.length && t.shape.every((d, i) => d === shape[i]) ? t : tf.reshape(t, shape))

/** Whether the running backend computes the loss as one kernel. */
const onHost = (tf: Tf): boolean => installProbCrossEntropy(tf) && enabled && tf.getKernel(PROB_CROSS_ENTROPY, tf.getBackend()) !== undefined

/**
 * tfjs-layers' `categoricalCrossentropy(targets, probs)` (one-hot or soft target rows), or its
 * sparse form on class ids, each row's loss (the leading shape) or their mean: one kernel and one
 * for its gradient on wasm and cpu, tfjs's composition elsewhere. Differentiable in `probs`.
 */
export const probCrossEntropy = (tf: Tf, targets: Tensor, probs: Tensor, options: { sparse: boolean; mean: boolean }): Tensor => {
  const C = probs.shape[probs.rank - 1]!
  const N = C === 0 ? 0 : probs.size / C
  const lead = probs.shape.slice(0, -1)
  return tf.tidy(() => {
    if (!onHost(tf) || probs.dtype !== "float32" || N === 0) {
      const dense = options.sparse ? tf.oneHot(targets.flatten().toInt(), C).reshape(probs.shape) : targets
      const rows = tf.metrics.categoricalCrossentropy(dense, probs)
      return options.mean ? rows.mean() : rows
    }
    const want = options.sparse ? N : N * C
    if (targets.size !== want)
      throw new RangeError(`cross-entropy: ${N} rows of ${C} probabilities (shape [${probs.shape}]) but targets of shape [${targets.shape}]; give ${options.sparse ? "one class id per row" : `rows of ${C}`}`)
    // ids as int32 (a float id truncated, as tfjs's toInt), rows as float32 or int32 (a one-hot's): the kernels read either
    const kept = options.sparse ? targets.dtype === "int32" : targets.dtype === "float32" || targets.dtype === "int32"
    const t = shaped(tf, kept ? targets : tf.cast(targets, options.sparse ? "int32" : "float32"), options.sparse ? [N] : [N, C])
    const out = tf.engine().runKernel(PROB_CROSS_ENTROPY, { probs: shaped(tf, probs, [N, C]), targets: t }, { eps: tf.backend().epsilon(), mean: options.mean, sparse: options.sparse } as never) as unknown as Tensor
    return options.mean ? out : shaped(tf, out, lead)
  })
}

/**
 * How many rows of `probs` ([..., C]) predict their target (argMax(probs) = argMax(targets) for
 * rows of C, or the class id): a float32 scalar, one kernel on wasm and cpu where tfjs ran two
 * argMaxes, a comparison, a cast and a sum; undefined where the shapes are not those (the caller's
 * own composition then counts).
 */
export const correctPredictions = (tf: Tf, probs: Tensor, targets: Tensor): Tensor | undefined => {
  const C = probs.shape[probs.rank - 1]!
  const N = C === 0 ? 0 : probs.size / C
  const dense = targets.rank > 1 && targets.shape[targets.rank - 1]! > 1
  if (!onHost(tf) || probs.dtype !== "float32" || N === 0 || targets.size !== (dense ? N * C : N) || targets.dtype === "string" || targets.dtype === "complex64") return undefined
  return tf.tidy(() => {
    const t = targets.dtype === "float32" || targets.dtype === "int32" ? targets : tf.cast(targets, "float32")
    return tf.engine().runKernel(CORRECT_COUNT, { probs: shaped(tf, probs, [N, C]), targets: shaped(tf, t, dense ? [N, C] : [N]) }, { sparse: !dense } as never) as unknown as Tensor
  })
}
