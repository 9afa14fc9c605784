// A step's gradients on their way out of the engine: gradient accumulation (dp.trainStep({
// accumulate: true }), fit's accumulationSteps: the sample-weighted sums of the micro-batches'
// gradients since the last exchange, kept on the engine, and the update's gradients from them, the
// same update as one batch of all their samples), and the read into one flat array.
type tfjs = typeof import("@tensorflow/tfjs")
type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable

/** One variable's place in the flat gradient. */
interface Slot {
  readonly offset: number
  readonly size: number
}

/**
 * This step's gradients as one flat array in layout order, in `own` when given: ZeRO stage 2's
 * padded buffer, or the group's (GradientSync.gradientBuffer: compression kernels work on it in
 * place), which the caller passes on backends that keep tensors in host memory (cpu, wasm); then
 * each variable's gradient is read into it: on wasm straight from its place on the heap (one copy
 * per element; tensor.data() there copies the heap's bytes out first), elsewhere through data().
 * The tensorflow backend concatenates on the device and downloads once.
 */
export const readGradients = async (tf: tfjs, vars: ReadonlyArray<Variable>, layout: ReadonlyArray<Slot>, grads: Record<string, Tensor>, own: Float32Array | undefined): Promise<Float32Array> => {
  const device = tf.getBackend() === "tensorflow"
  if (own && tf.getBackend() === "wasm") return readFromHeap(tf, vars.map((v) => grads[v.name]), layout, own)
  if (own && !device) {
    const parts = await Promise.all(vars.map((v) => grads[v.name]?.data() as Promise<Float32Array> | undefined))
    layout.forEach((s, i) => {
      const part = parts[i]
      if (part) own.set(part, s.offset)
      else own.fill(0, s.offset, s.offset + s.size)
    })
    return own
  }
  const flatT = tf.tidy(() => tf.concat(vars.map((v) => (grads[v.name] ?? tf.zerosLike(v)).reshape([-1]))))
  const flat = (await flatT.data()) as Float32Array
  flatT.dispose()
  if (own) own.set(flat)
  return own ?? flat
}

/**
 * On wasm: slot i of `own` (layout order) from tensors[i] straight from its place on the heap (one
 * copy; tensor.data() there copies the heap's bytes out first), zeros where a tensor is missing.
 */
export const readFromHeap = (tf: tfjs, tensors: ReadonlyArray<Tensor | undefined>, layout: ReadonlyArray<Slot>, own: Float32Array): Float32Array => {
  const heap = tf.backend() as unknown as { typedArrayFromHeap(t: Tensor): Float32Array }
  layout.forEach((s, i) => {
    const t = tensors[i]
    // a view of the heap, read at once (a later allocation may move the heap)
    if (t?.dtype === "float32") own.set(heap.typedArrayFromHeap(t), s.offset)
    else if (t) own.set(t.dataSync(), s.offset)
    else own.fill(0, s.offset, s.offset + s.size)
  })
  return own
}

export class GradientAccumulator {
  readonly #tf: tfjs
  readonly #vars: ReadonlyArray<Variable>
  #acc: Record<string, Tensor> | undefined
  #samples = 0
  #microBatches = 0
  /** Forward/backward ms of the micro-batches accumulated since the last exchange. */
  computeMs = 0

  constructor(tf: tfjs, vars: ReadonlyArray<Variable>) {
    this.#tf = tf
    this.#vars = vars
  }

  /** Adds a micro-batch's gradients (disposed), weighted by its samples. */
  add(grads: Record<string, Tensor>, samples: number): void {
    const tf = this.#tf
    const acc = (this.#acc ??= {})
    for (const v of this.#vars) {
      const g = grads[v.name]
      if (!g) continue
      const prev = acc[v.name]
      acc[v.name] = tf.tidy(() => (prev ? prev.add(g.mul(samples)) : g.mul(samples)))
      prev?.dispose()
    }
    tf.dispose(Object.values(grads))
    this.#samples += samples
    this.#microBatches++
  }

  /** The micro-batches (and their samples) added since the last update: none once it applied them. */
  get pending(): { readonly microBatches: number; readonly samples: number } {
    return { microBatches: this.#microBatches, samples: this.#samples }
  }

  /** The update's gradients: this batch's, or with accumulated ones their sample-weighted mean (accumulators kept). */
  withAccumulated(grads: Record<string, Tensor>, samples: number): { grads: Record<string, Tensor>; samples: number } {
    const acc = this.#acc
    if (!acc) return { grads, samples }
    const tf = this.#tf
    const total = this.#samples + samples
    const out: Record<string, Tensor> = {}
    for (const v of this.#vars) {
      const a = acc[v.name]
      const g = grads[v.name]
      if (!a && !g) continue
      out[v.name] = tf.tidy(() => (a ? (g ? a.add(g.mul(samples)) : a) : g!.mul(samples)).div(Math.max(1, total)))
    }
    tf.dispose(Object.values(grads))
    return { grads: out, samples: total }
  }

  clear(): void {
    if (this.#acc) this.#tf.dispose(Object.values(this.#acc))
    this.#acc = undefined
    this.#samples = 0
    this.#microBatches = 0
    this.computeMs = 0
  }
}
