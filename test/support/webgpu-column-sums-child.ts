// Child of test/webgpu-column-sums.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): columnSums (core/kernels/fused-layers.ts) against sums in float64 on
// the CPU, for shapes that take one level, two and three, with one and two terms, a column count
// that does not divide a workgroup and one above it; then batch and layer normalization's webgpu
// kernels on inputs large enough to be summed in several chunks, against the cpu backend's (the
// same kernels' host side, float64 sums). Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { batchNormTrain } from "../../core/kernels/batch-norm-train.ts"
import { columnSumGroups, columnSums, type WebGpuBackend } from "../../core/kernels/fused-layers.ts"
import { layerNorm } from "../../core/kernels/layer-norm.ts"
import type { TensorInfo } from "../../core/kernels/wasm-heap.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
const failures: string[] = []
const worst: Record<string, number> = {}
const close = (what: string, got: ArrayLike<number>, want: ArrayLike<number>, tol: number): void => {
  if (got.length !== want.length) return void failures.push(`${what}: ${got.length} values, expected ${want.length}`)
  let err = 0
  for (let i = 0; i < want.length; i++) err = Math.max(err, Math.abs(got[i]! - want[i]!) / Math.max(1, Math.abs(want[i]!)))
  worst[what] = err
  if (!(err <= tol)) failures.push(`${what}: relative error ${err} > ${tol}`)
}
const values = (n: number, seed: number): Float32Array => Float32Array.from({ length: n }, (_, i) => Math.sin(seed * 131 + i * 0.37) * 3 + Math.cos(i * 0.011) + 0.5)

// 1. columnSums itself.
const backend = tf.backend() as unknown as WebGpuBackend
const read = async (info: TensorInfo | undefined): Promise<Float32Array> => {
  const t = tf.engine().makeTensorFromTensorInfo(info as never)
  const v = (await t.data()) as Float32Array
  t.dispose()
  return v
}
const levels = (rows: number, columns: number): number => {
  let n = 1
  for (let r = columnSumGroups(rows, columns); r > 1; r = columnSumGroups(r, columns)) n++
  return n
}
const shapes: Array<[number, number]> = [
  [5, 2],
  [7, 3],
  [3000, 24],
  [70_000, 16],
  [200_000, 1],
  [10_000, 520],
  [270_000, 130]
]
const levelsSeen: number[] = []
for (const [M, C] of shapes) {
  levelsSeen.push(levels(M, C))
  const xv = values(M * C, M + C)
  const wv = values(C, 7)
  const x = tf.tensor2d(xv, [M, C]).add(0)
  const w = tf.tensor1d(wv).add(0)
  const [plain, weighted] = columnSums(backend, {
    key: "test_columns",
    names: ["gx", "gw"],
    inputs: [x as unknown as TensorInfo, w as unknown as TensorInfo],
    rows: M,
    columns: C,
    prelude: "let k = gw[c] * uniforms.factor;",
    terms: ["gx[i * C + c]", "gx[i * C + c] * gx[i * C + c] * k"],
    scale: [1 / M, 1],
    uniforms: { fields: "factor : f32,", values: [{ type: "float32", data: [0.5] }] }
  })
  const want0 = new Float64Array(C)
  const want1 = new Float64Array(C)
  for (let i = 0; i < M; i++)
    for (let c = 0; c < C; c++) {
      const v = xv[i * C + c]!
      want0[c] += v / M
      want1[c] += v * v * wv[c]! * 0.5
    }
  close(`columnSums [${M}, ${C}] mean`, await read(plain), want0, 1e-4)
  close(`columnSums [${M}, ${C}] weighted squares`, await read(weighted), want1, 1e-4)
  x.dispose()
  w.dispose()
}

// 2. Batch and layer normalization's kernels, on webgpu and on cpu, from the same values.
const run = async (name: string, f: () => Tensor[]): Promise<Float32Array[]> => {
  await tf.setBackend(name)
  const outs = f()
  const data = await Promise.all(outs.map((t) => t.data() as Promise<Float32Array>))
  outs.forEach((t) => t.dispose())
  return data
}
const both = async (what: string, f: () => Tensor[], tol: number): Promise<void> => {
  const gpu = await run("webgpu", f)
  const cpu = await run("cpu", f)
  gpu.forEach((g, i) => close(`${what} ${i}`, g, cpu[i]!, tol))
}
const bnShape = [64, 16, 16, 12]
const bnSize = bnShape.reduce((a, b) => a * b, 1)
const bn = (): Tensor[] =>
  tf.tidy(() => {
    const x = tf.tensor(values(bnSize, 1), bnShape)
    const gamma = tf.tensor1d(values(12, 2))
    const beta = tf.tensor1d(values(12, 3))
    const dy = tf.tensor(values(bnSize, 4), bnShape)
    const [y, mean, variance] = batchNormTrain(tf, x, gamma, beta, 1e-3)
    const grads = tf.grads((a: Tensor, g: Tensor, b: Tensor) => tf.sum(tf.mul(batchNormTrain(tf, a, g, b, 1e-3)[0], dy)))([x, gamma, beta])
    return [y, mean, variance, ...grads]
  })
await both(`batch norm [${bnShape}] (y, mean, variance, dx, dgamma, dbeta)`, bn, 2e-3)
const lnShape = [4096, 64]
const lnSize = lnShape[0]! * lnShape[1]!
const ln = (): Tensor[] =>
  tf.tidy(() => {
    const x = tf.tensor(values(lnSize, 5), lnShape)
    const gamma = tf.tensor1d(values(64, 6))
    const beta = tf.tensor1d(values(64, 7))
    const dy = tf.tensor(values(lnSize, 8), lnShape)
    const y = layerNorm(tf, x, gamma, beta, 1e-3)
    const grads = tf.grads((a: Tensor, g: Tensor, b: Tensor) => tf.sum(tf.mul(layerNorm(tf, a, g, b, 1e-3), dy)))([x, gamma, beta])
    return [y, ...grads]
  })
await both(`layer norm [${lnShape}] (y, dx, dgamma, dbeta)`, ln, 2e-3)

// The layer's moving statistics after a training call (one kernel per statistic: MOVING_AVERAGE).
const moving = (): Tensor[] =>
  tf.tidy(() => {
    const layer = tf.layers.batchNormalization({ momentum: 0.9, movingMeanInitializer: "ones", movingVarianceInitializer: "ones" })
    layer.apply(tf.tensor(values(bnSize, 9), bnShape), { training: true })
    const out = layer.getWeights().slice(2).map((w) => w.clone())
    layer.dispose()
    return out
  })
await both("moving statistics (mean, variance)", moving, 1e-5)
let movingKernels = 0
{
  await tf.setBackend("webgpu")
  const b = tf.backend() as unknown as { runWebGPUProgram: (p: { shaderKey?: string }, ...a: unknown[]) => unknown }
  const own = b.runWebGPUProgram
  b.runWebGPUProgram = (p, ...a) => ((movingKernels += p.shaderKey?.startsWith("gradwire_moving_average") ? 1 : 0), own.call(b, p, ...a))
  tf.dispose(moving())
  b.runWebGPUProgram = own
}

console.log(JSON.stringify({ movingKernels, backend: "webgpu", failures, worst, levels: levelsSeen, bnGroups: columnSumGroups(bnSize / 12, 12), lnGroups: columnSumGroups(4096, 64) }))
process.exit(0)
