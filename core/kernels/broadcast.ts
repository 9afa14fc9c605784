// Broadcasting binary ops outside XNNPACK's reach (comparisons, maximum/minimum, pow, ...) run
// through tfjs-backend-wasm's generic indexing loop: 4 ms for a [32, 56, 32] vs [32, 1, 32]
// comparison, 30x the same op on equal shapes. The gradient of every max-pool-like reduction does
// exactly that (equal(x, max)). Here each operand is first tiled to the output's shape (tile.ts:
// block copies), then the backend's kernel runs on equal shapes. The comparisons themselves (equal
// shapes or tiled) run here, on the heap: tfjs-backend-wasm's took 262 µs for 57k float32 elements
// (the embedding model's global max-pool gradient), a JavaScript loop about a fifth of that.
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

/** The comparisons run on the heap, on operands of one numeric dtype and one shape. */
const COMPARISONS = new Set(["Equal", "NotEqual", "Greater", "GreaterEqual", "Less", "LessEqual"])

/** out[i] = a[i] (op) b[i] as 1 or 0, one loop per comparison (NaN compares as in JavaScript, as tfjs's cpu backend does). */
export const compareInto = (op: string, a: ArrayLike<number>, b: ArrayLike<number>, out: Uint8Array | Int32Array): void => {
  const n = out.length
  switch (op) {
    case "Equal":
      for (let i = 0; i < n; i++) out[i] = a[i] === b[i] ? 1 : 0
      return
    case "NotEqual":
      for (let i = 0; i < n; i++) out[i] = a[i] !== b[i] ? 1 : 0
      return
    case "Greater":
      for (let i = 0; i < n; i++) out[i] = a[i]! > b[i]! ? 1 : 0
      return
    case "GreaterEqual":
      for (let i = 0; i < n; i++) out[i] = a[i]! >= b[i]! ? 1 : 0
      return
    case "Less":
      for (let i = 0; i < n; i++) out[i] = a[i]! < b[i]! ? 1 : 0
      return
    case "LessEqual":
      for (let i = 0; i < n; i++) out[i] = a[i]! <= b[i]! ? 1 : 0
      return
    default:
      throw new Error(`compareInto: ${op} is not a comparison`)
  }
}

/** out[i] = a[i] (op) y as 1 or 0: a comparison with one number (NaN compares as in JavaScript). */
export const compareWith = (op: string, a: ArrayLike<number>, y: number, out: Uint8Array | Int32Array): void => {
  const n = out.length
  switch (op) {
    case "Equal":
      for (let i = 0; i < n; i++) out[i] = a[i] === y ? 1 : 0
      return
    case "NotEqual":
      for (let i = 0; i < n; i++) out[i] = a[i] !== y ? 1 : 0
      return
    case "Greater":
      for (let i = 0; i < n; i++) out[i] = a[i]! > y ? 1 : 0
      return
    case "GreaterEqual":
      for (let i = 0; i < n; i++) out[i] = a[i]! >= y ? 1 : 0
      return
    case "Less":
      for (let i = 0; i < n; i++) out[i] = a[i]! < y ? 1 : 0
      return
    case "LessEqual":
      for (let i = 0; i < n; i++) out[i] = a[i]! <= y ? 1 : 0
      return
    default:
      throw new Error(`compareWith: ${op} is not a comparison`)
  }
}

/** x (op) y as y (mirror) x: the comparison with its operands swapped. */
const MIRROR: Readonly<Record<string, string>> = { Equal: "Equal", NotEqual: "NotEqual", Greater: "Less", GreaterEqual: "LessEqual", Less: "Greater", LessEqual: "GreaterEqual" }

const size = (t: TensorInfo): number => t.shape.reduce((p, d) => p * d, 1)

/** Which operand is a single number whose broadcast leaves the other's shape as the output's, if one is. */
const singleSide = (a: TensorInfo, b: TensorInfo): "a" | "b" | undefined =>
  size(b) === 1 && b.shape.length <= a.shape.length ? "b" : size(a) === 1 && a.shape.length <= b.shape.length ? "a" : undefined

/**
 * A comparison on the heap (bool output) of two numeric operands of one dtype, either of one shape
 * or one of them a single number (a clip's bounds, a threshold: the other's shape is the output's);
 * undefined for anything else.
 */
const compareOnHeap = (name: string, { inputs, backend }: KernelArgs): TensorInfo | undefined => {
  const { a, b } = inputs
  const numeric = (t: TensorInfo | undefined): t is TensorInfo => t !== undefined && (t.dtype === "float32" || t.dtype === "int32")
  if (!numeric(a) || !numeric(b) || a.dtype !== b.dtype) return undefined
  if (same(a.shape, b.shape)) {
    const out = backend.makeOutput([...a.shape], "bool")
    compareInto(name, backend.typedArrayFromHeap(a), backend.typedArrayFromHeap(b), backend.typedArrayFromHeap(out) as Uint8Array)
    return out
  }
  // One side a single number, the other at least as many dimensions (so its shape is the output's).
  const one = singleSide(a, b)
  if (!one) return undefined
  const [many, single, op] = one === "b" ? [a, b, name] : [b, a, MIRROR[name]!]
  const out = backend.makeOutput([...many.shape], "bool")
  compareWith(op, backend.typedArrayFromHeap(many), backend.typedArrayFromHeap(single)[0]!, backend.typedArrayFromHeap(out) as Uint8Array)
  return out
}

export const broadcastFirst = (tf: Tf, original: KernelFunc, name = ""): KernelFunc => {
  // The comparisons on the heap where they apply (equal shapes, a single number, or once tiled), else `original`.
  const comparison = COMPARISONS.has(name)
  const run: KernelFunc = comparison ? (args) => compareOnHeap(name, args) ?? original(args) : original
  return (args: KernelArgs) => {
    const { inputs, backend } = args
    const { a, b } = inputs
    if (!a || !b || same(a.shape, b.shape) || a.dtype === "string" || b.dtype === "string") return run(args)
    // A comparison with a single number: no tiling.
    if (comparison) {
      const direct = compareOnHeap(name, args)
      if (direct) return direct
    }
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
      return run({ ...args, inputs: { ...inputs, a: expand(a), b: expand(b) } })
    } finally {
      for (const t of temps) backend.disposeData(t.dataId)
    }
  }
}
