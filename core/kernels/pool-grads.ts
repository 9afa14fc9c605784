// MaxPoolGrad on the wasm heap. tfjs-backend-wasm 4.22 ships one, but it drops the gradient of the
// first element of every image after the first in a batch (found by test/wasm-layer-coverage: with
// a 2x2/2 pool of a [2, 6, 6, 3] batch, x[1, 0, 0, 0] gets 0 where finite differences give the
// upstream value). This one routes each output's gradient to the first maximum of its window, as
// TensorFlow and tfjs's cpu backend do.
import type { Tf } from "../tf.ts"
import { addressOf, heapKernels, roomAfter } from "./heap-simd.ts"
import { floats, type KernelArgs, type TensorInfo } from "./wasm-heap.ts"

export const maxPoolGrad = (tf: Tf, { inputs, backend, attrs }: KernelArgs): TensorInfo => {
  const { dy, input } = inputs
  const info = tf.backend_util.computePool2DInfo(
    input.shape as [number, number, number, number],
    attrs.filterSize as [number, number] | number,
    attrs.strides as [number, number] | number,
    1,
    attrs.pad as "same",
    attrs.dimRoundingMode as "floor" | undefined
  )
  const { batchSize: N, inHeight: H, inWidth: W, inChannels: C, outHeight: OH, outWidth: OW } = info
  const { strideHeight: SH, strideWidth: SW, effectiveFilterHeight: FH, effectiveFilterWidth: FW, dilationHeight: DH, dilationWidth: DW } = info
  const out = backend.makeOutput([...input.shape], "float32")
  const xs = floats(backend, input)
  const dys = floats(backend, dy)
  const dx = floats(backend, out)
  dx.fill(0)
  // Windows that do not overlap (the usual 2x2 at stride 2): gradwire's SIMD kernel on the heap,
  // four channels at a time, with no scatter (LeNet's [32, 28, 28, 6] 2x2/2: 0.99 -> 0.25 ms). With C
  // not a multiple of 4 it reads up to 12 bytes past x's and dy's last pixel: only where the heap
  // goes on that far.
  const kernels = DH === 1 && DW === 1 && SH >= FH && SW >= FW && input.dtype === "float32" && dy.dtype === "float32" ? heapKernels(backend) : undefined
  if (kernels && (C % 4 === 0 || (roomAfter(backend, input, 16) && roomAfter(backend, dy, 16)))) {
    kernels.maxPoolGrad(addressOf(backend, input), addressOf(backend, dy), addressOf(backend, out), N, H, W, C, OH, OW, FH, FW, SH, SW, info.padInfo.top, info.padInfo.left)
    return out
  }
  // Per output pixel, every channel at once: the window's taps in order, each a contiguous run of C
  // values; the first tap in the image sets the best so far per channel, and a later one replaces it
  // only when strictly greater (the first maximum wins; a NaN first in its window stays, where the
  // cpu backend's loop skips NaNs; a later NaN never wins in either).
  const best = new Float32Array(C)
  const at = new Int32Array(C)
  for (let b = 0; b < N; b++) {
    for (let oh = 0; oh < OH; oh++) {
      const h0 = oh * SH - info.padInfo.top
      for (let ow = 0; ow < OW; ow++) {
        const w0 = ow * SW - info.padInfo.left
        const yo = ((b * OH + oh) * OW + ow) * C
        let first = true
        for (let fh = 0; fh < FH; fh += DH) {
          const ih = h0 + fh
          if (ih < 0 || ih >= H) continue
          for (let fw = 0; fw < FW; fw += DW) {
            const iw = w0 + fw
            if (iw < 0 || iw >= W) continue
            const base = ((b * H + ih) * W + iw) * C
            if (first) {
              for (let c = 0; c < C; c++) {
                best[c] = xs[base + c]!
                at[c] = base + c
              }
              first = false
            } else {
              for (let c = 0; c < C; c++) {
                const v = xs[base + c]!
                if (v > best[c]!) {
                  best[c] = v
                  at[c] = base + c
                }
              }
            }
          }
        }
        if (!first) for (let c = 0; c < C; c++) dx[at[c]!] = dx[at[c]!]! + dys[yo + c]!
      }
    }
  }
  return out
}
