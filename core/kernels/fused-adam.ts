// tfjs's Adam update as one pass over each variable on the wasm heap: tfjs runs about
// thirteen kernels per variable per step (0.3 ms of a 1 ms step for a small MLP, 2.7 ms of a small
// transformer's). The state stays tfjs's own (the optimizer's moment variables and accBeta1/2, so
// getWeights(), checkpoints and a switch back to applyGradients see the same optimizer), and every
// operation is rounded to float32 in tfjs's order, so the result is bit for bit what
// optimizer.applyGradients computes (tested); four weights at a time by gradwire's SIMD kernel on
// the heap (heap-simd.ts: the same float32 operations, so the same bits). It declines (returns
// false) on any other backend or optimizer, and when a buffer it would write is shared with another
// tensor (a clone).
import type { Tf } from "../tf.ts"
import { heapKernels } from "./heap-simd.ts"
import type { WasmBackend } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor
type Variable = import("@tensorflow/tfjs").Variable
type Slot = { originalName: string; variable: Variable }
/** The part of tfjs's AdamOptimizer a fused update reads and writes (private in tfjs's types). */
export interface AdamLike {
  getClassName?(): string
  learningRate: number
  beta1: number
  beta2: number
  epsilon: number
  accBeta1: Variable
  accBeta2: Variable
  accumulatedFirstMoment: Slot[]
  accumulatedSecondMoment: Slot[]
  incrementIterations(): void
}
interface HeapBackend {
  typedArrayFromHeap(t: { dataId: object; shape: number[]; dtype: string }): Float32Array | Int32Array | Uint8Array
  refCount(dataId: object): number
  makeOutput(shape: number[], dtype: string): { dataId: object; shape: number[]; dtype: string }
}

const f = Math.fround

/**
 * What a fused Adam update needs, or undefined where it must decline: `optimizer` is tfjs's Adam,
 * every gradient is float32, and every tensor the update writes (each weight, its moments,
 * accBeta1/2) is float32 and holds its buffer alone (`sole`: no clone or reshape shares it). The
 * moments of a variable updated for the first time are made as tfjs makes them.
 */
export const adamToFuse = (
  tf: Tf,
  optimizer: unknown,
  grads: Readonly<Record<string, Tensor>>,
  sole: (t: Tensor) => boolean
): { opt: AdamLike; names: string[]; registered: Record<string, Variable> } | undefined => {
  const opt = optimizer as AdamLike
  if (typeof opt.getClassName !== "function" || opt.getClassName() !== "Adam" || !opt.accBeta1 || !Array.isArray(opt.accumulatedFirstMoment)) return undefined
  const names = Object.keys(grads)
  const registered = tf.engine().registeredVariables as Record<string, Variable>
  const own = (t: Tensor): boolean => t.dtype === "float32" && sole(t)
  for (const [i, name] of names.entries()) {
    const value = registered[name]
    const g = grads[name]
    if (!value || !own(value) || (g && g.dtype !== "float32")) return undefined
    const m = opt.accumulatedFirstMoment[i]?.variable
    const v = opt.accumulatedSecondMoment[i]?.variable
    if ((m && !own(m)) || (v && !own(v))) return undefined
  }
  if (!own(opt.accBeta1) || !own(opt.accBeta2)) return undefined
  names.forEach((name, i) => {
    const value = registered[name]!
    opt.accumulatedFirstMoment[i] ??= { originalName: `${name}/m`, variable: tf.tidy(() => tf.zerosLike(value).variable(false)) }
    opt.accumulatedSecondMoment[i] ??= { originalName: `${name}/v`, variable: tf.tidy(() => tf.zerosLike(value).variable(false)) }
  })
  return { opt, names, registered }
}

/** Applies `grads` (by variable name) as `optimizer.applyGradients(grads)` would; false if it cannot. */
export const fusedAdamStep = (tf: Tf, optimizer: unknown, grads: Readonly<Record<string, Tensor>>): boolean => {
  if (tf.getBackend() !== "wasm") return false
  const backend = tf.backend() as unknown as HeapBackend
  if (typeof backend.typedArrayFromHeap !== "function" || typeof backend.refCount !== "function") return false
  const ready = adamToFuse(tf, optimizer, grads, (t) => backend.refCount(t.dataId) === 1)
  if (!ready) return false
  const { opt, names, registered } = ready
  const heap = (t: Tensor): Float32Array => backend.typedArrayFromHeap(t as never) as Float32Array
  const b1 = f(opt.beta1)
  const b2 = f(opt.beta2)
  const c1 = f(1 - opt.beta1)
  const c2 = f(1 - opt.beta2)
  const eps = f(opt.epsilon)
  const negLr = f(-opt.learningRate)
  const accB1 = heap(opt.accBeta1)
  const accB2 = heap(opt.accBeta2)
  const d1 = f(1 - accB1[0]!)
  const d2 = f(1 - accB2[0]!)
  // New weights go to a fresh buffer, assigned to the variable: the wasm backend caches XNNPACK
  // operators with the weights packed, keyed by the buffer, so weights changed in place would be
  // multiplied stale. The moments and accBeta1/2 feed no such operator and are updated in place.
  const kernels = heapKernels(backend as unknown as WasmBackend)
  const fresh = names.map((name) => (grads[name] ? backend.makeOutput([...registered[name]!.shape], "float32") : undefined))
  names.forEach((name, i) => {
    const gT = grads[name]
    const out = fresh[i]
    if (!gT || !out) return
    const p = heap(registered[name]!)
    const q = backend.typedArrayFromHeap(out) as Float32Array
    const m = heap(opt.accumulatedFirstMoment[i]!.variable)
    const v = heap(opt.accumulatedSecondMoment[i]!.variable)
    const g = heap(gT)
    if (kernels) {
      // The same float32 operations, four at a time, on the heap (heap-simd.ts): the same bits.
      kernels.adam(p.byteOffset, q.byteOffset, m.byteOffset, v.byteOffset, g.byteOffset, p.length, b1, c1, b2, c2, d1, d2, eps, negLr)
      return
    }
    for (let k = 0; k < p.length; k++) {
      const gk = g[k]!
      const mk = f(f(m[k]! * b1) + f(gk * c1))
      const vk = f(f(v[k]! * b2) + f(f(gk * gk) * c2))
      m[k] = mk
      v[k] = vk
      q[k] = f(f(f(f(mk / d1) / f(f(Math.sqrt(f(vk / d2))) + eps)) * negLr) + p[k]!)
    }
  })
  names.forEach((name, i) => {
    const out = fresh[i]
    if (!out) return
    const t = tf.engine().makeTensorFromTensorInfo(out as never)
    registered[name]!.assign(t)
    t.dispose()
  })
  accB1[0] = f(accB1[0]! * b1)
  accB2[0] = f(accB2[0]! * b2)
  opt.incrementIterations()
  return true
}
