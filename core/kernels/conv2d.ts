// Conv2D and FusedConv2D on wasm (channels-last, dilation 1, float32) by gradwire's SIMD kernel on
// the heap (simd/heap-kernels.wat.mjs, conv2d), with bias and ReLU in the same pass, where
// tfjs-backend-wasm's XNNPACK convolution had run at 7-25 GFLOP/s on the zoo's narrow layers. The
// input is copied once into a zero-padded buffer (none for "valid" padding), so that every tap of
// every output pixel is inside it and the kernel has no bounds to test. The conv2d input gradient
// at stride 1 (conv-grads.ts) is such a convolution too.
//
// Measured against the backend's Conv2D, alternated in one process (2-core EPYC, batch 32 unless
// named), µs: [8, 8, 16] 3x3 -> 16: 412 -> 313; [8, 8, 1] 3x3 -> 16: 66 -> 48; [28, 28, 1] 5x5 -> 6:
// 890 -> 565; [14, 14, 6] 5x5 -> 16: 612 -> 468; its input gradient [10, 10, 16] 5x5 -> 6 padded 4:
// 1640 -> 1335; [1, 64, 8] 1x9 -> 32: 376 -> 257; [16, 16, 32] 3x3 -> 32: 5877 -> 4709; batch 8
// [32, 32, 64] 3x3 -> 64: 22.8 -> 20.6 ms. The backend's kernel stays faster where a 16-column slab
// of the filter outgrows the first-level cache (batch 8 [14, 14, 128] 3x3 -> 128: 17.9 against 24.2
// ms) and for 1x1 filters (a plain matmul: [14, 14, 64] -> 256: 1.9 against 2.3 ms): those keep it,
// except 1x1 filters at stride 1 without padding, which run as gradwire's BatchMatMul instead
// (pointwiseConv2d below: XNNPACK's convolution packs a training step's new filter on every call).
// A 3x3 filter at stride 1 (winogradFits) runs as Winograd's F(4x4, 3x3) (winogradConv2d below),
// with tiles of 2 or 3 outputs at the end of a side that is not a multiple of 4, a quarter of the
// multiply-adds: [32, 8, 8, 16] -> 16 213 -> 132 µs, [8, 16, 16, 64] -> 64 3110 -> 1119
// (bench/winograd.ts).
import * as settings from "../settings.ts"
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels, roomAfter, type HeapKernels, type WinogradSide } from "./heap-simd.ts"
import { callKernel, floats, type KernelArgs, type KernelFunc, type TensorInfo } from "./wasm-heap.ts"

/**
 * tfjs's own shape arithmetic for a channels-last 2-D convolution (the filter and input gradients
 * have no dilations attribute: 1). `depthwise` reads the filter as [fh, fw, inC, multiplier].
 */
export const convInfo = (tf: Tf, xShape: number[], filterShape: number[], attrs: Record<string, unknown>, depthwise: boolean) =>
  tf.backend_util.computeConv2DInfo(
    xShape as [number, number, number, number],
    filterShape as [number, number, number, number],
    attrs.strides as [number, number] | number,
    (attrs.dilations ?? 1) as [number, number] | number,
    attrs.pad as "same",
    attrs.dimRoundingMode as "floor" | undefined,
    depthwise,
    "channelsLast"
  )

/** Whether a kernel call's data is laid out as the fast paths expect (NHWC). */
export const channelsLast = (attrs: Record<string, unknown>): boolean => {
  const f = attrs.dataFormat
  return f === undefined || f === "NHWC" || f === "channelsLast"
}

/**
 * x [N, H, W, C] copied into a zeroed [N, HP, WP, C] at row `top`, column `left` (rows and columns
 * past HP, WP left out), with `slack` more zero floats after it for kernels that read past a row.
 * The caller disposes of it.
 */
export const padImage = (backend: KernelArgs["backend"], x: TensorInfo, HP: number, WP: number, top: number, left: number, slack = 0): TensorInfo => {
  const [N, H, W, C] = x.shape as [number, number, number, number]
  const padded = backend.makeOutput([N * HP * WP * C + slack], "float32")
  const kernels = C % 4 === 0 && slack === 0 ? heapKernels(backend) : undefined
  if (kernels) {
    kernels.padImage(addressOf(backend, x), addressOf(backend, padded), N, H, W, C, HP, WP, top, left)
    return padded
  }
  const from = floats(backend, x)
  const to = floats(backend, padded)
  to.fill(0)
  const rows = Math.min(H, HP - top)
  const width = Math.min(W, WP - left) * C
  for (let b = 0; b < N; b++) {
    for (let h = 0; h < rows; h++) {
      const src = (b * H + h) * W * C
      to.set(from.subarray(src, src + width), ((b * HP + h + top) * WP + left) * C)
    }
  }
  return padded
}

/** The most filter taps (fh·fw·inC) the SIMD kernel takes: its 16-column slab of the filter, 36 KiB, stays in the first-level cache. */
export const SIMD_CONV_MAX_TAPS = 576

/** Convolutions the SIMD kernel ran in this process (for tests). */
export const simdConvStats = { calls: 0 }

/**
 * y = conv2d(x, filter) (+ bias) (ReLU with `relu`) by the SIMD kernel, or undefined where it does
 * not apply (the caller runs the backend's kernel).
 */
export const simdConv2d = (tf: Tf, backend: KernelArgs["backend"], x: TensorInfo, filter: TensorInfo, bias: TensorInfo | undefined, attrs: KernelArgs["attrs"], relu: boolean): TensorInfo | undefined => {
  if (x.dtype !== "float32" || filter.dtype !== "float32" || x.shape.length !== 4 || filter.shape.length !== 4 || !channelsLast(attrs)) return undefined
  const [FH, FW, C, O] = filter.shape as [number, number, number, number]
  if (FH === 1 && FW === 1 && x.shape[3] === C) {
    // At stride 1 a product of x as it is; strided (a ResNet's projection shortcut), of the pixels it
    // reads (patchConv2d), where XNNPACK's convolution took 1.6x as long: [32, 32, 32, 64] stride 2
    // -> 128 5.63 -> 3.54 ms, [32, 8, 8, 256] -> 512 4.53 -> 2.84.
    const kernels = heapKernels(backend)
    return pointwiseConv2d(tf, backend, x, filter, bias, attrs, relu) ?? (kernels ? patchConv2d(tf, backend, kernels, x, filter, bias, convInfo(tf, x.shape, filter.shape, attrs, false), relu) : undefined)
  }
  if (FH * FW < 2 || x.shape[3] !== C) return undefined
  if (bias && (bias.dtype !== "float32" || bias.shape.reduce((a, b) => a * b, 1) !== O || (bias.shape.length > 0 && bias.shape[bias.shape.length - 1] !== O))) return undefined
  const info = convInfo(tf, x.shape, filter.shape, attrs, false)
  const kernels = heapKernels(backend)
  if (!kernels) return undefined
  const fast = winogradConv2d(backend, kernels, x, filter, bias, info, relu) ?? (FH * FW * C > SIMD_CONV_MAX_TAPS || FH * FW * C * O >= PATCH_MIN_FILTER ? patchConv2d(tf, backend, kernels, x, filter, bias, info, relu) : undefined)
  if (fast) return fast
  if (FH * FW * C > SIMD_CONV_MAX_TAPS || info.dilationHeight !== 1 || info.dilationWidth !== 1) return undefined
  const { batchSize: N, inHeight: H, inWidth: W, outHeight: OH, outWidth: OW, strideHeight: SH, strideWidth: SW } = info
  const top = info.padInfo.top
  const left = info.padInfo.left
  if (top < 0 || left < 0 || OH < 1 || OW < 1 || N < 1) return undefined
  // With O not a multiple of 4 the kernel reads up to 12 bytes past the filter's and the bias's
  // ends (lanes it never stores): only where the heap goes on that far.
  if (O % 4 !== 0 && ![filter, ...(bias ? [bias] : [])].every((t) => roomAfter(backend, t, 16))) return undefined
  // The input as the kernel reads it: every tap of every output pixel inside, rows HP by WP.
  const HP = (OH - 1) * SH + FH
  const WP = (OW - 1) * SW + FW
  const inPlace = top === 0 && left === 0 && HP <= H && WP <= W
  const padded = inPlace ? undefined : padImage(backend, x, HP, WP, top, left)
  try {
    const y = backend.makeOutput([N, OH, OW, O], "float32")
    simdConvStats.calls++
    kernels.conv2d(
      addressOf(backend, padded ?? x),
      addressOf(backend, filter),
      bias ? addressOf(backend, bias) : 0,
      addressOf(backend, y),
      N,
      inPlace ? H : HP,
      inPlace ? W : WP,
      C,
      OH,
      OW,
      O,
      FH,
      FW,
      SH,
      SW,
      relu ? 1 : 0
    )
    return y
  } finally {
    if (padded) backend.disposeData(padded.dataId)
  }
}

/**
 * Filter floats (FH·FW·C·O) from which a convolution the direct kernel could take runs as its patch
 * matrix and the product instead (patchConv2d): the direct kernel reads the whole filter again for
 * every block of output pixels, so a filter over 288 KiB comes from the second-level cache each
 * time. Alternated in one process, ms, direct against patches: [32, 32, 32, 64] 3x3 stride 2 ->
 * 128 38.3 / 28.4, [32, 16, 16, 64] -> 128 7.66 / 7.17; under it [32, 32, 32, 64] -> 64 16.5 / 15.8,
 * [8, 32, 32, 64] -> 64 3.18 / 3.69, [32, 16, 16, 32] -> 128 3.34 / 3.43 (kept direct).
 */
const PATCH_MIN_FILTER = 73728

/** Convolutions and filter gradients that ran as a patch matrix and gradwire's product in this process (for tests). */
export const patchStats = { calls: 0, filterGrads: 0 }

/** Whether a convolution's patch matrix can be made by the heap's im2col: channels a multiple of 4, no dilation, padding inside the filter. */
export const patchesFit = (info: ReturnType<typeof convInfo>): boolean =>
  info.inChannels % 4 === 0 && info.outChannels % 16 === 0 && info.dilationHeight === 1 && info.dilationWidth === 1 && info.padInfo.top >= 0 && info.padInfo.left >= 0 && info.batchSize * info.outHeight * info.outWidth > 0

/**
 * Bytes of patch matrix made at a time (images taken together up to it, at least one): the matrix
 * holds FH·FW copies of the input, 75 MB for [128, 32, 32, 64] 3x3 at stride 2, which the wasm heap
 * would have to hold on top of everything else.
 */
let patchChunkBytes = 32 * 1024 * 1024

/** The bytes of patch matrix made at a time (tests make it small to run several chunks). */
export const setPatchChunkBytes = (bytes: number): void => {
  patchChunkBytes = bytes
}

/**
 * The patch matrix [nb·OH·OW, FH·FW·C] of x's images b0 .. b0 + nb − 1 for a convolution (im2col
 * on the heap, from x padded once as conv2d reads it), for images in chunks of at most
 * patchChunkBytes of it: `each(col, b0, nb)`; each chunk's matrix freed after its call.
 */
export const eachPatchMatrix = (backend: KernelArgs["backend"], kernels: HeapKernels, x: TensorInfo, info: ReturnType<typeof convInfo>, each: (col: TensorInfo, b0: number, nb: number) => void): void => {
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW, filterHeight: FH, filterWidth: FW, strideHeight: SH, strideWidth: SW } = info
  const { top, left } = info.padInfo
  const HP = (OH - 1) * SH + FH
  const WP = (OW - 1) * SW + FW
  const inPlace = top === 0 && left === 0 && HP <= H && WP <= W
  const padded = inPlace ? undefined : padImage(backend, x, HP, WP, top, left)
  const [rows, cols] = inPlace ? [H, W] : [HP, WP]
  const imageBytes = rows * cols * C * 4
  const perChunk = Math.max(1, Math.min(N, Math.floor(patchChunkBytes / (OH * OW * FH * FW * C * 4))))
  try {
    for (let b0 = 0; b0 < N; b0 += perChunk) {
      const nb = Math.min(perChunk, N - b0)
      const col = backend.makeOutput([nb * OH * OW, FH * FW * C], "float32")
      try {
        kernels.im2col(addressOf(backend, padded ?? x) + b0 * imageBytes, addressOf(backend, col), nb, rows, cols, C, OH, OW, FH, FW, SH, SW)
        each(col, b0, nb)
      } finally {
        backend.disposeData(col.dataId)
      }
    }
  } finally {
    if (padded) backend.disposeData(padded.dataId)
  }
}

/**
 * A convolution as its patch matrix times the filter ([N·OH·OW, FH·FW·C]·[FH·FW·C, O], the filter
 * read in place as that matrix) by gradwire's _FusedMatMul with the bias and ReLU (the packed
 * product, matmul.ts), or undefined where patchesFit does not hold. The same sums in the same order
 * as the direct kernel (the same bits where both apply); where the direct kernel's taps do not fit
 * (over SIMD_CONV_MAX_TAPS) it replaces XNNPACK's convolution: [32, 16, 16, 128] 3x3 stride 2 -> 256
 * 81.6 -> 25.0 ms, [32, 8, 8, 256] -> 512 81.6 -> 25.5, [8, 16, 16, 64] 5x5 -> 64 28.8 -> 9.4,
 * [8, 8, 8, 128] 3x3 stride 2 -> 128 1.22 -> 0.85.
 */
const patchConv2d = (tf: Tf, backend: KernelArgs["backend"], kernels: HeapKernels, x: TensorInfo, filter: TensorInfo, bias: TensorInfo | undefined, info: ReturnType<typeof convInfo>, relu: boolean): TensorInfo | undefined => {
  if (!patchesFit(info) || (bias && (bias.dtype !== "float32" || bias.shape.reduce((a, b) => a * b, 1) !== info.outChannels))) return undefined
  const { batchSize: N, outHeight: OH, outWidth: OW, outChannels: O } = info
  const K = info.filterHeight * info.filterWidth * info.inChannels
  patchStats.calls++
  const product = (col: TensorInfo, rows: number): TensorInfo => timesFilter(tf, backend, col, rows, K, filter, bias, relu)
  let whole: TensorInfo | undefined
  let y: TensorInfo | undefined
  eachPatchMatrix(backend, kernels, x, info, (col, b0, nb) => {
    if (nb === N) {
      whole = product(col, N * OH * OW)
      return
    }
    // several chunks: each one's rows of y
    y ??= backend.makeOutput([N, OH, OW, O], "float32")
    const part = product(col, nb * OH * OW)
    floats(backend, y).set(floats(backend, part), b0 * OH * OW * O)
    backend.disposeData(part.dataId)
  })
  const out = whole ?? y!
  return { dataId: out.dataId, shape: [N, OH, OW, O], dtype: "float32" }
}

/**
 * a's data read as [rows, K] times the filter's as [K, O] (its last axis O), with the bias and ReLU,
 * by gradwire's _FusedMatMul (matmul.ts: the SIMD product, then the bias and activation).
 */
const timesFilter = (tf: Tf, backend: KernelArgs["backend"], a: TensorInfo, rows: number, K: number, filter: TensorInfo, bias: TensorInfo | undefined, relu: boolean): TensorInfo => {
  const O = filter.shape[filter.shape.length - 1]!
  return callKernel(tf, "_FusedMatMul", {
    inputs: {
      a: { dataId: a.dataId, shape: [1, rows, K], dtype: "float32" },
      b: { dataId: filter.dataId, shape: [1, K, O], dtype: "float32" },
      ...(bias ? { bias: { dataId: bias.dataId, shape: [O], dtype: "float32" } } : {})
    },
    backend,
    attrs: { transposeA: false, transposeB: false, activation: relu ? "relu" : "linear" }
  })
}

/** Pointwise (1x1) convolutions run as products in this process (for tests). */
export const pointwiseStats = { calls: 0 }

let pointwise = true

/** Whether 1x1 convolutions run as products (on by default; off: as convolutions, as before, for A/B benches). */
export const usePointwiseProducts = (on: boolean): void => {
  pointwise = on
}

/** Whether a 1x1 convolution reads every input pixel once, in place: stride 1, no padding, no dilation. */
export const isPointwise = (info: ReturnType<typeof convInfo>): boolean =>
  pointwise &&
  info.filterHeight === 1 && info.filterWidth === 1 && info.strideHeight === 1 && info.strideWidth === 1 && info.dilationHeight === 1 && info.dilationWidth === 1 &&
  info.padInfo.top === 0 && info.padInfo.left === 0 && info.padInfo.bottom === 0 && info.padInfo.right === 0 && info.batchSize * info.outHeight * info.outWidth > 0

/**
 * A 1x1 convolution at stride 1 without padding (MobileNet's pointwise layers) as the product
 * x [N·H·W, C] · W [C, O] with its bias and ReLU by gradwire's _FusedMatMul (matmul.ts: the SIMD
 * product where it applies, then the bias and ReLU). XNNPACK's convolution packs the step's new filter on every
 * call; the product, alternated in one process with a new filter each call: [32, 8, 8, 128] -> 128
 * 2.28 -> 1.45 ms, [32, 16, 16, 32] -> 64 1.22 -> 0.68, [32, 16, 16, 64] -> 64 2.21 -> 1.29.
 * Undefined where it does not apply (other strides, padding, a bias of another shape).
 */
const pointwiseConv2d = (tf: Tf, backend: KernelArgs["backend"], x: TensorInfo, filter: TensorInfo, bias: TensorInfo | undefined, attrs: KernelArgs["attrs"], relu: boolean): TensorInfo | undefined => {
  const [, , C, O] = filter.shape as [number, number, number, number]
  if (bias && (bias.dtype !== "float32" || bias.shape.reduce((a, b) => a * b, 1) !== O)) return undefined
  const info = convInfo(tf, x.shape, filter.shape, attrs, false)
  if (!isPointwise(info)) return undefined
  const { batchSize: N, outHeight: OH, outWidth: OW } = info
  const M = N * OH * OW
  pointwiseStats.calls++
  const y = timesFilter(tf, backend, x, M, C, filter, bias, relu)
  return { dataId: y.dataId, shape: [N, OH, OW, O], dtype: "float32" }
}

/**
 * `args` with "same" padding written out as the rows and columns it adds. tfjs-backend-wasm hands
 * "same" to XNNPACK as its TensorFlow-SAME flag, which pads wrongly where a filter is narrower than
 * its stride along one axis and the other axis is padded (3x3 at strides [1, 4] on [2, 11, 12, 128]:
 * off by up to 100 against the cpu backend; its depthwise convolutions likewise); with the padding
 * explicit it computes what tfjs does.
 */
export const explicitSame = (tf: Tf, args: KernelArgs, depthwise = false): KernelArgs => {
  if (args.attrs.pad !== "same" || args.attrs.dataFormat === "NCHW") return args
  const { top, bottom, left, right } = convInfo(tf, args.inputs.x!.shape, args.inputs.filter!.shape, args.attrs, depthwise).padInfo
  return { ...args, attrs: { ...args.attrs, pad: [[0, 0], [top, bottom], [left, right], [0, 0]] } }
}

/** Conv2D: the SIMD kernel where it applies, else `original` (the backend's, with "same" made explicit). */
export const conv2dKernel =
  (tf: Tf, original: KernelFunc): KernelFunc =>
  (args) =>
    simdConv2d(tf, args.backend, args.inputs.x, args.inputs.filter, undefined, args.attrs, false) ?? original(explicitSame(tf, args))

/** FusedConv2D with a bias or none and a linear or ReLU activation: the SIMD kernel where it applies, else `original` ("same" made explicit). */
export const fusedConv2dKernel =
  (tf: Tf, original: KernelFunc): KernelFunc =>
  (args) => {
    const activation = args.attrs.activation ?? "linear"
    if ((activation !== "linear" && activation !== "relu") || args.inputs.preluActivationWeights) return original(explicitSame(tf, args))
    return simdConv2d(tf, args.backend, args.inputs.x, args.inputs.filter, args.inputs.bias, args.attrs, activation === "relu") ?? original(explicitSame(tf, args))
  }

/** Convolutions (forward and input gradients) and filter gradients that ran as Winograd's F(4x4, 3x3) in this process (for tests). */
export const winogradStats = { calls: 0, filterGrads: 0 }

let winograd = settings.winograd.read()

/** Whether 3x3 convolutions at stride 1 run as Winograd's F(4x4, 3x3) (on unless GRADWIRE_WINOGRAD=0; off: the direct kernels, for A/B benches and tests). */
export const useWinograd = (on: boolean): void => {
  winograd = on
}

/** For explain.txt: whether 3x3 convolutions at stride 1 run as Winograd's. */
export const winogradStatus = (): string =>
  winograd ? "Winograd's F(4x4, 3x3) (a quarter of the multiply-adds; GRADWIRE_WINOGRAD=0 for the direct kernels)" : "the direct kernels (GRADWIRE_WINOGRAD=0 or turned off)"

/** Floats each plane of the Winograd kernels' buffers is longer than its contents (simd/heap-kernels.wat.mjs PLANE_PAD: one cache line). */
const WG_PLANE_PAD = 16
/** The most planes a tile's transforms have: (4 + 2)² for tiles of 4 x 4 outputs. */
const WG_MAX_PLANES = 36

let edgeTiles = true

/** Whether a side that is not a multiple of 4 ends in Winograd tiles of 2 or 3 outputs (on by default; off: tiles of 4 past the image's end, as before, for A/B benches). */
export const useWinogradEdgeTiles = (on: boolean): void => {
  edgeTiles = on
}

/** A run of Winograd tiles along one side of an output: `count` tiles of `m` outputs from output `start`, `size` of them inside the output. */
export interface WinogradRun {
  readonly start: number
  readonly m: WinogradSide
  readonly count: number
  readonly size: number
}

/**
 * How a side of L outputs is cut into Winograd tiles: 4 outputs a tile, and where L is not a
 * multiple of 4 its end as one tile of 2 or 3 (L ≡ 2 or 3 mod 4), or of 3 and 2 (L ≡ 1 mod 4 from 5
 * on), so that no tile computes outputs past the image; L = 1 as a tile of 2. Tiles of 4 alone
 * compute a 14-wide side as 16 and a 7-wide one as 8: 1.31x the products over a 14 x 14 or 7 x 7
 * image, where these tiles take 484 / 576 and 121 / 144 of them. Every plan has ⌈L/4⌉ tiles.
 */
export const winogradPlan = (L: number): WinogradRun[] => {
  if (!edgeTiles) return [{ start: 0, m: 4, count: Math.ceil(L / 4), size: L }]
  const fours = L % 4 === 1 && L > 1 ? Math.floor(L / 4) - 1 : Math.floor(L / 4)
  const runs: WinogradRun[] = fours > 0 ? [{ start: 0, m: 4, count: fours, size: 4 * fours }] : []
  const rest = L - 4 * fours
  const tail: WinogradSide[] = rest === 5 ? [3, 2] : rest === 1 ? [2] : rest === 2 || rest === 3 ? [rest] : []
  let at = 4 * fours
  for (const m of tail) {
    runs.push({ start: at, m, count: 1, size: Math.min(m, L - at) })
    at += m
  }
  return runs
}

/** The regions of an OH x OW output, one per pair of runs along its rows and columns, each with its tile shape. */
const winogradRegions = (OH: number, OW: number): Array<{ rows: WinogradRun; cols: WinogradRun; shape: `${WinogradSide}${WinogradSide}` }> =>
  winogradPlan(OH).flatMap((rows) => winogradPlan(OW).map((cols) => ({ rows, cols, shape: `${rows.m}${cols.m}` as const })))

/** Winograd tiles in a convolution's output (⌈OH/4⌉·⌈OW/4⌉ an image, winogradPlan). */
const tileCount = (info: ReturnType<typeof convInfo>): number => info.batchSize * Math.ceil(info.outHeight / 4) * Math.ceil(info.outWidth / 4)

/**
 * Whether a convolution runs as Winograd's F(4x4, 3x3): a 3x3 filter at stride 1 without dilation,
 * 8-512 input and 4-512 output channels, multiples of 4, and at least 8 tiles of 4x4 outputs (the
 * filter's transform, 36·C·O floats, is made on every call: with 4 tiles of 512 channels each way
 * the forward pass took 11.0 ms against XNNPACK's 9.9 and the filter gradient 22.8 against 8.7;
 * with 8 tiles 13.7 against 24.2 and 15.8 against 22.8). Against gradwire's direct SIMD kernel up to
 * 64 input channels and XNNPACK's above, 1.3-4.9x each way (bench/winograd.ts); at 512 channels
 * (a ResNet-18's last stage, [32, 4, 4, 512] -> 512) 3.2-4.1x: forward 83.0 -> 21.2 ms, input
 * gradient 97.0 -> 23.5, filter gradient 89.6 -> 28.0.
 */
export const winogradFits = (info: ReturnType<typeof convInfo>): boolean =>
  winograd &&
  info.filterHeight === 3 && info.filterWidth === 3 && info.strideHeight === 1 && info.strideWidth === 1 && info.dilationHeight === 1 && info.dilationWidth === 1 &&
  info.inChannels % 4 === 0 && info.outChannels % 4 === 0 && info.inChannels >= 8 && info.inChannels <= 512 && info.outChannels <= 512 &&
  tileCount(info) >= 8 && info.padInfo.top >= 0 && info.padInfo.left >= 0

/**
 * Tiles transformed together, T. The forward pass's transformed inputs and products, 36·T·(C + O)
 * floats, are best kept small (T = 4: [32, 7, 7, 64] -> 64 1.44 -> 1.21 ms, [32, 14, 14, 32] -> 32
 * 1.60 -> 1.12 against T = 16) while the transformed filter, 36·C·O floats read once per block,
 * stays within the second-level cache; above 64 x 64 channels it dominates, and T ≥ C·O / (2·(C +
 * O)) keeps its reads at most twice the block's own (256 each way: 10.2 -> 7.2 ms). The filter
 * gradient adds every block into its 36·C·O sums: at least 16 tiles a block (at 256 channels each
 * way T = 4 made it 1.0x the direct kernels', T = 64 2.3x). Never more than the tiles there are.
 */
const winogradBlock = (info: ReturnType<typeof convInfo>, filterGrad: boolean): number => {
  const { inChannels: C, outChannels: O } = info
  const wide = Math.floor((C * O) / (2 * (C + O)))
  return Math.min(tileCount(info), filterGrad ? Math.max(16, wide) : C * O <= 4096 ? 4 : Math.max(4, wide))
}

/** x padded to the tiles of the output (winogradPlan): rows and columns to the last tile's end + 2, zeros outside the image. */
const tilePadded = (backend: KernelArgs["backend"], x: TensorInfo, info: ReturnType<typeof convInfo>): { padded: TensorInfo; HP: number; WP: number } => {
  const end = (L: number): number => Math.max(...winogradPlan(L).map((r) => r.start + r.m * r.count))
  const HP = end(info.outHeight) + 2
  const WP = end(info.outWidth) + 2
  return { padded: padImage(backend, x, HP, WP, info.padInfo.top, info.padInfo.left), HP, WP }
}

/**
 * A 3x3 convolution at stride 1 as Winograd's minimal filtering (simd/heap-kernels.wat.mjs, wgConv;
 * Lavin and Gray 2015) in tiles of 4 x 4 outputs, and of 4 x 2, 3 x 4, ... at the image's last rows
 * and columns where its sides are not multiples of 4 (winogradPlan), one call per region of one
 * tile shape: the filter transformed once per call (wgFilter4: F(4x4, 3x3)'s planes, of which every
 * tile shape reads its own), the input padded to the tiles, a quarter of a direct convolution's
 * multiply-adds in the 4 x 4 tiles. Agrees with the direct kernel within float32 rounding of the
 * transforms (about 3e-6 of the outputs' scale at 16 channels). Undefined where it does not apply
 * (winogradFits). The tiles at a side's end, against tiles of 4 past it, µs (bench/winograd.ts
 * --only edge): [32, 14, 14, 32] -> 32 forward 1368 -> 1187, filter gradient 1136 -> 978; [32, 7,
 * 7, 64] -> 64 998 -> 853 and 1072 -> 923; [8, 13, 13, 64] -> 64 982 -> 752.
 */
const winogradConv2d = (backend: KernelArgs["backend"], kernels: HeapKernels, x: TensorInfo, filter: TensorInfo, bias: TensorInfo | undefined, info: ReturnType<typeof convInfo>, relu: boolean): TensorInfo | undefined => {
  if (!winogradFits(info)) return undefined
  const { batchSize: N, outHeight: OH, outWidth: OW, inChannels: C, outChannels: O } = info
  const T = winogradBlock(info, false)
  const { padded, HP, WP } = tilePadded(backend, x, info)
  // the transformed filter: 36 planes of C·O floats (wgFilter4), which every tile shape reads; V's and M's planes and sandwich's slots of 4 floats
  const u = backend.makeOutput([WG_MAX_PLANES * (C * O + WG_PLANE_PAD)], "float32")
  const scratch = backend.makeOutput([WG_MAX_PLANES * (T * (C + O) + 2 * WG_PLANE_PAD + 4)], "float32")
  try {
    const [uAt, scratchAt] = [addressOf(backend, u), addressOf(backend, scratch)]
    kernels.wgFilter4(addressOf(backend, filter), uAt, C, O, scratchAt)
    const y = backend.makeOutput([N, OH, OW, O], "float32")
    winogradStats.calls++
    simdConvStats.calls++
    const [xAt, yAt, biasAt] = [addressOf(backend, padded), addressOf(backend, y), bias ? addressOf(backend, bias) : 0]
    for (const { rows, cols, shape } of winogradRegions(OH, OW))
      kernels[`wgConv${shape}`](xAt, uAt, biasAt, yAt, N, HP, WP, C, OH, OW, O, relu ? 1 : 0, scratchAt, T, rows.start, cols.start, rows.size, cols.size)
    return y
  } finally {
    for (const t of [padded, u, scratch]) backend.disposeData(t.dataId)
  }
}

/**
 * The filter gradient of a convolution that winogradFits, by the same transforms and tiles
 * (wgFilterGrad, one call per region, all adding into one set of F(4x4, 3x3)'s 36 sums): dW = Gᵀ
 * [Σ_tiles (Ah dY Awᵀ) ⊙ (Bhᵀ d Bw)] G. Undefined where it does not apply.
 */
export const winogradFilterGrad = (backend: KernelArgs["backend"], x: TensorInfo, dy: TensorInfo, info: ReturnType<typeof convInfo>): TensorInfo | undefined => {
  const kernels = heapKernels(backend)
  if (!kernels || !winogradFits(info) || x.dtype !== "float32" || dy.dtype !== "float32") return undefined
  const { batchSize: N, outHeight: OH, outWidth: OW, inChannels: C, outChannels: O } = info
  const T = winogradBlock(info, true)
  const { padded, HP, WP } = tilePadded(backend, x, info)
  // V's, D's and P's planes and sandwich's slots of 4 floats
  const scratch = backend.makeOutput([WG_MAX_PLANES * (T * (C + O) + C * O + 3 * WG_PLANE_PAD + 4)], "float32")
  try {
    const dw = backend.makeOutput([3, 3, C, O], "float32")
    winogradStats.filterGrads++
    const [xAt, dyAt, dwAt, scratchAt] = [addressOf(backend, padded), addressOf(backend, dy), addressOf(backend, dw), addressOf(backend, scratch)]
    const regions = winogradRegions(OH, OW)
    regions.forEach(({ rows, cols, shape }, i) =>
      kernels[`wgFilterGrad${shape}`](xAt, dyAt, dwAt, N, HP, WP, C, OH, OW, O, scratchAt, T, rows.start, cols.start, rows.size, cols.size, i === 0 ? 1 : 0, i === regions.length - 1 ? 1 : 0)
    )
    return dw
  } finally {
    for (const t of [padded, scratch]) backend.disposeData(t.dataId)
  }
}
