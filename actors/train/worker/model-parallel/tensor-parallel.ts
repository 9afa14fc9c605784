// Tensor-parallel dense pairs, as Megatron-LM splits a transformer's MLP: the first dense layer
// column-parallel (rank t holds columns [t c, (t+1) c) of its kernel and bias, c = units / tp), the
// second row-parallel (rank t holds the matching rows of its kernel). Each rank computes
// act(x W1_t + b1_t) W2_t, a partial sum of the pair's output; one all-reduce (sum) over the tp
// ranks makes the whole output, to which the second bias (held whole by every rank) is added. In the
// backward pass every rank has the same output gradient dy: its slices' gradients are local, the
// second bias's is the same on every rank, and the input's gradient is a partial sum again: one
// more all-reduce. The second layer's activation, applied after the sum, becomes a layer block of
// its own (blocks.ts). Weights, their gradients and optimizer state all shrink by tp; the input
// and output of the pair stay whole on every rank.
import type { Tf } from "../../../../core/engine.ts"
import { ConfigError } from "../../../../core/errors.ts"
import type { Block, BlockGradients } from "./blocks.ts"
import type { SumGroup } from "./links.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
type Layer = import("@tensorflow/tfjs").layers.Layer

interface DenseLike {
  readonly units: number
  readonly useBias: boolean
  readonly activation: { apply(x: Tensor): Tensor; getClassName(): string }
}

/** Where a variable of this rank sits in the whole model: a weight, or a slice of one. */
export interface WeightPart {
  /** The whole weight's name in the model (LayerVariable.originalName). */
  readonly name: string
  /** Sliced along this axis into `parts` equal parts, this one the `index`-th; absent: whole. */
  readonly slice?: { readonly axis: number; readonly index: number; readonly parts: number }
}

/** `name`, or name_k when a variable of that name exists (several ranks can share one engine in tests). */
export const uniqueVariableName = (tf: Tf, name: string): string => {
  const taken = (tf.engine() as unknown as { registeredVariables: Record<string, unknown> }).registeredVariables
  if (!(name in taken)) return name
  for (let k = 1; ; k++) if (!(`${name}_${k}` in taken)) return `${name}_${k}`
}

const dense = (l: Layer): DenseLike | undefined => (l.getClassName() === "Dense" ? (l as unknown as DenseLike) : undefined)

/**
 * Whether layers a -> b make a tensor-parallel pair at `tp`: two dense layers on 2-D inputs, the
 * first one's units divisible by tp, with no regularizers or constraints (which would need the
 * whole weight).
 */
export const isTensorParallelPair = (a: Layer, b: Layer, tp: number): boolean => {
  const da = dense(a)
  const db = dense(b)
  if (!da || !db || tp < 2 || da.units % tp !== 0) return false
  for (const l of [a, b]) {
    const c = l.getConfig() as Record<string, unknown>
    if (c.kernelRegularizer || c.biasRegularizer || c.kernelConstraint || c.biasConstraint || c.activityRegularizer) return false
    const inShape = (l as unknown as { inboundNodes?: Array<{ inputTensors: Array<{ shape: unknown[] }> }> }).inboundNodes?.[0]?.inputTensors[0]?.shape
    if (inShape && inShape.length !== 2) return false
  }
  return true
}

/** The activation of a dense layer after the row-parallel sum, or undefined for a linear one. */
export const activationAfter = (b: Layer): ((x: Tensor) => Tensor) | undefined => {
  const act = dense(b)?.activation
  return act && act.getClassName() !== "linear" ? (x) => act.apply(x) : undefined
}

export class TensorParallelDensePair implements Block {
  readonly variables: ReadonlyArray<Variable>
  readonly parts: ReadonlyArray<WeightPart>
  readonly #tf: Tf
  readonly #group: SumGroup
  readonly #w1: Variable
  readonly #b1: Variable | undefined
  readonly #w2: Variable
  readonly #b2: Variable | undefined
  readonly #act: (x: Tensor) => Tensor

  /**
   * Takes this rank's slices of layers a and b (their current weights; the caller disposes the
   * layers' own weights afterwards).
   */
  constructor(tf: Tf, a: Layer, b: Layer, group: SumGroup) {
    const da = dense(a)
    const db = dense(b)
    const tp = group.size
    if (!da || !db || da.units % tp !== 0) {
      throw new ConfigError({ field: "preparePipeline.tensorParallel", reason: `layers "${a.name}" and "${b.name}" are not a dense pair whose first layer's units divide by ${tp}` })
    }
    this.#tf = tf
    this.#group = group
    const t = group.index
    const c = da.units / tp
    const [ka, ba] = a.weights
    const [kb, bb] = b.weights
    const kaV = ka.read()
    const kbV = kb.read()
    const name = (w: { originalName: string }, tag: string) => uniqueVariableName(tf, `${w.originalName}/tp${t}of${tp}${tag}`)
    this.#w1 = tf.variable(tf.slice(kaV, [0, t * c], [kaV.shape[0], c]), true, name(ka, ""))
    this.#b1 = da.useBias && ba ? tf.variable(tf.slice(ba.read(), [t * c], [c]), true, name(ba, "")) : undefined
    this.#w2 = tf.variable(tf.slice(kbV, [t * c, 0], [c, kbV.shape[1] as number]), true, name(kb, ""))
    this.#b2 = db.useBias && bb ? tf.variable(bb.read().clone(), true, name(bb, "/whole")) : undefined
    const act = da.activation
    this.#act = (x) => act.apply(x)
    const vars: Variable[] = [this.#w1]
    const parts: WeightPart[] = [{ name: ka.originalName, slice: { axis: 1, index: t, parts: tp } }]
    if (this.#b1) {
      vars.push(this.#b1)
      parts.push({ name: ba!.originalName, slice: { axis: 0, index: t, parts: tp } })
    }
    vars.push(this.#w2)
    parts.push({ name: kb.originalName, slice: { axis: 0, index: t, parts: tp } })
    if (this.#b2) {
      vars.push(this.#b2)
      parts.push({ name: bb!.originalName })
    }
    this.variables = vars
    this.parts = parts
  }

  /** This rank's partial output: act(x W1_t + b1_t) W2_t. */
  #local(x: Tensor): Tensor {
    const tf = this.#tf
    const h = tf.matMul(x, this.#w1)
    return tf.matMul(this.#act(this.#b1 ? tf.add(h, this.#b1) : h), this.#w2)
  }

  async forward(x: Tensor): Promise<Tensor> {
    const tf = this.#tf
    const z = tf.tidy(() => this.#local(x))
    const shape = z.shape
    // data() hands over a copy of the values; the all-reduce sums into it in place
    const buf = (await z.data()) as Float32Array
    z.dispose()
    await this.#group.sum(buf)
    return tf.tidy(() => {
      const y = tf.tensor(buf, shape)
      return this.#b2 ? tf.add(y, this.#b2) : y
    })
  }

  async backward(x: Tensor, dy: Tensor, wantDx: boolean): Promise<BlockGradients> {
    const tf = this.#tf
    const local: Tensor[] = [this.#w1, ...(this.#b1 ? [this.#b1] : []), this.#w2]
    const xs = wantDx ? [x, ...local] : local
    const { value, grads } = tf.engine().gradients(() => this.#local(x), xs, dy, true)
    value.dispose()
    const all = grads.map((g, i) => g ?? tf.zerosLike(xs[i]))
    const own = wantDx ? all.slice(1) : all
    if (this.#b2) own.push(tf.tidy(() => tf.sum(dy, 0)))
    if (!wantDx) return { dx: undefined, grads: own }
    const partial = all[0]
    const buf = (await partial.data()) as Float32Array
    partial.dispose()
    await this.#group.sum(buf)
    return { dx: tf.tensor(buf, x.shape), grads: own }
  }
}
