// The few things gradwire's own wasm kernels need from tfjs's wasm backend: views of a tensor's
// bytes on the wasm heap (no copy), a fresh output on that heap, and another registered kernel to
// call (the backend's own matmul). Kept to structural types so the rest of gradwire does not
// depend on the backend's private classes.
import type { Tf } from "../tf.ts"
import { HeapExhausted } from "../errors.ts"

type DataType = "float32" | "int32" | "bool" | "complex64" | "string"

/** A tensor as kernels see it: its storage key on the backend, shape and dtype. */
export interface TensorInfo {
  readonly dataId: object
  readonly shape: number[]
  readonly dtype: DataType
}

/**
 * A view of tensor `t`'s bytes on the wasm heap (no copy). Where the heap could not grow to hold it
 * (tfjs's allocation failed and left a place the view runs past), a HeapExhausted that says so
 * and what to do, instead of the typed array's RangeError.
 */
export const heapArray = (backend: Pick<WasmBackend, "typedArrayFromHeap">, t: TensorInfo): Float32Array | Int32Array | Uint8Array => {
  try {
    return backend.typedArrayFromHeap(t)
  } catch (e) {
    if (!(e instanceof RangeError)) throw e
    const bytes = t.shape.reduce((a, b) => a * b, 1) * (t.dtype === "bool" ? 1 : 4)
    const heap = (backend as { wasm?: { HEAPU8?: { buffer?: ArrayBufferLike } } }).wasm?.HEAPU8?.buffer?.byteLength ?? 0
    throw new HeapExhausted({ backend: "wasm", shape: [...t.shape], bytes, heapBytes: heap })
  }
}

/** What gradwire uses of tfjs-backend-wasm's BackendWasm. */
export interface WasmBackend {
  makeOutput(shape: number[], dtype: DataType): TensorInfo
  typedArrayFromHeap(t: TensorInfo): Float32Array | Int32Array | Uint8Array
  disposeData(dataId: object, force?: boolean): boolean
  readSync(dataId: object): unknown
  write(values: unknown, shape: number[], dtype: DataType): object
}

export type Attrs = Record<string, unknown>
export type KernelArgs = { inputs: Record<string, TensorInfo>; backend: WasmBackend; attrs: Attrs }
export type KernelFunc = (args: KernelArgs) => TensorInfo | TensorInfo[]

export const floats = (backend: WasmBackend, t: TensorInfo): Float32Array => {
  const a = backend.typedArrayFromHeap(t)
  return a instanceof Float32Array ? a : Float32Array.from(a)
}

export const ints = (backend: WasmBackend, t: TensorInfo): Int32Array => {
  const a = backend.typedArrayFromHeap(t)
  return a instanceof Int32Array ? a : Int32Array.from(a)
}

/** Calls another kernel registered for wasm (its outputs belong to the caller). */
export const callKernel = (tf: Tf, name: string, args: KernelArgs): TensorInfo => {
  const k = tf.getKernel(name, "wasm")
  if (!k) throw new Error(`the wasm backend has no ${name} kernel`)
  const out = (k.kernelFunc as unknown as KernelFunc)(args)
  return Array.isArray(out) ? out[0] : out
}
