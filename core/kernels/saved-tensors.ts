// The tensors a kernel keeps for its gradient, saved as second references to their buffers without
// a kernel call. While a gradient is recorded, tfjs-core's engine saves each input and output a
// gradient needs by `clone`: an Identity kernel run through the whole kernel path (its scope, its
// profiling hooks) plus a tape node of its own, which the backward pass then filters out again.
// On wasm (gradwire's Identity, register.ts), cpu and webgpu, Identity is itself a second reference
// to the buffer (incRef), so the same tensor can be made directly: the digits MLP's training step
// ran 17 such Identity kernels and as many extra tape nodes.
//
// Only at the first level of recording (gradientDepth 1: tf.grad, variableGrads, an optimizer's
// minimize): under a nested gradient the clone's tape node is what carries a second-order gradient
// from the saved tensor back to its source, so deeper levels keep tfjs's clone. Strings and complex
// values keep it too.
import type { Tf } from "../tf.ts"
import type { TensorInfo } from "./wasm-heap.ts"

type Tensor = import("@tensorflow/tfjs").Tensor

/** What of tfjs-core's engine this patch uses. */
interface EngineInternals {
  state: { gradientDepth: number }
  backendName: string
  backend: { incRef(dataId: object): void }
  keep<T>(t: T): T
  clone(t: Tensor): Tensor
  makeTensorFromTensorInfo(info: TensorInfo, backend?: object): Tensor
  saveTensorsForBackwardMode(tensors: Tensor[]): Tensor[]
}

const PATCHED = Symbol.for("gradwire.savedTensors")
/** Saves made as second references in this process (for tests). */
export const savedTensorStats = { shared: 0, cloned: 0 }

/** Backends whose Identity is a second reference; wasm's is once register.ts replaced it. */
const sharing = new Set(["cpu", "webgpu"])

/** Marks wasm's Identity as a second reference (register.ts, once it replaced the backend's copy). */
export const wasmIdentityShares = (): void => void sharing.add("wasm")

let enabled = true
/** Turns the second references off (tfjs's clones) or back on, for tests and A/B runs. */
export const useSharedSaves = (on: boolean): void => void (enabled = on)

/** Patches tfjs-core's engine (once per process); true once installed. */
export const installSharedSaves = (tf: Tf): boolean => {
  const engine = tf.engine() as unknown as EngineInternals & { [PATCHED]?: true }
  if (engine[PATCHED]) return true
  const own = engine.saveTensorsForBackwardMode
  if (typeof own !== "function" || typeof engine.makeTensorFromTensorInfo !== "function") return false
  engine.saveTensorsForBackwardMode = function (this: EngineInternals, tensors: Tensor[]): Tensor[] {
    if (!enabled || this.state.gradientDepth !== 1 || !sharing.has(this.backendName)) {
      savedTensorStats.cloned += tensors.length
      return own.call(this, tensors)
    }
    const backend = this.backend
    return tensors.map((t) => {
      if (t.dtype === "string" || t.dtype === "complex64") {
        savedTensorStats.cloned++
        return this.keep(this.clone(t))
      }
      savedTensorStats.shared++
      backend.incRef(t.dataId)
      return this.keep(this.makeTensorFromTensorInfo({ dataId: t.dataId, shape: [...t.shape], dtype: t.dtype } as TensorInfo, backend))
    })
  }
  engine[PATCHED] = true
  return true
}
