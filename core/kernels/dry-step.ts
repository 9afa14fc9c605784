// prepareModel's dry step: one forward and backward pass of the model on a zero batch of two, before
// any training, so a kernel the backend cannot run is a typed error naming the kernel, the layer
// and the implementations tried now, not a crash at the first step of every rank. The model's
// state is left as it was: gradients are discarded, and layers that update state in training
// mode (batch normalization's moving statistics) get their non-trainable weights back.
import { UnsupportedKernel } from "../errors.ts"
import type { Tf } from "../tf.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel
type Layer = import("@tensorflow/tfjs").layers.Layer
type Call = (inputs: Tensor | Tensor[], kwargs: Record<string, unknown>) => Tensor | Tensor[]

/** The kernel a tfjs error says is missing, and whether it is a gradient (not a forward kernel). */
export const missingKernelOf = (e: unknown): { kernel: string; gradient: boolean } | undefined => {
  const msg = e instanceof Error ? e.message : String(e)
  const k = /Kernel '([A-Za-z0-9_]+)' not registered for backend/.exec(msg)
  if (k) return { kernel: k[1], gradient: false }
  const g = /gradient function not found for ([A-Za-z0-9_]+)/.exec(msg)
  if (g) return { kernel: g[1], gradient: true }
  return undefined
}

const lossOf = (out: Tensor | Tensor[], tf: Tf): Tensor => {
  const outs = Array.isArray(out) ? out : [out]
  return tf.addN(outs.map((o) => (o.dtype === "float32" ? o.square().mean() : tf.scalar(0))))
}

/** The implementations a kernel was looked for in, on `backend`. */
export const implementationsTried = (backend: string): string[] =>
  backend === "wasm" ? ["tfjs-backend-wasm", "gradwire's wasm kernels", "the cpu-backend fallback"] : [`tfjs's "${backend}" backend`]

/**
 * Runs the dry step; throws UnsupportedKernel when a kernel is missing. Other errors (a shape the
 * model does not accept, say) are not this check's to judge: they surface at the first real step.
 */
export const dryStep = (tf: Tf, model: LayersModel, backend: string): void => {
  // A model not built yet (no input shape) has nothing to run on; its first step will build it.
  let inputs: LayersModel["inputs"]
  try {
    inputs = model.inputs
  } catch {
    return
  }
  if (!inputs || inputs.length === 0 || inputs.some((s) => !Array.isArray(s.shape))) return
  const stack: string[] = []
  const seen: Array<{ layer: Layer; inputs: Tensor | Tensor[] }> = []
  const originals = new Map<Layer, Call>()
  for (const layer of model.layers) {
    const l = layer as unknown as { call: Call }
    const orig = l.call
    originals.set(layer, orig)
    l.call = (inputs, kwargs) => {
      stack.push(layer.name)
      // Kept copies: the gradient's scope disposes the originals when it throws.
      seen.push({ layer, inputs: Array.isArray(inputs) ? inputs.map((t) => tf.keep(t.clone())) : tf.keep(inputs.clone()) })
      const out = orig.call(layer, inputs, kwargs)
      stack.pop()
      return out
    }
  }
  const restoreCalls = (): void => {
    for (const [layer, orig] of originals) (layer as unknown as { call: Call }).call = orig
  }
  const state = model.weights.filter((w) => !w.trainable).map((w) => ({ w, v: w.read().clone() }))
  let failure: UnsupportedKernel | undefined
  try {
    tf.tidy(() => {
      const xs = inputs.map((s) => tf.zeros([2, ...s.shape.slice(1).map((d) => d ?? 1)], s.dtype))
      let inBackward = false
      try {
        const vars = model.trainableWeights.map((w) => w.read() as unknown as import("@tensorflow/tfjs").Variable)
        const f = (): import("@tensorflow/tfjs").Scalar => {
          const out = model.apply(xs.length === 1 ? xs[0] : xs, { training: true }) as Tensor | Tensor[]
          inBackward = true
          return lossOf(out, tf) as import("@tensorflow/tfjs").Scalar
        }
        if (vars.length > 0) tf.variableGrads(f, vars)
        else f()
      } catch (e) {
        restoreCalls()
        const missing = missingKernelOf(e)
        if (!missing) return
        // Forward: the layer running when it threw. Backward: the first layer whose own gradient fails alike.
        const layer = !inBackward ? (stack[stack.length - 1] ?? "") : layerOfGradient(tf, seen, missing.kernel)
        failure = new UnsupportedKernel({
          kernel: missing.kernel,
          layer,
          backend,
          tried: implementationsTried(backend),
          reason: missing.gradient ? "tfjs defines no gradient for it" : inBackward ? "needed by the backward pass" : "needed by the forward pass"
        })
      }
    })
  } finally {
    restoreCalls()
    for (const s of seen) for (const t of Array.isArray(s.inputs) ? s.inputs : [s.inputs]) t.dispose()
    for (const { w, v } of state) {
      w.write(v)
      v.dispose()
    }
  }
  if (failure) throw failure
}

const layerOfGradient = (tf: Tf, seen: ReadonlyArray<{ layer: Layer; inputs: Tensor | Tensor[] }>, kernel: string): string => {
  for (const { layer, inputs } of [...seen]) {
    const list = (Array.isArray(inputs) ? inputs : [inputs]).filter((t) => t.dtype === "float32")
    const vars = layer.trainableWeights.map((w) => w.read() as unknown as import("@tensorflow/tfjs").Variable)
    try {
      const f = (...xs: Tensor[]): Tensor => {
        let i = 0
        const args = (Array.isArray(inputs) ? inputs : [inputs]).map((t) => (t.dtype === "float32" ? xs[i++] : t))
        return lossOf((layer as unknown as { call: Call }).call(Array.isArray(inputs) ? args : args[0], { training: true }), tf)
      }
      if (list.length > 0) tf.grads(f)(list)
      if (vars.length > 0) tf.variableGrads(() => f(...list) as import("@tensorflow/tfjs").Scalar, vars)
    } catch (e) {
      if (missingKernelOf(e)?.kernel === kernel) return layer.name
    }
  }
  return ""
}
