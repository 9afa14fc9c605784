// Child of test/webgpu-lstm-sequence.test.ts, started with the SwiftShader environment
// (support/swiftshader.ts): the LSTM layer on webgpu with its whole recurrence as one program each
// way (core/kernels/lstm-sequence.ts), against the same layer stepping through its loop with the
// fused cell (withoutLstmSequence) and against tfjs-layers' own layer on the cpu backend: the loss
// and every weight's gradient of a small tagger, for both recurrent activations, every step's
// outputs or the last one's, more units than a workgroup has threads, one time step; the programs
// recorded per training step at two sequence lengths; and the layers the loop keeps (a mask, going
// backwards). Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { withoutLstmSequence, withTfjsLstmCell } from "../../core/kernels/lstm-cell.ts"

type Tensor = TfType.Tensor
const { tf } = await loadEngine("webgpu")
const L = tf.layers

interface Case {
  name: string
  units: number
  steps: number
  returnSequences: boolean
  recurrentActivation: "hardSigmoid" | "sigmoid"
  maskZero?: boolean
  goBackwards?: boolean
}
const build = (c: Case) => {
  const m = tf.sequential()
  m.add(L.embedding({ inputDim: 30, outputDim: 12, inputLength: c.steps, inputShape: [c.steps], maskZero: c.maskZero ?? false, embeddingsInitializer: tf.initializers.randomUniform({ minval: -0.5, maxval: 0.5, seed: 1 }) }))
  m.add(
    L.lstm({
      units: c.units,
      returnSequences: c.returnSequences,
      recurrentActivation: c.recurrentActivation,
      goBackwards: c.goBackwards ?? false,
      kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }),
      recurrentInitializer: tf.initializers.glorotUniform({ seed: 3 }),
      biasInitializer: tf.initializers.randomUniform({ minval: -0.3, maxval: 0.3, seed: 4 })
    })
  )
  m.add(L.dense({ units: 7, kernelInitializer: tf.initializers.glorotUniform({ seed: 5 }) }))
  return m
}
const B = 6
/** The loss and every gradient, with the programs recorded while computing them. */
const run = async (c: Case, backend: string, how: (f: () => Tensor[]) => Tensor[]): Promise<{ values: Float32Array[]; programs: number }> => {
  await tf.setBackend(backend)
  const m = build(c)
  const ids = Array.from({ length: B * c.steps }, (_, i) => (c.maskZero && i % 5 === 4 ? 0 : ((i * 7 + 3) % 29) + 1))
  const x = tf.tensor2d(ids, [B, c.steps], "int32")
  const labels = tf.oneHot(tf.tensor1d(Array.from({ length: c.returnSequences ? B * c.steps : B }, (_, i) => (i * 3) % 7), "int32"), 7)
  const vars = m.trainableWeights.map((w) => (w as unknown as { val: TfType.Variable }).val)
  const step = () =>
    tf.tidy(() => {
      const { value, grads } = tf.variableGrads(() => tf.losses.softmaxCrossEntropy(labels, tf.reshape(m.apply(x, { training: true }) as Tensor, [-1, 7])) as TfType.Scalar, vars)
      return [value, ...vars.map((v) => grads[v.name]!)]
    })
  const b = tf.backend() as unknown as { runWebGPUProgram?: (...a: unknown[]) => unknown }
  let programs = 0
  const own = b.runWebGPUProgram
  if (own) b.runWebGPUProgram = (...a: unknown[]) => (programs++, own.apply(b, a))
  const out = how(step)
  if (own) b.runWebGPUProgram = own
  const values = await Promise.all(out.map((t) => t.data() as Promise<Float32Array>))
  out.forEach((t) => t.dispose())
  m.layers.forEach((l) => l.dispose())
  x.dispose()
  labels.dispose()
  return { values, programs }
}
const worst = (a: Float32Array[], b: Float32Array[]): number => {
  let err = a.length === b.length ? 0 : Infinity
  a.forEach((v, i) => v.forEach((x, j) => (err = Math.max(err, Math.abs(x - b[i]![j]!) / Math.max(1e-2, Math.abs(b[i]![j]!))))))
  return err
}
const plain = (f: () => Tensor[]) => f()
const cases: Case[] = [
  { name: "every step, hardSigmoid", units: 16, steps: 9, returnSequences: true, recurrentActivation: "hardSigmoid" },
  { name: "the last step, sigmoid", units: 16, steps: 9, returnSequences: false, recurrentActivation: "sigmoid" },
  { name: "80 units (320 gates, more than a workgroup's 256 threads)", units: 80, steps: 5, returnSequences: true, recurrentActivation: "sigmoid" },
  { name: "one time step", units: 8, steps: 1, returnSequences: true, recurrentActivation: "hardSigmoid" }
]
const results: Array<{ name: string; againstLoop: number; againstTfjsCpu: number; programs: number; loopPrograms: number }> = []
for (const c of cases) {
  const whole = await run(c, "webgpu", plain)
  const loop = await run(c, "webgpu", (f) => withoutLstmSequence(f))
  const reference = await run(c, "cpu", (f) => withTfjsLstmCell(tf, f))
  results.push({ name: c.name, againstLoop: worst(whole.values, loop.values), againstTfjsCpu: worst(whole.values, reference.values), programs: whole.programs, loopPrograms: loop.programs })
}
// Programs per training step at two lengths: the whole sequence's do not grow with it.
const at = async (steps: number, extra: Partial<Case> = {}) => (await run({ name: "", units: 16, steps, returnSequences: true, recurrentActivation: "hardSigmoid", ...extra }, "webgpu", plain)).programs
const lengths = { short: await at(8), long: await at(32) }
// Layers the loop keeps: their programs grow with the length.
const masked = { short: await at(8, { maskZero: true }), long: await at(32, { maskZero: true }) }
const backwards = { short: await at(8, { goBackwards: true }), long: await at(32, { goBackwards: true }) }
const backwardsValues = await run({ name: "", units: 16, steps: 9, returnSequences: true, recurrentActivation: "hardSigmoid", goBackwards: true }, "webgpu", plain)
const backwardsReference = await run({ name: "", units: 16, steps: 9, returnSequences: true, recurrentActivation: "hardSigmoid", goBackwards: true }, "cpu", (f) => withTfjsLstmCell(tf, f))
console.log(JSON.stringify({ backend: "webgpu", results, lengths, masked, backwards, backwardsAgainstTfjsCpu: worst(backwardsValues.values, backwardsReference.values) }))
process.exit(0)
