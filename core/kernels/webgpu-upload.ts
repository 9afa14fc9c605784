// How the webgpu backend puts a tensor's CPU values on the GPU: with the queue's writeBuffer into a
// buffer from tfjs's own pool, instead of tfjs-backend-webgpu 4.22's way, which creates a new
// mapped-at-creation staging buffer for every upload (not pooled: `acquireBuffer(..., reuse
// false)`), copies it over and destroys it after the next submit. Every batch, and every scalar a
// kernel makes on the CPU (a mean's divisor, batch norm's epsilon), is such an upload. On an NVIDIA
// H200 through Dawn and Vulkan those buffer creations took 23% of the main thread's time in a plain
// tfjs training step (the zoo's MLP; a CPU profile, `device.createBuffer` under `uploadToGPU`): each
// one is a GPU memory allocation, and the `webgpu` package tracks each with a weak reference.
//
// The write is ordered as tfjs's staging copy was: writeBuffer lands on the queue after everything
// already submitted and before the command buffer tfjs is still recording, and a buffer is in
// tfjs's free pool only when no unsubmitted command uses it (tfjs defers the release of a buffer
// its current command buffer uses until the submit). tfjs writes its kernels' uniforms this way.
//
// Installed on the backend instance once webgpu is up (`../engine.ts`); it leaves tfjs's own
// upload in place when the backend lacks what it relies on (tfjs-backend-webgpu 4.x internals).
import type { Tf } from "../tf.ts"

interface TensorData {
  values: ArrayLike<number> | null | undefined
  resource?: unknown
  dtype: string
  shape: ReadonlyArray<number>
}
interface Queue {
  writeBuffer(buffer: unknown, offset: number, data: ArrayBufferLike, dataOffset: number, size: number): void
}
interface WebGpuBackend {
  tensorMap: { get(id: object): TensorData | undefined }
  bufferManager: { acquireBuffer(size: number, usage: number, mappedAtCreation?: boolean, reuse?: boolean): unknown }
  queue: Queue
  uploadToGPU: ((id: object) => void) & { [PATCHED]?: true }
}

/** Marks gradwire's upload function, so that a second install keeps the first. */
const PATCHED = Symbol.for("gradwire.webgpuUpload")

/** GPUBufferUsage's STORAGE | COPY_SRC | COPY_DST: the usage tfjs gives every tensor buffer. */
const TENSOR_USAGE = 0x0080 | 0x0004 | 0x0008

/** The values as the 32-bit array the GPU buffer holds: int32 for int32 and bool, float32 otherwise. */
const asGpuArray = (values: ArrayLike<number>, dtype: string): Int32Array | Float32Array => {
  if (dtype === "int32" || dtype === "bool") return values instanceof Int32Array ? values : Int32Array.from(values)
  return values instanceof Float32Array ? values : Float32Array.from(values)
}

const looksLikeTfjsWebGpu = (b: Partial<WebGpuBackend>): b is WebGpuBackend =>
  typeof b.uploadToGPU === "function" &&
  typeof b.tensorMap?.get === "function" &&
  typeof b.bufferManager?.acquireBuffer === "function" &&
  typeof b.queue?.writeBuffer === "function"

/**
 * Makes the webgpu backend of `tf` upload through the queue's writeBuffer into pooled buffers.
 * Returns whether it did (false on another backend, or a tfjs whose webgpu backend differs).
 */
export const installWebGpuUpload = (tf: Tf): boolean => {
  if (tf.getBackend() !== "webgpu") return false
  const backend = tf.backend() as unknown as Partial<WebGpuBackend>
  if (!looksLikeTfjsWebGpu(backend)) return false
  if (backend.uploadToGPU[PATCHED]) return true
  const own = backend.uploadToGPU.bind(backend)
  const upload = (dataId: object): void => {
    const data = backend.tensorMap.get(dataId)
    // Already on the GPU, or nothing to upload (an output buffer): tfjs's own code.
    if (!data || data.resource != null || !data.values || (data.dtype !== "float32" && data.dtype !== "int32" && data.dtype !== "bool")) return own(dataId)
    const array = asGpuArray(data.values, data.dtype)
    const size = array.byteLength
    if (size === 0) return own(dataId)
    const buffer = backend.bufferManager.acquireBuffer(size, TENSOR_USAGE)
    backend.queue.writeBuffer(buffer, 0, array.buffer, array.byteOffset, size)
    // As tfjs does once uploaded: the values live on the GPU only.
    data.values = null
    data.resource = buffer
  }
  backend.uploadToGPU = Object.assign(upload, { [PATCHED]: true as const })
  return true
}
