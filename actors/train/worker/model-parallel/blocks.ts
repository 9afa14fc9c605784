// What a stage is made of: blocks, each taking one tensor and giving one, with its own trainable
// variables and a backward pass that turns the gradient of its output (dy) into the gradients of
// its variables and of its input. A layer block runs a range of the model's layers; a
// tensor-parallel block (tensor-parallel.ts) runs a sliced dense pair with its all-reduces.
//
// tfjs records a gradient tape only inside one call (engine.gradients runs f and backpropagates at
// once), so a forward pass cannot be kept for a backward pass that comes micro-batches later. The
// backward pass therefore runs the block's forward again under the tape, from its stashed input:
// GPipe's re-materialisation. A stage holds only its blocks' inputs for the micro-batches in
// flight, never the activations inside them, at the price of one more forward per backward.
import type { Tf } from "../../../../core/engine.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar
type Variable = import("@tensorflow/tfjs").Variable

export interface BlockGradients {
  /** Gradient of the block's input (when asked for). */
  readonly dx: Tensor | undefined
  /** One per variable, in `variables` order. */
  readonly grads: Tensor[]
}

export interface Block {
  /** Trainable variables this rank holds for the block (a tensor-parallel block: its slices). */
  readonly variables: ReadonlyArray<Variable>
  /** Training-mode forward; the caller owns the result. */
  forward(x: Tensor): Promise<Tensor>
  /** Gradients given the gradient of the output; recomputes the forward from `x`. */
  backward(x: Tensor, dy: Tensor, wantDx: boolean): Promise<BlockGradients>
  /**
   * The last block of the last stage, fused with the loss: `loss(out)` is the scalar to
   * differentiate; also returns its value and (when `keep`) the output, kept.
   */
  backwardLoss?(x: Tensor, loss: (out: Tensor) => Scalar, wantDx: boolean, keep: boolean): { value: Scalar; out: Tensor | undefined } & BlockGradients
}

const nonNull = (tf: Tf, grads: ReadonlyArray<Tensor | null>, like: ReadonlyArray<Tensor>): Tensor[] => grads.map((g, i) => g ?? tf.zerosLike(like[i]))

/** A run of tfjs layers (replicated: every tensor-parallel rank computes it whole). */
export class LayerBlock implements Block {
  readonly variables: ReadonlyArray<Variable>
  readonly #tf: Tf
  readonly #apply: (x: Tensor) => Tensor

  constructor(tf: Tf, apply: (x: Tensor) => Tensor, variables: ReadonlyArray<Variable>) {
    this.#tf = tf
    this.#apply = apply
    this.variables = variables
  }

  forward(x: Tensor): Promise<Tensor> {
    return Promise.resolve(this.#tf.tidy(() => this.#apply(x)))
  }

  backward(x: Tensor, dy: Tensor, wantDx: boolean): Promise<BlockGradients> {
    const tf = this.#tf
    const xs: Tensor[] = wantDx ? [x, ...this.variables] : [...this.variables]
    if (xs.length === 0) return Promise.resolve({ dx: undefined, grads: [] })
    const { value, grads } = tf.engine().gradients(() => this.#apply(x), xs, dy, true)
    value.dispose()
    const all = nonNull(tf, grads, xs)
    return Promise.resolve(wantDx ? { dx: all[0], grads: all.slice(1) } : { dx: undefined, grads: all })
  }

  backwardLoss(x: Tensor, loss: (out: Tensor) => Scalar, wantDx: boolean, keep: boolean): { value: Scalar; out: Tensor | undefined } & BlockGradients {
    const tf = this.#tf
    const xs: Tensor[] = wantDx ? [x, ...this.variables] : [...this.variables]
    let out: Tensor | undefined
    const f = (): Scalar => {
      const o = this.#apply(x)
      if (keep) out = tf.keep(o)
      return loss(o)
    }
    if (xs.length === 0) {
      // nothing to differentiate: the loss of a parameter-free head on the stage's first input
      const value = tf.tidy(f)
      return { value, out, dx: undefined, grads: [] }
    }
    const { value, grads } = tf.engine().gradients(f, xs, undefined, true)
    const all = nonNull(tf, grads, xs)
    return { value: value as Scalar, out, ...(wantDx ? { dx: all[0], grads: all.slice(1) } : { dx: undefined, grads: all }) }
  }
}
