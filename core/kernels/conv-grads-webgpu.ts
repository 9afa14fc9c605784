// A convolution's filter gradient on webgpu (Conv2DBackpropFilter and the depthwise
// DepthwiseConv2dNativeBackpropFilter). tfjs-backend-webgpu 4.22 computes dW with one GPU
// thread per filter weight, each looping over every batch row and output pixel: LeNet's first
// layer (5x5x1x6) is 150 threads adding 25,088 products each at batch 32 and 200,704 at batch 256,
// a GPU nearly idle for the length of one thread's loop, longer as the batch grows. Here dW is
// what it is, a sum over the rows (image, output pixel) of x's patch times dy, per filter weight:
// columnSums (fused-layers.ts) adds it in parallel, chunks of rows per workgroup, then the chunks'
// sums. Channels-last inputs without dilation only (every tfjs-layers model that trains on webgpu:
// tfjs-core's gradients refuse dilation); the rest keep tfjs's program, as does everything under
// GRADWIRE_WEBGPU_CONV_FILTER=tfjs (core/settings.ts).
import type { Tf } from "../tf.ts"
import { webgpuConvFilter } from "../settings.ts"
import { columnSums, type WebGpuArgs } from "./fused-layers.ts"
import type { TensorInfo } from "./wasm-heap.ts"

const KERNELS = ["Conv2DBackpropFilter", "DepthwiseConv2dNativeBackpropFilter"] as const
type Kernel = (typeof KERNELS)[number]

/**
 * The product a row (image b, output pixel yR, yC) adds to filter weight (wR, wC, ci, co): x at the
 * pixel the weight sees there (none in the padding) times dy's channel `co`. Rows in dy's order, so
 * that the threads of neighbouring columns (output channels) read neighbouring values of dy.
 */
const TERM = `
fn gwConvFilterTerm(i : i32, wR : i32, wC : i32, ci : i32, co : i32) -> f32 {
  let yC = i % uniforms.outW;
  let rest = i / uniforms.outW;
  let yR = rest % uniforms.outH;
  let b = rest / uniforms.outH;
  let xR = yR * uniforms.strideH + wR - uniforms.padT;
  let xC = yC * uniforms.strideW + wC - uniforms.padL;
  if (xR < 0 || xR >= uniforms.inH || xC < 0 || xC >= uniforms.inW) {
    return 0.0;
  }
  return gx[((b * uniforms.inH + xR) * uniforms.inW + xC) * uniforms.inC + ci] * gdy[i * uniforms.outC + co];
}`

/** What the program reads of tfjs's Conv2DInfo. */
type Conv2DInfo = {
  batchSize: number
  inHeight: number
  inWidth: number
  inChannels: number
  outHeight: number
  outWidth: number
  outChannels: number
  strideHeight: number
  strideWidth: number
  padInfo: { top: number; left: number }
}

/**
 * dW of a channels-last 2-D convolution by columnSums: rows = images x output pixels, columns =
 * filter weights ([fh, fw, ci, co]; a depthwise filter's [fh, fw, ci, multiplier] reads dy's
 * channel ci x multiplier + m).
 */
export const conv2dFilterGradWebGpu = (tf: Tf, { inputs, backend, attrs }: WebGpuArgs, depthwise = false): TensorInfo => {
  const { x, dy } = inputs as { x: TensorInfo; dy: TensorInfo }
  const filterShape = attrs.filterShape as [number, number, number, number]
  const info = tf.backend_util.computeConv2DInfo(
    x.shape as [number, number, number, number],
    filterShape,
    attrs.strides as [number, number],
    1,
    attrs.pad as never,
    attrs.dimRoundingMode as never,
    depthwise,
    "channelsLast"
  ) as unknown as Conv2DInfo
  const [fh, fw, ci, fo] = filterShape
  return columnSums(backend, {
    key: "conv2d_filter",
    names: ["gx", "gdy"],
    inputs: [x, dy],
    rows: info.batchSize * info.outHeight * info.outWidth,
    columns: fh * fw * ci * fo,
    functions: TERM,
    // The column's filter weight, in the filter's [fh, fw, ci, fo] order, and the channel of dy it meets.
    prelude: `
      let ffo = c % uniforms.filterO;
      let fci = (c / uniforms.filterO) % uniforms.inC;
      let fwC = (c / (uniforms.filterO * uniforms.inC)) % uniforms.filterW;
      let fwR = c / (uniforms.filterO * uniforms.inC * uniforms.filterW);
      let fdy = select(ffo, fci * uniforms.filterO + ffo, uniforms.depthwise == 1);`,
    terms: ["gwConvFilterTerm(i, fwR, fwC, fci, fdy)"],
    shape: [fh, fw, ci, fo],
    uniforms: {
      fields:
        "inH : i32, inW : i32, inC : i32, outH : i32, outW : i32, outC : i32, filterW : i32, filterO : i32, depthwise : i32, strideH : i32, strideW : i32, padT : i32, padL : i32,",
      values: [
        info.inHeight,
        info.inWidth,
        info.inChannels,
        info.outHeight,
        info.outWidth,
        info.outChannels,
        fw,
        fo,
        depthwise ? 1 : 0,
        info.strideHeight,
        info.strideWidth,
        info.padInfo.top,
        info.padInfo.left
      ].map((v) => ({ type: "int32", data: [v] }))
    }
  })[0]!
}

const noDilation = (d: unknown): boolean => d === undefined || d === 1 || (Array.isArray(d) && d.every((v) => v === 1))

/** Whether gradwire's program covers the call: channels-last float32 4-D, no dilation (Conv2DBackpropFilter has none). */
const covers = ({ inputs, attrs }: WebGpuArgs): boolean =>
  (attrs.dataFormat === undefined || attrs.dataFormat === "NHWC") &&
  noDilation(attrs.dilations) &&
  inputs.x?.dtype === "float32" &&
  inputs.dy?.dtype === "float32" &&
  (inputs.x?.shape.length ?? 0) === 4

let installed = false
let gradwireOn = true

/** Runs `f` with tfjs's own filter-gradient program on webgpu (for tests and benchmarks that compare the two). */
export const withTfjsConvFilter = <T>(f: () => T): T => {
  const before = gradwireOn
  gradwireOn = false
  try {
    return f()
  } finally {
    gradwireOn = before
  }
}

/**
 * On webgpu, Conv2DBackpropFilter and DepthwiseConv2dNativeBackpropFilter by conv2dFilterGradWebGpu
 * where it covers the call, tfjs's own programs elsewhere and under GRADWIRE_WEBGPU_CONV_FILTER=tfjs.
 * True once they are installed.
 */
export const installWebGpuConvFilterGrad = (tf: Tf): boolean => {
  if (installed) return true
  if (!tf.getKernel(KERNELS[0], "webgpu") || webgpuConvFilter.read() !== "gradwire") return false
  const replace = (name: Kernel): void => {
    const own = tf.getKernel(name, "webgpu")
    if (!own) return
    const ownFunc = own.kernelFunc as (args: WebGpuArgs) => TensorInfo
    const depthwise = name === "DepthwiseConv2dNativeBackpropFilter"
    tf.unregisterKernel(name, "webgpu")
    tf.registerKernel({
      ...own,
      kernelFunc: ((args: WebGpuArgs) => (gradwireOn && covers(args) ? conv2dFilterGradWebGpu(tf, args, depthwise) : ownFunc(args))) as never
    })
  }
  KERNELS.forEach(replace)
  installed = true
  return true
}
