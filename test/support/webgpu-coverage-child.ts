// Child of test/webgpu-layer-coverage.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): for each layer case (support/layer-cases.ts) it takes an Adam step on
// the webgpu backend, reading only asynchronously as Node's webgpu backend requires, then computes
// every weight's gradient there again (a backward pass after an update) and compares it with the
// wasm backend's from the same weights and batch (wasm's
// own gradients are checked against the cpu backend's by wasm-layer-coverage). One JSON line per
// case: { name, worst, weights } or { name, error }, after a first line naming the adapter.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { registerWasmKernels } from "../../core/kernels/register.ts"
import { requestWebGpuAdapter } from "../../core/webgpu.ts"
import { batchFor, caseNames, cases, gradientTensors, modelFor, numericGradients } from "./layer-cases.ts"

const { tf } = await loadEngine("webgpu")
await import("@tensorflow/tfjs-backend-wasm")
if (!(await tf.setBackend("wasm"))) throw new Error("the wasm backend does not start")
await tf.ready()
registerWasmKernels(tf)

/** Adam steps before the comparison. One runs the layer's forward and backward kernels and Adam's
 * update, and the gradient compared is then taken after an update; each further step cost 1-5 s
 * per case on SwiftShader (the recurrent layers most) and runs the same kernels again. */
const STEPS = 1

const runCase = async (name: string): Promise<Record<string, unknown>> => {
  const c = cases(tf)[name]
  if (typeof c === "string") return { name, none: c }
  await tf.setBackend("webgpu")
  const raw = batchFor(tf, c)
  const x = c.eager ? c.eager(tf, raw) : raw
  const model = modelFor(tf, c.eager ? { ...c, input: x.shape.slice(1) } : c)
  const opt = tf.train.adam(0.01)
  for (let s = 0; s < STEPS; s++) {
    const loss = opt.minimize(() => (model.apply(x, { training: true }) as TfType.Tensor).square().mean() as TfType.Scalar, true)!
    const v = (await loss.data())[0]!
    loss.dispose()
    if (!Number.isFinite(v)) return { name, error: `step ${s + 1}: the loss is ${v}` }
  }
  const training = !c.random
  const onGpu = await Promise.all(gradientTensors(tf, model, x, training).map((g) => g.data() as Promise<Float32Array>))
  if (c.numeric) {
    // Finite differences on webgpu itself (float32 rounding of the loss: a looser bound).
    const ref = await numericGradients(tf, model, x, training)
    let worst = 0
    for (let i = 0; i < ref.length; i++) for (let j = 0; j < ref[i]!.length; j++) if (!Number.isNaN(ref[i]![j])) worst = Math.max(worst, Math.abs(onGpu[i]![j]! - ref[i]![j]!) / (1 + Math.abs(ref[i]![j]!)))
    return { name, worst, weights: ref.length, numeric: true }
  }
  // The same weights and batch on wasm: read from the GPU, written into the variables on wasm.
  const weights = await Promise.all(model.weights.map((w) => w.read().data()))
  const xValues = await x.data()
  await tf.setBackend("wasm")
  model.weights.forEach((w, i) => w.write(tf.tensor(weights[i]!, w.shape as number[], w.dtype)))
  const xOnWasm = tf.tensor(xValues, x.shape, x.dtype)
  const onWasm = gradientTensors(tf, model, xOnWasm, training).map((g) => g.dataSync() as Float32Array)
  let worst = 0
  for (let i = 0; i < onWasm.length; i++) {
    if (onGpu[i]!.length !== onWasm[i]!.length) return { name, error: `${model.trainableWeights[i]!.name}: ${onGpu[i]!.length} gradient values on webgpu, ${onWasm[i]!.length} on wasm` }
    for (let j = 0; j < onWasm[i]!.length; j++) worst = Math.max(worst, Math.abs(onGpu[i]![j]! - onWasm[i]![j]!) / (1 + Math.abs(onWasm[i]![j]!)))
  }
  return { name, worst, weights: onWasm.length }
}

// First line: the adapter the engine runs on (the test checks it is the software one).
const found = await requestWebGpuAdapter()
process.stdout.write(`${JSON.stringify({ adapter: found.adapter ?? null, backend: tf.getBackend() })}\n`)

const names = process.argv.length > 2 ? process.argv.slice(2) : caseNames()
for (const name of names) {
  let line: Record<string, unknown>
  try {
    line = await runCase(name)
  } catch (e) {
    line = { name, error: (e instanceof Error ? e.message : String(e)).split("\n")[0] }
  }
  process.stdout.write(`${JSON.stringify(line)}\n`)
}
// Dawn keeps the process alive while navigator.gpu holds it.
process.exit(0)
