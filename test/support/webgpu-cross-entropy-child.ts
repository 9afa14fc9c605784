// Child of test/cross-entropy.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): crossEntropy (core/kernels/cross-entropy.ts) on webgpu against
// tf.losses.softmaxCrossEntropy on one-hot labels on the cpu backend, the loss and the logits'
// gradient, and the programs a loss and its gradient record. Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { crossEntropy } from "../../core/kernels/cross-entropy.ts"
import { cases, lossAndGrad, tfjsLossAndGrad } from "./cross-entropy-cases.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
const worst: Record<string, number> = {}
const gap = (a: ArrayLike<number>, b: ArrayLike<number>): number => {
  let w = a.length === b.length ? 0 : Infinity
  for (let i = 0; i < a.length; i++) w = Math.max(w, Math.abs(a[i]! - b[i]!) / Math.max(1, Math.abs(b[i]!)))
  return w
}
for (const c of cases) {
  await tf.setBackend("webgpu")
  const ours = lossAndGrad(tf, crossEntropy, c)
  const oursData = await Promise.all(ours.map((t) => t.data()))
  await tf.setBackend("cpu")
  const theirs = tfjsLossAndGrad(tf, c)
  const theirsData = await Promise.all(theirs.map((t) => t.data()))
  worst[c.name] = Math.max(...oursData.map((d, i) => gap(d as Float32Array, theirsData[i] as Float32Array)))
  tf.dispose([...ours, ...theirs] as Tensor[])
}
await tf.setBackend("webgpu")
let programs = 0
const b = tf.backend() as unknown as { runWebGPUProgram: (...a: unknown[]) => unknown }
const own = b.runWebGPUProgram
b.runWebGPUProgram = (...a) => ((programs += 1), own.call(b, ...a))
const c = cases[0]!
const logits = tf.tensor2d(c.logits, [c.rows, c.classes])
const labels = tf.tensor1d(c.labels, "int32")
programs = 0
const g = tf.grad((z: Tensor) => crossEntropy(tf, z, labels))(logits)
await g.data()
const ourPrograms = programs
programs = 0
const g2 = tf.grad((z: Tensor) => tf.losses.softmaxCrossEntropy(tf.oneHot(labels, c.classes), z))(logits)
await g2.data()
console.log(JSON.stringify({ backend: "webgpu", worst, programs: ourPrograms, tfjsPrograms: programs }))
process.exit(0)
