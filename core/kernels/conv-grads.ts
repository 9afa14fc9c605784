// Gradient kernels of the convolutions that tfjs-backend-wasm 4.22 lacks or runs slowly, computed
// on the wasm heap without leaving it: the conv2d filter gradient at stride 1 (2-32 input channels)
// as the backend's XNNPACK convolution of the transposed input by the transposed dy, else one
// im2col (a JS pass over a channels-first copy of the input) plus the backend's own matmul; the
// conv2d input gradient at stride 1 as the backend's forward convolution of dy with the filter
// turned round, else a matmul and a scatter-add; the depthwise filter and input gradients as the
// heap's SIMD kernels (channel multiplier 1, channels a multiple of 4), else direct loops (their
// work is O(input x filter), no matmul to hand them to). Shapes the fast paths do not
// cover (channels-first data, 3-D) go to the cpu-backend fallback instead (fallback.ts).
import type { Tf } from "../tf.ts"
import { convInfo, eachPatchMatrix, isPointwise, padImage, patchesFit, patchStats, winogradFilterGrad } from "./conv2d.ts"
import { addressOf, heapKernels, roomAfter } from "./heap-simd.ts"
import { callKernel, floats, type KernelArgs, type TensorInfo } from "./wasm-heap.ts"

/**
 * Bytes of input and dy that convFilterGrad goes over per call. Its rows of dW (one tap and two
 * input channels, 16 output channels) each pass over every pixel of the batch it is given, so a
 * batch whose x and dy outgrow the core's L2 cache (512 KiB on this AMD EPYC) came from memory once
 * per row. In chunks of at most this many bytes, each call's sums going on from the last's (the same
 * sums, bit for bit), against one call (3x3 unless said, alternated in one process, batch 32):
 * [8, 8, 32] -> 64 5.67 -> 3.75 ms, [8, 8, 64] -> 64 12.7 -> 8.7, [16, 16, 32] -> 32 11.9 -> 7.9,
 * batch 8 [32, 32, 64] -> 64 39.2 -> 21.7, batch 16 [64, 64, 3] 7x7/2 -> 32 9.0 -> 6.7; chunks of
 * 24-64 KiB measured fastest. A batch whose x and dy fit FILTER_GRAD_WHOLE_BYTES stays one call:
 * chunks cost [8, 8, 16] -> 16 0.34 -> 0.39 ms.
 */
const FILTER_GRAD_CHUNK_BYTES = 64 * 1024
const FILTER_GRAD_WHOLE_BYTES = 256 * 1024

let chunked = true

/** Whether the filter gradient goes over the batch in chunks (on by default; off: one call, as before, for A/B benches). */
export const useFilterGradChunks = (on: boolean): void => {
  chunked = on
}

interface FilterGradShape {
  readonly N: number
  readonly H: number
  readonly W: number
  readonly C: number
  readonly OH: number
  readonly OW: number
  readonly O: number
  readonly FH: number
  readonly SH: number
  readonly top: number
}

/**
 * Runs a filter gradient over the batch in cache-sized chunks, in the order of the batch's pixels
 * (b, oh, ow): the whole batch where its x and dy fit FILTER_GRAD_WHOLE_BYTES, else whole images
 * where one image's fit FILTER_GRAD_CHUNK_BYTES, else runs of output rows of one image (its input
 * rows read through the shifted top padding). `call` gets the chunk's x and dy addresses (byte
 * addresses on the heap), its images, its output rows, its top padding and whether to add to dW (1
 * for every chunk after the first).
 */
const filterGradInChunks = (
  x: number,
  dy: number,
  { N, H, W, C, OH, OW, O, FH, SH, top }: FilterGradShape,
  call: (x: number, dy: number, images: number, rows: number, top: number, acc: number) => void
): void => {
  const xImage = H * W * C * 4
  const dyRow = OW * O * 4
  const dyImage = OH * dyRow
  const xRow = W * C * 4
  if (!chunked || N * (xImage + dyImage) <= FILTER_GRAD_WHOLE_BYTES) return call(x, dy, N, OH, top, 0)
  if (xImage + dyImage <= FILTER_GRAD_CHUNK_BYTES || OH <= 1) {
    const images = Math.max(1, Math.floor(FILTER_GRAD_CHUNK_BYTES / (xImage + dyImage)))
    for (let b = 0; b < N; b += images) call(x + b * xImage, dy + b * dyImage, Math.min(images, N - b), OH, top, b > 0 ? 1 : 0)
    return
  }
  // Output rows per chunk: their dy rows and the input rows their taps read ((rows − 1)·SH + FH).
  const rows = Math.max(1, Math.min(OH, Math.floor((FILTER_GRAD_CHUNK_BYTES - (FH - SH) * xRow) / (dyRow + SH * xRow))))
  for (let b = 0; b < N; b++)
    for (let oh = 0; oh < OH; oh += rows) call(x + b * xImage, dy + b * dyImage + oh * dyRow, 1, Math.min(rows, OH - oh), top - oh * SH, b > 0 || oh > 0 ? 1 : 0)
}

/** The most floats of dy for which a pointwise layer's filter gradient runs as a product (below). */
const POINTWISE_FILTER_MAX = 262144

/**
 * dW[fh, fw, c, o] = Σ_{b, oh, ow} x[b, oh·sh + fh·dh − top, ow·sw + fw·dw − left, c] · dy[b, oh, ow, o].
 * With Xcol[m, (fh, fw, c)] the input patch behind output pixel m (zero outside the image), dW is
 * Xcolᵀ · dy: one matmul of [K, M] by [M, outC], K = fh·fw·inC, M = batch·outH·outW.
 */
export const conv2dBackpropFilter = (tf: Tf, { inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { x, dy } = inputs
  const filterShape = attrs.filterShape as [number, number, number, number]
  const info = convInfo(tf, x.shape, filterShape, attrs, false)
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW, outChannels: O } = info
  const { filterHeight: FH, filterWidth: FW, strideHeight: SH, strideWidth: SW } = info
  const top = info.padInfo.top
  const left = info.padInfo.left
  const K = FH * FW * C
  const M = N * OH * OW
  const bottomPad = info.padInfo.bottom
  const rightPad = info.padInfo.right
  // A 1x1 filter at stride 1 without padding (a pointwise layer): dW = xᵀ·dy, [C, M] by [M, O], by
  // gradwire's BatchMatMul with x read transposed, where dy is at most 1 MiB (the kernels below,
  // alternated in one process, against the product: [32, 8, 8, 128] -> 128 2.34 -> 1.96 ms,
  // [32, 8, 8, 64] -> 128 1.15 -> 0.83, [32, 16, 16, 16] -> 32 0.26 -> 0.25; above it the product
  // lost: [32, 16, 16, 32] -> 64 1.00 -> 1.12, [32, 16, 16, 64] -> 64 1.82 -> 2.06, [8, 16, 16, 128]
  // -> 256 3.74 -> 3.97, [32, 32, 32, 16] -> 32 0.79 -> 0.93).
  if (isPointwise(info) && M * O <= POINTWISE_FILTER_MAX && x.dtype === "float32" && dy.dtype === "float32") {
    const dw = callKernel(tf, "BatchMatMul", {
      inputs: { a: { dataId: x.dataId, shape: [1, M, C], dtype: "float32" }, b: { dataId: dy.dataId, shape: [1, M, O], dtype: "float32" } },
      backend,
      attrs: { transposeA: true, transposeB: false }
    })
    return { dataId: dw.dataId, shape: [...filterShape], dtype: "float32" }
  }
  // Stride 1: dW is itself a convolution, of the input with the batch as its channels ([C, H, W, N])
  // by dy as the filter ([OH, OW, N, O]), padded as the forward pass was: the backend's XNNPACK
  // convolution then does the whole product with no patch matrix. Measured against the patch matrix
  // below (interleaved in one process): 1024 -> 799 µs for [32, 8, 8, 16] by 3x3x16x16, 1557 -> 967
  // for [32, 14, 14, 6] by 5x5x6x16 and 10.1 -> 9.5 ms for [32, 16, 16, 32] by 3x3x32x32, but slower
  // with one input channel (131 -> 195 µs, 1785 -> 2008) and with 64 (7.9 -> 8.3 ms): taken for 2-32.
  // Not for a 1-d convolution (conv1d: H = FH = 1), where dy as a filter is one long row: the patch
  // matrix measured 830 -> 752 µs for [32, 1, 64, 8] by 1x9x8x32 (the zoo's embedding model) and
  // 516 -> 236 for 1x5x8x16 same-padded.
  // A 3x3 filter at stride 1 (winogradFits): Winograd's F(4x4, 3x3) read backwards, about a
  // quarter of the multiply-adds ([32, 8, 8, 16] -> 16: see conv2d.ts).
  const wg = winogradFilterGrad(backend, x, dy, info)
  if (wg) return { dataId: wg.dataId, shape: [...filterShape], dtype: "float32" }
  const oneDimensional = H === 1 && FH === 1
  // A strided convolution: dW = colᵀ·dy with col its patch matrix [M, K] (im2col on the heap),
  // transposed first so that the packed product reads its rows in place (read transposed, each
  // step down a column took 8 bytes of a new cache line: [32, 32, 32, 64] -> 128 70.8 ms). Against
  // the SIMD kernels below, alternated in one process, ms: 3x3 stride 2 [32, 8, 8, 256] -> 512 44.1
  // -> 26.6, [32, 16, 16, 128] -> 256 35.4 -> 26.4, [32, 14, 14, 32] -> 64 1.95 -> 1.41, [32, 32, 32,
  // 64] -> 128 30.4 -> 30.8; at stride 1 those kernels stay ([8, 16, 16, 64] 5x5 -> 64 8.8 against 12.0).
  // In chunks of images (eachPatchMatrix), their products added up.
  const heap = heapKernels(backend)
  if (heap && (SH > 1 || SW > 1) && patchesFit(info) && x.dtype === "float32" && dy.dtype === "float32") {
    patchStats.filterGrads++
    let dw: TensorInfo | undefined
    eachPatchMatrix(backend, heap, x, info, (col, b0, nb) => {
      const rows = nb * OH * OW
      const temps: TensorInfo[] = []
      try {
        const colT = callKernel(tf, "Transpose", { inputs: { x: { dataId: col.dataId, shape: [rows, K], dtype: "float32" } }, backend, attrs: { perm: [1, 0] } })
        temps.push(colT)
        // this chunk's rows of dy: dy itself for one chunk, else a copy of them
        let dyRows = dy
        if (nb < N) {
          dyRows = backend.makeOutput([rows, O], "float32")
          temps.push(dyRows)
          floats(backend, dyRows).set(floats(backend, dy).subarray(b0 * OH * OW * O, (b0 + nb) * OH * OW * O))
        }
        const part = callKernel(tf, "BatchMatMul", {
          inputs: { a: { dataId: colT.dataId, shape: [1, K, rows], dtype: "float32" }, b: { dataId: dyRows.dataId, shape: [1, rows, O], dtype: "float32" } },
          backend,
          attrs: { transposeA: false, transposeB: false }
        })
        if (!dw) dw = part
        else {
          temps.push(part)
          const sum = floats(backend, dw)
          const add = floats(backend, part)
          for (let i = 0; i < sum.length; i++) sum[i] = sum[i]! + add[i]!
        }
      } finally {
        for (const t of temps) backend.disposeData(t.dataId)
      }
    })
    return { dataId: dw!.dataId, shape: [...filterShape], dtype: "float32" }
  }
  // gradwire's SIMD kernel on the heap (heap-simd.ts) reads x and dy in place, with no transposes and
  // no patch matrix, a cache-sized chunk of the batch per call (filterGradInChunks).
  const kernels = info.dilationHeight === 1 && info.dilationWidth === 1 ? heap : undefined
  // With O not a multiple of 4 (LeNet's 6 filters) or under 16, four taps of a row at a time for
  // eight output columns (convFilterGradTaps) from a padded copy of x, where the rows kernel, whose
  // wide blocks take 16 output columns, went over dy once per 4 or 1 of them: [32, 28, 28, 1] 5x5
  // -> 6 1699 -> 604 µs; 3x3 -> 8 on [32, 16, 16, 16] 3.62 -> 1.82 ms, on [32, 8, 8, 64] 4.91 ->
  // 2.37, on [32, 16, 16, 3] 0.55 -> 0.38; -> 12 on [32, 16, 16, 16] 5.60 -> 3.07 (the same bits).
  // From 16 output columns on the rows kernel is as fast or faster (-> 16, 32, 48, 64: 1.4-1.8x the
  // taps kernel's speed; -> 20 0.85x, -> 24 and 40 1.17-1.27x: left with the rows). The taps kernel
  // reads up to 28 bytes past dy's last pixel: only where the heap goes on that far.
  if (kernels && (O % 4 !== 0 || O < 16) && top >= 0 && left >= 0 && roomAfter(backend, dy, 32)) {
    const HP = (OH - 1) * SH + FH
    const WP = (OW - 1) * SW + FW
    const padded = padImage(backend, x, HP, WP, top, left, 4)
    try {
      const dw = backend.makeOutput([...filterShape], "float32")
      kernels.convFilterGradTaps(addressOf(backend, padded), addressOf(backend, dy), addressOf(backend, dw), N, HP, WP, C, OH, OW, O, FH, FW, SH, SW)
      return dw
    } finally {
      backend.disposeData(padded.dataId)
    }
  }
  if (kernels) {
    const dw = backend.makeOutput([...filterShape], "float32")
    const out = addressOf(backend, dw)
    filterGradInChunks(addressOf(backend, x), addressOf(backend, dy), { N, H, W, C, OH, OW, O, FH, SH, top }, (xa, dya, images, rows, chunkTop, acc) =>
      kernels.convFilterGrad(xa, dya, out, images, H, W, C, rows, OW, O, FH, FW, SH, SW, chunkTop, left, acc)
    )
    return dw
  }
  if (SH === 1 && SW === 1 && info.dilationHeight === 1 && info.dilationWidth === 1 && C >= 2 && C <= 32 && !oneDimensional && top >= 0 && left >= 0 && bottomPad >= 0 && rightPad >= 0) {
    const temps: TensorInfo[] = []
    try {
      const xt = callKernel(tf, "Transpose", { inputs: { x }, backend, attrs: { perm: [3, 1, 2, 0] } })
      temps.push(xt)
      const dyt = callKernel(tf, "Transpose", { inputs: { x: dy }, backend, attrs: { perm: [1, 2, 0, 3] } })
      temps.push(dyt)
      const out = callKernel(tf, "Conv2D", {
        inputs: { x: xt, filter: dyt },
        backend,
        attrs: { strides: 1, pad: [[0, 0], [top, bottomPad], [left, rightPad], [0, 0]], dataFormat: "NHWC", dilations: 1, dimRoundingMode: undefined }
      })
      temps.push(out)
      return callKernel(tf, "Transpose", { inputs: { x: out }, backend, attrs: { perm: [1, 2, 0, 3] } })
    } finally {
      for (const t of temps) backend.disposeData(t.dataId)
    }
  }
  // The patch matrix built transposed, [K, M] (row k = one tap (fh, fw, c) for every output pixel),
  // so the matmul needs no transpose, from a channels-first copy of the input ([C, N, H, W], the
  // backend's tiled Transpose), so that each row is filled from contiguous input rows. Building it
  // patch by patch ([M, K], each tap's channels one contiguous copy) and transposing it for the
  // matmul took 10-40% longer on the zoo's shapes, reading the input in place with a stride of C
  // about as much.
  const col = backend.makeOutput([1, K, M], "float32")
  const planar = C > 1 ? callKernel(tf, "Transpose", { inputs: { x }, backend, attrs: { perm: [3, 0, 1, 2] } }) : undefined
  try {
    const xs = floats(backend, planar ?? x)
    const cols = floats(backend, col)
    const plane = N * H * W
    let m = 0
    for (let fh = 0; fh < FH; fh++) {
      for (let fw = 0; fw < FW; fw++) {
        // The output columns whose input column iw = ow·SW + fw − left is inside the image.
        const first = Math.min(OW, Math.max(0, Math.ceil((left - fw) / SW)))
        const end = Math.max(first, Math.min(OW, Math.floor((W - 1 + left - fw) / SW) + 1))
        for (let c = 0; c < C; c++) {
          for (let b = 0; b < N; b++) {
            const image = c * plane + b * H * W
            for (let oh = 0; oh < OH; oh++) {
              const ih = oh * SH + fh - top
              if (ih < 0 || ih >= H) {
                cols.fill(0, m, m + OW)
                m += OW
                continue
              }
              const row = image + ih * W + fw - left
              for (let ow = 0; ow < first; ow++) cols[m++] = 0
              if (SW === 1) for (let ow = first; ow < end; ow++) cols[m++] = xs[row + ow]!
              else for (let ow = first; ow < end; ow++) cols[m++] = xs[row + ow * SW]!
              for (let ow = end; ow < OW; ow++) cols[m++] = 0
            }
          }
        }
      }
    }
    const out = callKernel(tf, "BatchMatMul", {
      inputs: { a: col, b: { dataId: dy.dataId, shape: [1, M, O], dtype: "float32" } },
      backend,
      attrs: { transposeA: false, transposeB: false }
    })
    return { dataId: out.dataId, shape: [...filterShape], dtype: "float32" }
  } finally {
    backend.disposeData(col.dataId)
    if (planar) backend.disposeData(planar.dataId)
  }
}

/** Depthwise gradients the heap's SIMD kernels computed in this process (for tests). */
export const simdDepthwiseStats = { filter: 0, input: 0 }

/**
 * The heap kernels for a depthwise gradient, where they apply: channel multiplier 1 (MobileNet's
 * depthwise layers), C a multiple of 4, no dilation, float32. The JavaScript loops below ran at
 * about 0.5 GFLOP/s ([32, 16, 16, 32] 3x3, filter gradient 9.5 ms, input gradient 9.4).
 */
const depthwiseKernels = (backend: KernelArgs["backend"], info: ReturnType<typeof convInfo>, ...tensors: TensorInfo[]) =>
  info.outChannels === info.inChannels && info.inChannels % 4 === 0 && info.dilationHeight === 1 && info.dilationWidth === 1 && info.padInfo.top >= 0 && info.padInfo.left >= 0 && info.batchSize * info.outHeight * info.outWidth > 0 && tensors.every((t) => t.dtype === "float32")
    ? heapKernels(backend)
    : undefined

/** dW[fh, fw, c, q] = Σ_{b, oh, ow} x[b, ih, iw, c] · dy[b, oh, ow, c·Q + q]. */
export const depthwiseBackpropFilter = (tf: Tf, { inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { x, dy } = inputs
  const filterShape = attrs.filterShape as number[]
  const info = convInfo(tf, x.shape, filterShape, attrs, true)
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW, outChannels: OC } = info
  const { filterHeight: FH, filterWidth: FW, strideHeight: SH, strideWidth: SW, dilationHeight: DH, dilationWidth: DW } = info
  const Q = OC / C
  const kernels = depthwiseKernels(backend, info, x, dy)
  if (kernels) {
    // x as the kernel reads it: every tap of every output pixel inside, rows HP by WP (in place where it already is)
    const HP = (OH - 1) * SH + FH
    const WP = (OW - 1) * SW + FW
    const inPlace = info.padInfo.top === 0 && info.padInfo.left === 0 && HP <= H && WP <= W
    const padded = inPlace ? undefined : padImage(backend, x, HP, WP, info.padInfo.top, info.padInfo.left)
    try {
      const dw = backend.makeOutput([...filterShape], "float32")
      simdDepthwiseStats.filter++
      kernels.dwFilterGrad(addressOf(backend, padded ?? x), addressOf(backend, dy), addressOf(backend, dw), N, inPlace ? H : HP, inPlace ? W : WP, C, OH, OW, FH, FW, SH, SW)
      return dw
    } finally {
      if (padded) backend.disposeData(padded.dataId)
    }
  }
  const out = backend.makeOutput([...filterShape], "float32")
  const xs = floats(backend, x)
  const dys = floats(backend, dy)
  const dw = floats(backend, out)
  dw.fill(0)
  for (let fh = 0; fh < FH; fh++) {
    for (let fw = 0; fw < FW; fw++) {
      const wBase = (fh * FW + fw) * C * Q
      for (let b = 0; b < N; b++) {
        for (let oh = 0; oh < OH; oh++) {
          const ih = oh * SH + fh * DH - info.padInfo.top
          if (ih < 0 || ih >= H) continue
          for (let ow = 0; ow < OW; ow++) {
            const iw = ow * SW + fw * DW - info.padInfo.left
            if (iw < 0 || iw >= W) continue
            const xo = ((b * H + ih) * W + iw) * C
            const yo = ((b * OH + oh) * OW + ow) * OC
            for (let c = 0; c < C; c++) {
              const xv = xs[xo + c]
              const yc = yo + c * Q
              const wc = wBase + c * Q
              for (let q = 0; q < Q; q++) dw[wc + q] += xv * dys[yc + q]
            }
          }
        }
      }
    }
  }
  return out
}

/** dx[b, ih, iw, c] = Σ over the taps that read it of W[fh, fw, c, q] · dy[b, oh, ow, c·Q + q]. */
export const depthwiseBackpropInput = (tf: Tf, { inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { dy, filter } = inputs
  const inputShape = attrs.inputShape as number[]
  const info = convInfo(tf, inputShape, filter.shape, attrs, true)
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW, outChannels: OC } = info
  const { filterHeight: FH, filterWidth: FW, strideHeight: SH, strideWidth: SW, dilationHeight: DH, dilationWidth: DW } = info
  const Q = OC / C
  const out = backend.makeOutput([...inputShape], "float32")
  const kernels = depthwiseKernels(backend, info, dy, filter)
  if (kernels) {
    floats(backend, out).fill(0)
    simdDepthwiseStats.input++
    kernels.dwInputGrad(addressOf(backend, dy), addressOf(backend, filter), addressOf(backend, out), N, H, W, C, OH, OW, FH, FW, SH, SW, info.padInfo.top, info.padInfo.left)
    return out
  }
  const ws = floats(backend, filter)
  const dys = floats(backend, dy)
  const dx = floats(backend, out)
  dx.fill(0)
  for (let b = 0; b < N; b++) {
    for (let oh = 0; oh < OH; oh++) {
      for (let fh = 0; fh < FH; fh++) {
        const ih = oh * SH + fh * DH - info.padInfo.top
        if (ih < 0 || ih >= H) continue
        for (let ow = 0; ow < OW; ow++) {
          const yo = ((b * OH + oh) * OW + ow) * OC
          for (let fw = 0; fw < FW; fw++) {
            const iw = ow * SW + fw * DW - info.padInfo.left
            if (iw < 0 || iw >= W) continue
            const xo = ((b * H + ih) * W + iw) * C
            const wo = (fh * FW + fw) * C * Q
            for (let c = 0; c < C; c++) {
              let s = 0
              const yc = yo + c * Q
              const wc = wo + c * Q
              for (let q = 0; q < Q; q++) s += ws[wc + q] * dys[yc + q]
              dx[xo + c] += s
            }
          }
        }
      }
    }
  }
  return out
}

/**
 * dx of a conv2d (tfjs-backend-wasm's own loops ran at about 2.8 GFLOP/s here): the patch
 * gradients dcol = dy · Wᵀ (one matmul of [M, outC] by [outC, K] through the backend's fast path),
 * then each patch gradient added back where its patch was read (col2im).
 */
export const conv2dBackpropInput = (tf: Tf, { inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { dy, filter } = inputs
  const inputShape = attrs.inputShape as [number, number, number, number]
  const info = convInfo(tf, inputShape, filter.shape, attrs, false)
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW, outChannels: O } = info
  const { filterHeight: FH, filterWidth: FW, strideHeight: SH, strideWidth: SW } = info
  const K = FH * FW * C
  const M = N * OH * OW
  const top = info.padInfo.top
  const left = info.padInfo.left
  const bottom = info.padInfo.bottom
  const right = info.padInfo.right
  // Stride 1: dx is the forward convolution of dy, padded by what the forward pass cut, with the
  // filter turned half a circle and its channels swapped (W'[fh, fw, o, c] = W[FH-1-fh, FW-1-fw, c, o]),
  // so the backend's XNNPACK convolution does it instead of a matmul and a scatter-add here.
  if (SH === 1 && SW === 1 && info.dilationHeight === 1 && info.dilationWidth === 1 && top < FH && bottom < FH && left < FW && right < FW) {
    const flipped = backend.makeOutput([FH, FW, O, C], "float32")
    try {
      // Each tap's [C, O] block transposed into the turned-round tap's place: by the heap's block
      // transpose where it is loaded (64 x 64 channels: 5.6 µs in 4 x 4 blocks, 49 µs in the
      // loop), else the loop.
      const kernels = heapKernels(backend)
      if (kernels) {
        const w = addressOf(backend, filter)
        const f = addressOf(backend, flipped)
        for (let t = 0; t < FH * FW; t++) kernels.blockTranspose(w + (FH * FW - 1 - t) * C * O * 4, f + t * O * C * 4, 1, C, O, 1)
      } else {
        const w = floats(backend, filter)
        const f = floats(backend, flipped)
        for (let fh = 0; fh < FH; fh++) {
          for (let fw = 0; fw < FW; fw++) {
            const to = (fh * FW + fw) * O * C
            const from = ((FH - 1 - fh) * FW + (FW - 1 - fw)) * C * O
            for (let c = 0; c < C; c++) for (let o = 0; o < O; o++) f[to + o * C + c] = w[from + c * O + o]!
          }
        }
      }
      return callKernel(tf, "Conv2D", {
        inputs: { x: dy, filter: flipped },
        backend,
        attrs: { strides: 1, pad: [[0, 0], [FH - 1 - top, FH - 1 - bottom], [FW - 1 - left, FW - 1 - right], [0, 0]], dataFormat: "NHWC", dilations: 1, dimRoundingMode: undefined }
      })
    } finally {
      backend.disposeData(flipped.dataId)
    }
  }
  const col = callKernel(tf, "BatchMatMul", {
    inputs: { a: { dataId: dy.dataId, shape: [1, M, O], dtype: "float32" }, b: { dataId: filter.dataId, shape: [1, K, O], dtype: "float32" } },
    backend,
    attrs: { transposeA: false, transposeB: true }
  })
  try {
    const out = backend.makeOutput([...inputShape], "float32")
    const dx = floats(backend, out)
    dx.fill(0)
    // The patch gradients added back by the heap's SIMD kernel where the channels are a multiple of 4
    // (the same order, the same bits): [32, 7, 7, 64] -> [32, 14, 14, 32] at stride 2 2.14 -> 1.3 ms.
    const kernels = C % 4 === 0 ? heapKernels(backend) : undefined
    if (kernels) {
      kernels.col2im(addressOf(backend, col), addressOf(backend, out), N, H, W, C, OH, OW, FH, FW, SH, SW, top, left)
      return out
    }
    const dcol = floats(backend, col)
    let m = 0
    for (let b = 0; b < N; b++) {
      for (let oh = 0; oh < OH; oh++) {
        for (let ow = 0; ow < OW; ow++, m++) {
          const src = m * K
          for (let fh = 0; fh < FH; fh++) {
            const ih = oh * SH + fh - top
            if (ih < 0 || ih >= H) continue
            for (let fw = 0; fw < FW; fw++) {
              const iw = ow * SW + fw - left
              if (iw < 0 || iw >= W) continue
              const d = ((b * H + ih) * W + iw) * C
              const s = src + (fh * FW + fw) * C
              for (let c = 0; c < C; c++) dx[d + c] += dcol[s + c]!
            }
          }
        }
      }
    }
    return out
  } finally {
    backend.disposeData(col.dataId)
  }
}
