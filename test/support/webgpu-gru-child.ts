// Child of test/webgpu-gru.test.ts, started with the SwiftShader environment (support/swiftshader.ts):
// a GRU tagger on webgpu with gradwire's GRU kernels against the same model with tfjs-layers' own
// GRU cell on webgpu and on the cpu backend: the loss and every weight's gradient, for both
// recurrent activations, every step's outputs or the last one's, with the layer's loop over the
// fused cell (core/kernels/gru-cell.ts, withoutGruSequence) and with the whole recurrence as one
// program each way (core/kernels/gru-sequence.ts); the programs a training step records each way,
// at two sequence lengths; the layers the loop keeps (a mask, going backwards). Prints one JSON line.
import type * as TfType from "@tensorflow/tfjs"
import { loadEngine } from "../../core/engine.ts"
import { GRU_UPDATE, withoutGruSequence, withTfjsGruCell } from "../../core/kernels/gru-cell.ts"
import { GRU_SEQUENCE } from "../../core/kernels/gru-sequence.ts"

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
    L.gru({
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
/** The loss and every gradient, with the programs recorded and whether gradwire's cell and sequence kernels ran. */
const run = async (c: Case, backend: string, how: (f: () => Tensor[]) => Tensor[]): Promise<{ values: Float32Array[]; programs: number; fused: boolean; sequence: boolean }> => {
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
  let fused = false
  let sequence = false
  const engine = tf.engine() as unknown as { runKernel: (name: string, ...a: unknown[]) => unknown }
  const runKernel = engine.runKernel
  engine.runKernel = function (name: string, ...a: unknown[]) {
    if (name === GRU_UPDATE) fused = true
    if (name === GRU_SEQUENCE) sequence = true
    return runKernel.call(this, name, ...a)
  }
  let out: Tensor[]
  try {
    out = how(step)
  } finally {
    engine.runKernel = runKernel
    if (own) b.runWebGPUProgram = own
  }
  const values = await Promise.all(out.map((t) => t.data() as Promise<Float32Array>))
  out.forEach((t) => t.dispose())
  m.layers.forEach((l) => l.dispose())
  x.dispose()
  labels.dispose()
  return { values, programs, fused, sequence }
}
const worst = (a: Float32Array[], b: Float32Array[]): number => {
  let err = a.length === b.length ? 0 : Infinity
  a.forEach((v, i) => v.forEach((x, j) => (err = Math.max(err, Math.abs(x - b[i]![j]!) / Math.max(1e-2, Math.abs(b[i]![j]!))))))
  return err
}
const plain = (f: () => Tensor[]) => f()
const loop = (f: () => Tensor[]) => withoutGruSequence(f)
const tfjs = (f: () => Tensor[]) => withTfjsGruCell(tf, f)
const cases: Case[] = [
  { name: "every step, hardSigmoid", units: 16, steps: 7, returnSequences: true, recurrentActivation: "hardSigmoid" },
  { name: "the last step, sigmoid", units: 12, steps: 7, returnSequences: false, recurrentActivation: "sigmoid" }
]
// The layer's loop over the fused cell.
const results = []
for (const c of cases) {
  const ours = await run(c, "webgpu", loop)
  const theirs = await run(c, "webgpu", tfjs)
  const cpu = await run(c, "cpu", tfjs)
  results.push({ name: c.name, fused: ours.fused, tfjsFused: theirs.fused, againstTfjs: worst(ours.values, theirs.values), againstTfjsCpu: worst(ours.values, cpu.values), programs: ours.programs, tfjsPrograms: theirs.programs })
}
// The whole recurrence as one program each way: against the loop and tfjs-layers' own GRU on cpu.
const sequenceCases: Case[] = [
  ...cases,
  { name: "144 units (288 gate columns, more than a workgroup's 256 threads)", units: 144, steps: 4, returnSequences: true, recurrentActivation: "sigmoid" },
  { name: "one time step", units: 8, steps: 1, returnSequences: true, recurrentActivation: "hardSigmoid" }
]
const sequence = []
for (const c of sequenceCases) {
  const whole = await run(c, "webgpu", plain)
  const stepped = await run(c, "webgpu", loop)
  const reference = await run(c, "cpu", tfjs)
  sequence.push({ name: c.name, ran: whole.sequence, loopRan: stepped.sequence, againstLoop: worst(whole.values, stepped.values), againstTfjsCpu: worst(whole.values, reference.values), programs: whole.programs, loopPrograms: stepped.programs })
}
// Programs per training step at two lengths: the whole sequence's do not grow with it.
const at = async (steps: number, extra: Partial<Case> = {}) => (await run({ name: "", units: 16, steps, returnSequences: true, recurrentActivation: "hardSigmoid", ...extra }, "webgpu", plain)).programs
const lengths = { short: await at(8), long: await at(32) }
// Layers the loop keeps: their programs grow with the length, and the values are tfjs-layers'.
const masked = { short: await at(8, { maskZero: true }), long: await at(32, { maskZero: true }) }
const backwards = { short: await at(8, { goBackwards: true }), long: await at(32, { goBackwards: true }) }
const backwardsCase: Case = { name: "", units: 16, steps: 9, returnSequences: true, recurrentActivation: "hardSigmoid", goBackwards: true }
const backwardsAgainstTfjsCpu = worst((await run(backwardsCase, "webgpu", plain)).values, (await run(backwardsCase, "cpu", tfjs)).values)
await tf.setBackend("webgpu")
console.log(JSON.stringify({ backend: tf.getBackend(), results, sequence, lengths, masked, backwards, backwardsAgainstTfjsCpu }))
process.exit(0)
