// Registers the kernels tfjs-backend-wasm 4.22 lacks, so that every tfjs layer trains on the
// default backend: fast ones on the wasm heap for the convolution gradients and the gather gradient
// (conv-grads.ts, segment-sum.ts), and the cpu backend's implementation for every other kernel the
// cpu backend has and wasm does not (fallback.ts). Idempotent; called once the wasm backend is up.
import type { Tf } from "../tf.ts"
import { conv2dBackpropFilter, conv2dBackpropInput, depthwiseBackpropFilter, depthwiseBackpropInput } from "./conv-grads.ts"
import { cpuFallback } from "./fallback.ts"
import { registerMissingGradients } from "./gradients.ts"
import { maxPoolGrad } from "./pool-grads.ts"
import { unsortedSegmentSum } from "./segment-sum.ts"
import { BATCH_NORM_GRAD, registerBatchNormGrad } from "./batch-norm-grad.ts"
import { wasmIdentityShares } from "./saved-tensors.ts"
import { CLIP_GRAD, RELU_GRAD, registerClipGrad, registerReluGrad } from "./relu-grad.ts"
import { heapKernels, heapKernelsStatus } from "./heap-simd.ts"
import { blockMaxMin, blockReduce, registerBlockMaxMinGradients } from "./reduce.ts"
import { tile } from "./tile.ts"
import { unpack } from "./unpack.ts"
import { gatherRows } from "./gather.ts"
import { fusedMatMulKernel, untransposedMatMul } from "./matmul.ts"
import { channelsLast, conv2dKernel, explicitSame, fusedConv2dKernel, winogradStatus } from "./conv2d.ts"
import { transposeKernel } from "./transpose.ts"
import { broadcastFirst, SLOW_BROADCAST_KERNELS } from "./broadcast.ts"
import type { KernelArgs, KernelFunc, TensorInfo, WasmBackend } from "./wasm-heap.ts"

/** The kernels gradwire implements natively on the wasm heap. */
export const FAST_WASM_KERNELS = [
  "Conv2DBackpropFilter",
  "DepthwiseConv2dNativeBackpropFilter",
  "DepthwiseConv2dNativeBackpropInput",
  "UnsortedSegmentSum"
] as const

/**
 * Kernels tfjs-backend-wasm 4.22 has but computes wrongly (test/wasm-layer-coverage.test.ts finds
 * them against finite differences), replaced: MaxPoolGrad by gradwire's own; the conv3d gradients
 * (the input's wrong at stride 1, the filter's at stride 2) by the cpu backend's; the convolutions
 * with "same" padding where a filter is narrower than its stride on one axis (XNNPACK's SAME flag;
 * the backend's own kernel with the padding written out, conv2d.ts explicitSame). And one that is
 * right but slow: Conv2D and FusedConv2D on narrow layers (conv2d.ts), Conv2DBackpropInput (conv-grads.ts), Tile (tile.ts), Unpack (unpack.ts), GatherV2 (gather.ts), the matmuls with a transposed operand (matmul.ts),
 * Transpose (transpose.ts), the broadcasting comparisons (broadcast.ts), Sum and Mean over a
 * block of leading or middle axes (reduce.ts), Max and Min there (reduce.ts), and Identity and a Cast to
 * the dtype a tensor has (each shares its input's buffer, as tfjs's cpu backend and wasm's own
 * Reshape do, where wasm's copied it: 26 copies of an activation in a residual CNN's step;
 * gradwire's in-place writers check that a buffer is not shared first).
 */
export const REPLACED_WASM_KERNELS = ["Conv2D", "FusedConv2D", "DepthwiseConv2dNative", "FusedDepthwiseConv2D", "Conv2DBackpropInput", "MaxPoolGrad", "Conv3DBackpropInputV2", "Conv3DBackpropFilterV2", "Tile", "Unpack", "BatchMatMul", "_FusedMatMul", "Transpose", "GatherV2", "Sum", "Mean", "Max", "Min", "Identity", "Cast", ...SLOW_BROADCAST_KERNELS] as const

let registered: { fast: string[]; fallback: string[]; gradients: string[] } | undefined

/** A second reference to x's buffer (the backend frees it when the last one is disposed). */
const secondReference = (args: KernelArgs, x: TensorInfo): TensorInfo => {
  ;(args.backend as unknown as { incRef(dataId: object): void }).incRef(x.dataId)
  return { dataId: x.dataId, shape: [...x.shape], dtype: x.dtype }
}

/** Identity as a second reference to its input's buffer (strings keep the backend's own). */
const sharedIdentity =
  (original: KernelFunc): KernelFunc =>
  (args) => {
    const { x } = args.inputs
    return x.dtype === "string" ? original(args) : secondReference(args, x)
  }

/**
 * Cast to the dtype a tensor already has as a second reference to its buffer, as tfjs's cpu backend
 * does (wasm's copied it: Identity's gradient casts dy to float32, two copies of a residual sum
 * a block in a ResNet's backward pass); a numeric tensor to bool as x ≠ 0 (wasm's stored the
 * number's low byte: 2 stayed 2, −1 became 255); other casts are the backend's.
 */
const sharedCast =
  (original: KernelFunc): KernelFunc =>
  (args) => {
    const { x } = args.inputs
    const dtype = args.attrs.dtype
    if (x.dtype === "string") return original(args)
    if (dtype === "bool" && x.dtype !== "bool") {
      const out = args.backend.makeOutput([...x.shape], "bool")
      const from = args.backend.typedArrayFromHeap(x)
      const to = args.backend.typedArrayFromHeap(out)
      for (let i = 0; i < from.length; i++) to[i] = from[i] !== 0 ? 1 : 0
      return out
    }
    return x.dtype === dtype ? secondReference(args, x) : original(args)
  }

/** A fast kernel with its own preconditions; outside them, the cpu fallback. */
const guarded = (fast: KernelFunc, ok: (a: KernelArgs) => boolean, slow: KernelFunc): KernelFunc => (args) => (ok(args) ? fast(args) : slow(args))

/**
 * Adds gradwire's kernels to the wasm backend's registry (the ones tfjs has not registered there
 * already, so a later tfjs with its own keeps them). Returns what it registered.
 */
export const registerWasmKernels = (tf: Tf): { fast: string[]; fallback: string[]; gradients: string[] } => {
  if (registered) return registered
  const has = (name: string): boolean => tf.getKernel(name, "wasm") !== undefined
  const fast: string[] = []
  const fallback: string[] = []
  const register = (name: string, kernelFunc: KernelFunc): void => {
    tf.registerKernel({ kernelName: name, backendName: "wasm", kernelFunc: kernelFunc as never })
  }
  const nhwc = (a: KernelArgs): boolean => channelsLast(a.attrs) && a.inputs[Object.keys(a.inputs)[0]].shape.length === 4
  const own: Record<(typeof FAST_WASM_KERNELS)[number], KernelFunc> = {
    Conv2DBackpropFilter: guarded((a) => conv2dBackpropFilter(tf, a), (a) => nhwc(a) && a.inputs.x.dtype === "float32", cpuFallback(tf, "Conv2DBackpropFilter")),
    DepthwiseConv2dNativeBackpropFilter: guarded((a) => depthwiseBackpropFilter(tf, a), nhwc, cpuFallback(tf, "DepthwiseConv2dNativeBackpropFilter")),
    DepthwiseConv2dNativeBackpropInput: guarded((a) => depthwiseBackpropInput(tf, a), nhwc, cpuFallback(tf, "DepthwiseConv2dNativeBackpropInput")),
    UnsortedSegmentSum: guarded(unsortedSegmentSum, (a) => a.inputs.x.dtype === "float32" || a.inputs.x.dtype === "int32", cpuFallback(tf, "UnsortedSegmentSum"))
  }
  const replace = (name: string, f: KernelFunc): void => {
    if (has(name)) tf.unregisterKernel(name, "wasm")
    register(name, f)
  }
  // Convolutions whose filter fits the caches by gradwire's SIMD kernel, bias and ReLU in the same
  // pass (conv2d.ts); the input gradient below is one of them at stride 1.
  const wasmConv = tf.getKernel("Conv2D", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmConv) replace("Conv2D", conv2dKernel(tf, wasmConv))
  const wasmFusedConv = tf.getKernel("FusedConv2D", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmFusedConv) replace("FusedConv2D", fusedConv2dKernel(tf, wasmFusedConv))
  // Depthwise convolutions keep the backend's, with "same" padding written out (conv2d.ts explicitSame).
  for (const name of ["DepthwiseConv2dNative", "FusedDepthwiseConv2D"]) {
    const original = tf.getKernel(name, "wasm")?.kernelFunc as unknown as KernelFunc | undefined
    if (original) replace(name, (a) => original(explicitSame(tf, a, true)))
  }
  const wasmConvInput = tf.getKernel("Conv2DBackpropInput", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmConvInput) replace("Conv2DBackpropInput", guarded((a) => conv2dBackpropInput(tf, a), (a) => nhwc(a) && a.inputs.dy.dtype === "float32", wasmConvInput))
  replace("MaxPoolGrad", guarded((a) => maxPoolGrad(tf, a), nhwc, cpuFallback(tf, "MaxPoolGrad")))
  // Faster than tfjs-backend-wasm's for the numeric dtypes (tile.ts); strings keep the backend's own.
  const wasmTile = tf.getKernel("Tile", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmTile) replace("Tile", guarded(tile, (a) => a.inputs.x.dtype !== "string", wasmTile))
  const wasmUnpack = tf.getKernel("Unpack", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmUnpack) replace("Unpack", unpack(wasmUnpack))
  // The backward pass's transposed products through the backend's fast untransposed path, and
  // batched and cache-sized products through gradwire's SIMD kernel (matmul.ts).
  // _FusedMatMul (a dense layer's forward) as that SIMD product, then its bias and activation.
  for (const mm of ["BatchMatMul", "_FusedMatMul"]) {
    const original = tf.getKernel(mm, "wasm")?.kernelFunc as unknown as KernelFunc | undefined
    if (original) replace(mm, mm === "BatchMatMul" ? untransposedMatMul(tf, original, true) : fusedMatMulKernel(tf, untransposedMatMul(tf, original, false)))
  }
  // Transposes that move one group of axes past another, in cache-sized tiles (transpose.ts).
  const wasmTranspose = tf.getKernel("Transpose", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmTranspose) replace("Transpose", transposeKernel(wasmTranspose))
  const wasmIdentity = tf.getKernel("Identity", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmIdentity) {
    replace("Identity", sharedIdentity(wasmIdentity))
    wasmIdentityShares()
  }
  const wasmCast = tf.getKernel("Cast", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmCast) replace("Cast", sharedCast(wasmCast))
  const wasmGather = tf.getKernel("GatherV2", "wasm")?.kernelFunc as unknown as KernelFunc | undefined
  if (wasmGather) replace("GatherV2", gatherRows(wasmGather))
  // Sum and Mean over leading or middle axes, summed straight from the heap; Max and Min there,
  // and their gradient, by the heap's SIMD kernels (reduce.ts).
  for (const [name, mean] of [["Sum", false], ["Mean", true]] as const) {
    const original = tf.getKernel(name, "wasm")?.kernelFunc as unknown as KernelFunc | undefined
    if (original) replace(name, blockReduce(original, mean))
  }
  for (const [name, min] of [["Max", false], ["Min", true]] as const) {
    const original = tf.getKernel(name, "wasm")?.kernelFunc as unknown as KernelFunc | undefined
    if (original) replace(name, blockMaxMin(original, min))
  }
  registerBlockMaxMinGradients(tf)
  // Broadcasting comparisons and the like on equal shapes (broadcast.ts).
  const broadcasting: string[] = []
  for (const k of SLOW_BROADCAST_KERNELS) {
    const original = tf.getKernel(k, "wasm")?.kernelFunc as unknown as KernelFunc | undefined
    if (!original) continue
    replace(k, broadcastFirst(tf, original, k))
    broadcasting.push(k)
  }
  replace("Conv3DBackpropInputV2", cpuFallback(tf, "Conv3DBackpropInputV2", false))
  replace("Conv3DBackpropFilterV2", cpuFallback(tf, "Conv3DBackpropFilterV2", false))
  for (const [name, f] of Object.entries(own)) {
    if (has(name)) continue
    register(name, f)
    fast.push(name)
  }
  for (const k of tf.getKernelsForBackend("cpu")) {
    if (has(k.kernelName)) continue
    register(k.kernelName, cpuFallback(tf, k.kernelName))
    fallback.push(k.kernelName)
  }
  // Batch norm's backward pass as one kernel on wasm (batch-norm-grad.ts).
  if (registerBatchNormGrad(tf)) fast.push(BATCH_NORM_GRAD)
  // ReLU's gradient as one kernel on wasm (relu-grad.ts).
  if (registerReluGrad(tf)) fast.push(RELU_GRAD)
  // clipByValue's gradient (ReLU6) as one kernel on wasm (relu-grad.ts).
  if (registerClipGrad(tf)) fast.push(CLIP_GRAD)
  registered = { fast, fallback, gradients: registerMissingGradients(tf) }
  // Instantiated now rather than at the first kernel that asks (a few ms), so that explain.txt,
  // written before the first step, says whether they are in use and why not.
  if (tf.getBackend() === "wasm") heapKernels(tf.backend() as unknown as WasmBackend)
  return registered
}

/**
 * explain.txt's lines about this process's backend and kernels: which kernels gradwire added or
 * replaced on wasm, and which ran on the cpu fallback so far.
 */
export const describeKernels = (backend: string, rank: number, fallbackUsed: readonly string[], choice = "", gpus = ""): { text: string; json: Record<string, unknown> } => {
  const reg = registered
  const lines = [`rank ${rank}: backend ${backend}${gpus ? ` on GPU ${gpus}` : ""}${choice ? ` (${choice})` : ""}`]
  const json: Record<string, unknown> = { rank, backend, ...(gpus ? { gpus } : {}), ...(choice ? { choice } : {}) }
  if (backend === "wasm" && reg) {
    lines.push(`  gradwire's wasm kernels: ${reg.fast.join(", ") || "none needed"}; replaced (wrong or slow in tfjs-backend-wasm): ${REPLACED_WASM_KERNELS.join(", ")}`)
    lines.push(`  cpu-backend fallback registered for: ${reg.fallback.join(", ") || "none"}`)
    lines.push(`  SIMD kernels on the wasm heap (matmuls, convolutions and their gradients (depthwise too), max-pool, ReLU and clip gradients, normalization, the LSTM and GRU cells, transposes, Adam): ${heapKernelsStatus()}`)
    lines.push(`  3x3 convolutions at stride 1 (8-512 input channels): ${winogradStatus()}`)
    json.heapSimd = heapKernelsStatus()
    json.winograd = winogradStatus()
    json.fast = reg.fast
    json.replaced = [...REPLACED_WASM_KERNELS]
    json.fallbackRegistered = reg.fallback
  }
  lines.push(`  ran on the cpu-backend fallback (slow path): ${fallbackUsed.length ? fallbackUsed.join(", ") : "none"}`)
  json.fallbackUsed = [...fallbackUsed]
  return { text: lines.join("\n"), json }
}
