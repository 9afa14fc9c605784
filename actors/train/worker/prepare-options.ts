// What prepareModel takes (PrepareOptions) and the loss it resolves from them or the compiled model.
import type { Tf } from "../../../core/engine.ts"
import { ConfigError } from "../../../core/errors.ts"
import type { LrRuleOptions } from "../common/optim/lr-rules.ts"
import { labelsOf, resolveLoss as resolveLossOf, type LossFn, type LossName, type ResolvedLoss } from "./model-parallel/loss.ts"

type tfjs = typeof import("@tensorflow/tfjs")
type LayersModel = import("@tensorflow/tfjs").LayersModel
type Optimizer = import("@tensorflow/tfjs").Optimizer
type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").LayerVariable

export interface PrepareOptions extends LrRuleOptions {
  /** Default: the model's compile() optimizer. */
  readonly optimizer?: Optimizer
  /**
   * Decoupled weight decay (AdamW-style, as torch.optim.AdamW): before each update every weight is
   * multiplied by 1 - learningRate * weightDecay. With any optimizer. Default 0.
   */
  readonly weightDecay?: number
  /** Default: the model's compile() loss. */
  readonly loss?: LossName | LossFn
  /**
   * Gradient clipping by the global norm: the reduced gradient (every rank's, all-reduced) is
   * scaled down to this L2 norm over all weights when it is longer, before the optimizer's update,
   * as torch.nn.utils.clip_grad_norm_ after DDP's backward, or Keras's global_clipnorm. Strategies
   * "allreduce" (ZeRO stage 1: every rank clips the whole all-reduced gradient; stage 2: each rank
   * scales its segment by the whole gradient's norm, summed from every rank's segment) and
   * "local-sgd" (its inner steps). Default: none.
   */
  readonly clipNorm?: number
  /**
   * Gradient clipping by value: every element of the reduced gradient is clamped to
   * [-clipValue, clipValue] (torch.nn.utils.clip_grad_value_), before clipNorm when both are given.
   * The same strategies as clipNorm. Default: none.
   */
  readonly clipValue?: number
  /**
   * Simulated heterogeneity (tests, benchmarks): this rank sleeps this many ms per sample after
   * forward/backward, inside the measured compute time, like a slower device. Default 0.
   */
  readonly simulatedDelayMsPerSample?: number
  /**
   * Simulated heterogeneity (tests): this rank sleeps this many ms per step that has rows, inside the
   * measured compute time, like a device's fixed cost per step (kernel launches). Default 0.
   */
  readonly simulatedDelayMsPerStep?: number
}

/** The loss prepareModel trains on: `loss`, else the compiled model's (model-parallel/loss.ts: the same choices a pipeline's last stage makes). */
export const resolveLoss = (tf: Tf, model: LayersModel, loss: PrepareOptions["loss"]): ResolvedLoss =>
  resolveLossOf(tf, loss ?? (model as unknown as { loss?: unknown }).loss, "prepareModel.loss")

/**
 * Gives `vars` (the same variables on every rank) rank 0's values: concatenated on the engine and
 * read once, sent by `broadcast` (rank 0's buffer to the others), written back in place.
 */
export const takeRankZeroValues = async (tf: tfjs, vars: ReadonlyArray<Variable>, broadcast: (buf: Float32Array) => Promise<void>): Promise<void> => {
  if (vars.length === 0) return
  const flat = tf.tidy(() => tf.concat(vars.map((v) => v.read().reshape([-1]))))
  const buf = (await flat.data()) as Float32Array
  flat.dispose()
  await broadcast(buf)
  tf.tidy(() => {
    let off = 0
    for (const v of vars) {
      const size = v.read().size
      v.write(tf.tensor(buf.subarray(off, off + size), v.read().shape, v.dtype))
      off += size
    }
  })
}

/** Rank 0's bytes to every rank (`bytes` given on rank 0 only), two to a float32 (16-bit integers: exact, no NaN patterns). */
export const broadcastBytes = async (bytes: Uint8Array | undefined, broadcast: (buf: Float32Array) => Promise<void>): Promise<Uint8Array> => {
  const n = bytes?.length ?? 0
  const size = Float32Array.of(n % 65536, Math.floor(n / 65536))
  await broadcast(size)
  const length = size[0]! + size[1]! * 65536
  const buf = new Float32Array(Math.ceil(length / 2))
  if (bytes) for (let i = 0; i < length; i += 2) buf[i >> 1] = bytes[i]! | ((bytes[i + 1] ?? 0) << 8)
  await broadcast(buf)
  const out = new Uint8Array(length)
  for (let i = 0; i < length; i += 2) {
    const v = buf[i >> 1]!
    out[i] = v & 0xff
    if (i + 1 < length) out[i + 1] = v >> 8
  }
  return out
}


/** dp.evaluateAsync's options. */
export interface EvaluateOptions {
  /**
   * Each rank evaluates its contiguous 1/p of the rows and the sums are all-reduced: the whole
   * set's loss and accuracy on every rank at 1/p of the computation. Every rank must call it, with
   * the same rows. Default false: every rank evaluates all of them.
   */
  readonly distributed?: boolean
}

/** Loss and accuracy of `model` on (x, y), read asynchronously (the form a GPU backend needs). */
export const evaluateLocalAsync = async (tf: tfjs, model: LayersModel, lossFn: LossFn, classification: boolean, x: Tensor | Tensor[], y: Tensor): Promise<{ loss: number; accuracy?: number }> => {
  const [lossT, accT] = tf.tidy(() => {
    const pred = model.predict(x) as Tensor
    const loss = lossFn(y, pred)
    return [loss, classification ? pred.argMax(-1).equal(labelsOf(y)).mean() : undefined] as const
  })
  const [loss, acc] = await Promise.all([lossT.data(), accT?.data()])
  tf.dispose([lossT, ...(accT ? [accT] : [])])
  return acc ? { loss: loss[0]!, accuracy: acc[0]! } : { loss: loss[0]! }
}

/** Loss and accuracy of `model` on (x, y) with synchronous reads (cpu, wasm, tensorflow; not webgpu). */
export const evaluateLocal = (tf: tfjs, model: LayersModel, lossFn: LossFn, classification: boolean, x: Tensor | Tensor[], y: Tensor): { loss: number; accuracy?: number } => {
  if (tf.getBackend() === "webgpu") {
    throw new ConfigError({ field: "dp.evaluate", reason: "the webgpu backend cannot read tensors synchronously in Node: use await dp.evaluateAsync(x, y)" })
  }
  return tf.tidy(() => {
    const pred = model.predict(x) as Tensor
    const loss = lossFn(y, pred).dataSync()[0]
    if (!classification) return { loss }
    const acc = pred.argMax(-1).equal(labelsOf(y)).mean().dataSync()[0]
    return { loss, accuracy: acc }
  })
}
