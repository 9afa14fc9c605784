// Broadcasting binary ops outside XNNPACK's reach (comparisons, maximum/minimum, pow, ...) run
// through tfjs-backend-wasm's generic indexing loop: 4 ms for a [32, 56, 32] vs [32, 1, 32]
// comparison, 30x the same op on equal shapes. The gradient of every max-pool-like reduction does
// exactly that (equal(x, max)). Here each operand is first tiled to the output's shape (tile.ts:
// block copies), then the backend's kernel runs on equal shapes.
import type { Tf } from "../tf.ts"
import { tile } from "./tile.ts"
import type { KernelArgs, KernelFunc, TensorInfo } from "./wasm-heap.ts"

/** The wasm kernels wrapped (those whose broadcasting is slow; Add, Sub, Mul, RealDiv are fast already). */
export const SLOW_BROADCAST_KERNELS = [
  "Equal",
  "NotEqual",
  "Greater",
  "GreaterEqual",
  "Less",
  "LessEqual",
  "Maximum",
  "Minimum",
  "Pow",
  "LogicalAnd",
  "LogicalOr",
  "FloorDiv"
] as const

const same = (a: readonly number[], b: readonly number[]): boolean => a.length === b.length && a.every((d, i) => d === b[i])

export const broadcastFirst = (tf: Tf, original: KernelFunc): KernelFunc => (args: KernelArgs) => {
  const { inputs, backend } = args
  const { a, b } = inputs
  if (!a || !b || same(a.shape, b.shape) || a.dtype === "string" || b.dtype === "string") return original(args)
  const out = tf.backend_util.assertAndGetBroadcastShape(a.shape, b.shape)
  const temps: TensorInfo[] = []
  const expand = (t: TensorInfo): TensorInfo => {
    if (same(t.shape, out)) return t
    const padded = [...new Array<number>(out.length - t.shape.length).fill(1), ...t.shape]
    const full = tile({ inputs: { x: { dataId: t.dataId, shape: padded, dtype: t.dtype } }, backend, attrs: { reps: out.map((d, i) => d / padded[i]!) } })
    temps.push(full)
    return full
  }
  try {
    return original({ ...args, inputs: { ...inputs, a: expand(a), b: expand(b) } })
  } finally {
    for (const t of temps) backend.disposeData(t.dataId)
  }
}
