// BatchMatMul and _FusedMatMul with a transposed operand: tfjs-backend-wasm runs those through a
// slow loop (0.8-3 GFLOP/s here, against 14-37 for the same product untransposed), and every dense
// layer's backward pass asks for them (dW = xᵀ·dy, dx = dy·Wᵀ). The operand is transposed first
// with the backend's own Transpose (O(m·k), small next to the O(m·k·n) product), then the backend's
// fast path multiplies.
import type { Tf } from "../tf.ts"
import { callKernel, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

const swapLast = (t: TensorInfo): number[] => {
  const perm = t.shape.map((_, i) => i)
  const r = perm.length
  ;[perm[r - 2], perm[r - 1]] = [perm[r - 1]!, perm[r - 2]!]
  return perm
}

/** `original` (the backend's matmul kernel), fed untransposed operands. */
export const untransposedMatMul = (tf: Tf, original: KernelFunc): KernelFunc => (args: KernelArgs) => {
  const { inputs, backend, attrs } = args
  const ta = attrs.transposeA === true
  const tb = attrs.transposeB === true
  if ((!ta && !tb) || inputs.a.dtype !== "float32" || inputs.b.dtype !== "float32") return original(args)
  const temps: TensorInfo[] = []
  const plain = (t: TensorInfo): TensorInfo => {
    const out = callKernel(tf, "Transpose", { inputs: { x: t }, backend, attrs: { perm: swapLast(t) } })
    temps.push(out)
    return out
  }
  try {
    return original({ inputs: { ...inputs, a: ta ? plain(inputs.a) : inputs.a, b: tb ? plain(inputs.b) : inputs.b }, backend, attrs: { ...attrs, transposeA: false, transposeB: false } })
  } finally {
    for (const t of temps) backend.disposeData(t.dataId)
  }
}
