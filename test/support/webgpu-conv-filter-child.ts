// Child of test/webgpu-conv-filter.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): a 2-D convolution's filter gradient on webgpu (gradwire's program,
// core/kernels/conv-grads-webgpu.ts, and tfjs's own) against float64 sums on the CPU, for LeNet's
// and the residual CNN's layers, stride 2 with uneven padding, a 1x1 filter, a batch summed in
// three levels and depthwise filters (multipliers 1 and 2); then through tf.grad of a conv2d layer,
// counting the programs that ran. Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { engineChoice, loadEngine } from "../../core/engine.ts"
import { withTfjsConvFilter } from "../../core/kernels/conv-grads-webgpu.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
const failures: string[] = []
const worst: Record<string, number> = {}
/** The worst error of a weight's float32 sum against the float64 one, relative to the sum of its products' magnitudes (how large float32 rounding can make it). */
const close = (what: string, got: ArrayLike<number>, { dw: want, magnitude }: { dw: Float64Array; magnitude: Float64Array }, tol: number): void => {
  if (got.length !== want.length) return void failures.push(`${what}: ${got.length} values, expected ${want.length}`)
  let err = 0
  for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i]! - want[i]!) / Math.max(1e-6, magnitude[i]!))
  worst[what] = err
  if (!(err <= tol)) failures.push(`${what}: relative error ${err} > ${tol}`)
}
const values = (n: number, seed: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 131 + i * 0.37) * 2 + Math.cos(i * 0.013) * 0.5)

/**
 * dW in float64 (for every image, output pixel and weight, x at the pixel the weight sees times dy),
 * and per weight the sum of those products' magnitudes. `multiplier`: a depthwise filter's
 * [FH, FW, C, multiplier], whose weight (ci, m) meets dy's channel ci x multiplier + m.
 */
const reference = (
  x: Float32Array, [B, H, W, C]: number[], dy: Float32Array, [OH, OW, DYC]: number[], [FH, FW]: number[], [SH, SW]: number[], [PT, PL]: number[], multiplier?: number
): { dw: Float64Array; magnitude: Float64Array } => {
  const CO = multiplier ?? DYC
  const dw = new Float64Array(FH * FW * C * CO)
  const magnitude = new Float64Array(dw.length)
  for (let b = 0; b < B; b++)
    for (let yr = 0; yr < OH; yr++)
      for (let yc = 0; yc < OW; yc++)
        for (let fr = 0; fr < FH; fr++) {
          const xr = yr * SH + fr - PT
          if (xr < 0 || xr >= H) continue
          for (let fc = 0; fc < FW; fc++) {
            const xc = yc * SW + fc - PL
            if (xc < 0 || xc >= W) continue
            for (let ci = 0; ci < C; ci++) {
              const xv = x[((b * H + xr) * W + xc) * C + ci]!
              const o = ((fr * FW + fc) * C + ci) * CO
              const d = ((b * OH + yr) * OW + yc) * DYC + (multiplier === undefined ? 0 : ci * multiplier)
              for (let co = 0; co < CO; co++) {
                dw[o + co] += xv * dy[d + co]!
                magnitude[o + co] += Math.abs(xv * dy[d + co]!)
              }
            }
          }
        }
  return { dw, magnitude }
}

const filterGrad = (x: Tensor, dy: Tensor, filterShape: number[], strides: [number, number], pad: string, depthwise = false): Tensor =>
  depthwise
    ? (tf.engine().runKernel("DepthwiseConv2dNativeBackpropFilter", { x, dy }, { strides, pad, dilations: [1, 1], filterShape } as never) as Tensor)
    : (tf.engine().runKernel("Conv2DBackpropFilter", { x, dy }, { strides, pad, dataFormat: "NHWC", filterShape } as never) as Tensor)
let programs = 0
const backend = tf.backend() as unknown as { runWebGPUProgram: (p: { shaderKey?: string }, ...a: unknown[]) => unknown }
const run = backend.runWebGPUProgram
backend.runWebGPUProgram = (p, ...a) => ((programs += p.shaderKey?.startsWith("gradwire_colsum_") ? 1 : 0), run.call(backend, p, ...a))

const cases: Array<{ name: string; x: [number, number, number, number]; filter: [number, number, number, number]; strides: [number, number]; pad: "same" | "valid"; depthwise?: true }> = [
  { name: "LeNet's first layer", x: [4, 28, 28, 1], filter: [5, 5, 1, 6], strides: [1, 1], pad: "same" },
  { name: "LeNet's second layer", x: [3, 14, 14, 6], filter: [5, 5, 6, 16], strides: [1, 1], pad: "valid" },
  { name: "a residual block's layer", x: [8, 8, 8, 16], filter: [3, 3, 16, 16], strides: [1, 1], pad: "same" },
  { name: "stride 2, uneven padding", x: [2, 9, 7, 3], filter: [3, 3, 3, 5], strides: [2, 2], pad: "same" },
  { name: "a 1x1 filter", x: [2, 5, 5, 7], filter: [1, 1, 7, 3], strides: [1, 1], pad: "valid" },
  { name: "a batch of three levels", x: [288, 32, 32, 1], filter: [3, 3, 1, 16], strides: [1, 1], pad: "same" },
  { name: "depthwise", x: [4, 12, 12, 8], filter: [3, 3, 8, 1], strides: [1, 1], pad: "same", depthwise: true },
  { name: "depthwise, multiplier 2, stride 2", x: [3, 9, 9, 4], filter: [3, 3, 4, 2], strides: [2, 2], pad: "valid", depthwise: true }
]
const programsPer: Record<string, number> = {}
for (const c of cases) {
  const xv = values(c.x.reduce((a, b) => a * b, 1), c.x[1] + c.filter[3])
  const x = tf.tensor4d(xv, c.x)
  const w = tf.zeros(c.filter) as TfType.Tensor4D
  const shape = (c.depthwise ? tf.depthwiseConv2d(x, w, c.strides, c.pad) : tf.conv2d(x, w, c.strides, c.pad)).shape as [number, number, number, number]
  const dyv = values(shape.reduce((a, b) => a * b, 1), 3)
  const dy = tf.tensor4d(dyv, shape)
  const info = tf.backend_util.computeConv2DInfo(c.x, c.filter, c.strides, 1, c.pad, undefined, c.depthwise ?? false)
  const want = reference(xv, c.x, dyv, [shape[1], shape[2], shape[3]], [c.filter[0], c.filter[1]], c.strides, [info.padInfo.top, info.padInfo.left], c.depthwise ? c.filter[3] : undefined)
  const before = programs
  const ours = filterGrad(x, dy, c.filter, c.strides, c.pad, c.depthwise)
  programsPer[c.name] = programs - before
  const tol = 1e-5
  close(`${c.name}: gradwire`, (await ours.data()) as Float32Array, want, tol)
  const theirs = withTfjsConvFilter(() => filterGrad(x, dy, c.filter, c.strides, c.pad, c.depthwise))
  close(`${c.name}: tfjs`, (await theirs.data()) as Float32Array, want, tol)
  tf.dispose([x, w, dy, ours, theirs])
}

// Through tf.grad of a conv2d with a bias and ReLU, as a layer trains: the filter's gradient is the reference's for dy masked by the ReLU.
{
  const xs: [number, number, number, number] = [6, 10, 10, 4]
  const fs: [number, number, number, number] = [3, 3, 4, 8]
  const xv = values(xs.reduce((a, b) => a * b, 1), 11)
  const wv = values(fs.reduce((a, b) => a * b, 1), 12).map((v) => v * 0.2)
  const x = tf.tensor4d(xv, xs)
  const w = tf.tensor4d(wv, fs)
  const r = tf.tensor4d(values(6 * 10 * 10 * 8, 13), [6, 10, 10, 8])
  const before = programs
  const g = tf.grad((f: Tensor) => tf.sum(tf.mul(tf.relu(tf.conv2d(x, f as TfType.Tensor4D, 1, "same")), r)))(w)
  const gradPrograms = programs - before
  const y = tf.conv2d(x, w, 1, "same")
  const dyv = Float32Array.from(await tf.mul(tf.step(y), r).data())
  close("tf.grad of conv2d + ReLU", (await g.data()) as Float32Array, reference(xv, xs, dyv, [10, 10, 8], [3, 3], [1, 1], [1, 1]), 1e-5)
  programsPer["tf.grad"] = gradPrograms
  tf.dispose([x, w, r, g, y])
}

console.log(JSON.stringify({ backend: tf.getBackend(), engine: engineChoice(), failures, worst, programs: programsPer }))
process.exit(0)
