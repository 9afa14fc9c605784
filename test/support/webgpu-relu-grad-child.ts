// Child of test/webgpu-relu-grad.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): ReLU's gradient on webgpu (core/kernels/relu-grad.ts, one program)
// against the cpu backend's (tfjs's dy · step(x)), on values with zeros, negatives and NaN, and the
// programs it records. Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { engineChoice, loadEngine } from "../../core/engine.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
const n = 4 * 9 * 9 * 5
const xv = Float32Array.from({ length: n }, (_, i) => (i % 17 === 0 ? 0 : i % 29 === 0 ? NaN : Math.sin(i * 0.7) * 3))
const dyv = Float32Array.from({ length: n }, (_, i) => Math.cos(i * 0.3) * 2)
const grad = async (): Promise<Float32Array> => {
  const x = tf.tensor4d(xv, [4, 9, 9, 5])
  const dy = tf.tensor4d(dyv, [4, 9, 9, 5])
  const g = tf.grad((a: Tensor) => tf.relu(a))(x, dy)
  const out = (await g.data()) as Float32Array
  tf.dispose([x, dy, g])
  return Float32Array.from(out)
}
const gpu = await grad()
let programs = 0
{
  const b = tf.backend() as unknown as { runWebGPUProgram: (...a: unknown[]) => unknown }
  const own = b.runWebGPUProgram
  const x = tf.tensor4d(xv, [4, 9, 9, 5])
  const dy = tf.tensor4d(dyv, [4, 9, 9, 5])
  b.runWebGPUProgram = (...a) => ((programs += 1), own.call(b, ...a))
  // The forward Relu and the gradient: tfjs's gradient would add Step and Multiply.
  const g = tf.grad((a: Tensor) => tf.relu(a))(x, dy)
  await g.data()
  b.runWebGPUProgram = own
  tf.dispose([x, dy, g])
}
await tf.setBackend("cpu")
const cpu = await grad()
let mismatches = 0
for (let i = 0; i < n; i++) if (!(Object.is(gpu[i], cpu[i]) || gpu[i] === cpu[i] || (Number.isNaN(gpu[i]) && Number.isNaN(cpu[i])))) mismatches++
const nan = Array.from(gpu).filter((v) => Number.isNaN(v)).length
console.log(JSON.stringify({ engine: engineChoice(), mismatches, nan, programs, n }))
process.exit(0)
