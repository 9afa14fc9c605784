// The kernels tfjs-backend-wasm lacks and gradwire has no fast version of run through the pure-JS
// cpu backend's implementation: the inputs are read off the wasm heap, the cpu kernel runs, its
// outputs are written back. Slower than a native kernel (two copies and JS loops), but no model
// fails for want of one; each kernel that takes this path is recorded (fallbackKernelsUsed) so the
// worker can say so once and explain.txt can list them.
import type { Tf } from "../tf.ts"
import { heapArray, type KernelArgs, type KernelFunc, type TensorInfo, type WasmBackend } from "./wasm-heap.ts"

const used = new Set<string>()
const listeners = new Set<(kernel: string) => void>()

/** The kernels that ran on the cpu fallback in this process so far, in the order they first ran. */
export const fallbackKernelsUsed = (): string[] => [...used]

/** Called once per kernel, the first time it runs on the fallback. */
export const onFallbackKernel = (f: (kernel: string) => void): (() => void) => {
  listeners.add(f)
  return () => listeners.delete(f)
}

const noteUse = (name: string): void => {
  if (used.has(name)) return
  used.add(name)
  for (const f of listeners) f(name)
}

type CpuBackend = {
  write(values: unknown, shape: number[], dtype: string): object
  readSync(dataId: object): ArrayLike<number> | Uint8Array[]
  disposeData(dataId: object, force?: boolean): boolean
}

/**
 * A wasm kernel that runs `name`'s cpu-backend implementation. `record` false for a kernel gradwire
 * routes there on purpose (a wrong wasm one replaced), which is not a missing kernel to report.
 */
export const cpuFallback = (tf: Tf, name: string, record = true): KernelFunc => {
  return ({ inputs, backend, attrs }: KernelArgs) => {
    const cpuKernel = tf.getKernel(name, "cpu")
    const cpu = tf.findBackend("cpu") as unknown as CpuBackend | null
    if (!cpuKernel || !cpu) throw new Error(`kernel ${name}: neither the wasm nor the cpu backend implements it`)
    if (record) noteUse(name)
    const moved: TensorInfo[] = []
    // Some kernels (Einsum, AddN) take their inputs as an array, not by name: kept as they came.
    const cpuInputs: Record<string, TensorInfo> | TensorInfo[] = Array.isArray(inputs) ? [] : {}
    try {
      for (const [k, t] of Object.entries(inputs)) {
        if (t.dtype === "complex64") throw new Error(`kernel ${name}: complex64 tensors do not live on the wasm backend`)
        const values = (backend as WasmBackend).readSync(t.dataId)
        const moved1 = { dataId: cpu.write(values, t.shape, t.dtype), shape: t.shape, dtype: t.dtype }
        moved.push(moved1)
        ;(cpuInputs as Record<string, TensorInfo>)[k] = moved1
      }
      const result = (cpuKernel.kernelFunc as unknown as (a: unknown) => TensorInfo | TensorInfo[])({ inputs: cpuInputs, backend: cpu, attrs })
      const outs = Array.isArray(result) ? result : [result]
      const back = outs.map((o) => {
        const values = cpu.readSync(o.dataId)
        const w = backend.makeOutput(o.shape, o.dtype)
        if (o.dtype === "string") throw new Error(`kernel ${name}: string outputs are not supported on the wasm fallback`)
        ;(heapArray(backend, w) as Float32Array).set(values as ArrayLike<number>)
        cpu.disposeData(o.dataId, true)
        return w
      })
      return Array.isArray(result) ? back : back[0]
    } finally {
      for (const t of moved) cpu.disposeData(t.dataId, true)
    }
  }
}
