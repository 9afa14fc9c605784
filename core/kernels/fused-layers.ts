// What gradwire's fused layer kernels share (lstm-cell.ts, layer-norm.ts, batch-norm-train.ts):
// registering a forward kernel and its gradient kernel on every backend that has them, reading the
// cpu backend's values, and replacing a tfjs-layers class's `call` (keeping tfjs-layers' own for
// the cases a kernel does not cover, and for tests that compare the two).
import type { Tf } from "../tf.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** The prototype of a tfjs-layers class by its registered class name ("LSTM", "LayerNormalization"),
 * from tfjs's serialization registry: creating a layer to reach its prototype would take one of
 * tfjs-layers' automatic names ("lstm_LSTM1"), and every layer a user makes after it would be named
 * one further on. */
export const layerPrototype = <T>(tf: Tf, className: string): T | undefined => {
  const entry = (tf.serialization.SerializationMap.getMap().classNameMap as Record<string, [unknown, unknown] | undefined>)[className]
  const cls = entry?.[0] as { prototype?: T } | undefined
  return cls?.prototype
}

/** The cpu backend, as far as the kernels use it. */
export interface CpuBackend {
  data: { get(id: object): { values: unknown } | undefined }
  makeTensorInfo(shape: number[], dtype: string, values: Float32Array): TensorInfo
}
export type CpuArgs = { inputs: Record<string, TensorInfo>; backend: CpuBackend; attrs: Record<string, unknown> }

/** A float32 tensor's values on the cpu backend. */
export const cpuValues = (backend: CpuBackend, t: TensorInfo): Float32Array => {
  const v = backend.data.get(t.dataId)?.values
  return v instanceof Float32Array ? v : Float32Array.from(v as ArrayLike<number>)
}

/** Registers `forward` and `backward` (gradwire's names) for each backend in `kernels`, where tfjs has none, and `gradient` for `forward`. */
export const registerFused = (
  tf: Tf,
  forward: string,
  backward: string,
  kernels: Record<string, readonly [unknown, unknown]>,
  gradient: { inputsToSave: string[]; gradFunc: (dy: Tensor | Tensor[], saved: Tensor[], attrs: Record<string, unknown>) => Record<string, () => Tensor> }
): void => {
  for (const [backendName, [f, b]] of Object.entries(kernels)) {
    if (!tf.getKernel(forward, backendName)) tf.registerKernel({ kernelName: forward, backendName, kernelFunc: f as never })
    if (!tf.getKernel(backward, backendName)) tf.registerKernel({ kernelName: backward, backendName, kernelFunc: b as never })
  }
  if (!tf.getGradient(forward)) tf.registerGradient({ kernelName: forward, inputsToSave: gradient.inputsToSave, gradFunc: gradient.gradFunc as never })
}

/** A layer's `call`, as tfjs-layers defines it. */
export type LayerCall<L> = (this: L, inputs: Tensor | Tensor[], kwargs: Record<string, unknown>) => Tensor | Tensor[]
const PATCHED = Symbol.for("gradwire.fusedLayer")
const ORIGINAL = Symbol.for("gradwire.fusedLayer.original")
type Marked = { [PATCHED]?: true; [ORIGINAL]?: (...a: never[]) => unknown }

/** Replaces `className`'s call with `make(own)`, once (a second install keeps the first). Returns whether the class exists. */
export const patchLayerCall = <L>(tf: Tf, className: string, make: (own: LayerCall<L>) => LayerCall<L>): boolean => {
  const proto = layerPrototype<{ call: LayerCall<L> & Marked }>(tf, className)
  if (!proto) return false
  if (!proto.call[PATCHED]) {
    const own = proto.call
    proto.call = Object.assign(make(own), { [PATCHED]: true as const, [ORIGINAL]: own })
  }
  return true
}

/** Whether `call` is one that patchLayerCall installed. */
export const isPatchedCall = (call: unknown): boolean => (call as Marked | undefined)?.[PATCHED] === true

/** Runs `f` with tfjs-layers' own call on each of `classNames` (for tests and benchmarks that compare the two). */
export const withTfjsCalls = <T>(tf: Tf, classNames: string[], f: () => T): T => {
  const protos = classNames.map((n) => layerPrototype<{ call: Marked }>(tf, n)).filter((p) => p?.call[ORIGINAL] !== undefined) as Array<{ call: Marked }>
  const patched = protos.map((p) => p.call)
  protos.forEach((p) => (p.call = p.call[ORIGINAL] as Marked))
  try {
    return f()
  } finally {
    protos.forEach((p, i) => (p.call = patched[i]!))
  }
}

/** The one input tensor of a layer's call, or undefined (several inputs). */
export const oneInput = (inputs: Tensor | Tensor[]): Tensor | undefined => (Array.isArray(inputs) ? (inputs.length === 1 ? inputs[0] : undefined) : inputs)
