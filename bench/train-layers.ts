// What gradwire's convolution layers while training (core/kernels/train-layers.ts: the bias and ReLU
// in the convolution's kernel, no gradient for the data) save against tfjs-layers' own Conv2D
// and Conv1D calls: a plain tfjs training step (Adam) of the zoo's residual CNN, LeNet, CNN and
// embedding model (bench/zoo-step.ts) and of a ResNet-style stem model (7x7 stride 2 on
// [64, 64, 3], 32 filters, no bias, batch norm, ReLU, a 3x3 convolution, pooling, a dense layer;
// batch 16), each call alternated block by block in one process, so drift hits both alike. Prints
// the medians of ms per step and the convolution input gradients a step runs.
//
//   node bench/train-layers.ts [--backend wasm] [--steps 10] [--rounds 6]
import { optionReader } from "./args.ts"
import { loadEngine, type BackendKind } from "../index.ts"
import { withTfjsTrainLayers } from "../core/kernels/train-layers.ts"
import { median } from "../scheduler/cost-model.ts"
import { plainZooStep } from "./zoo-step.ts"

const option = optionReader(process.argv.slice(2))
const steps = Number(option("--steps", "10"))
const rounds = Number(option("--rounds", "6"))
const { tf, backend } = await loadEngine(option("--backend", "wasm") as BackendKind)

/** The stem model's step. */
const stemStep = (): (() => Promise<void>) => {
  const L = tf.layers
  const m = tf.sequential()
  m.add(L.conv2d({ inputShape: [64, 64, 3], filters: 32, kernelSize: 7, strides: 2, padding: "same", useBias: false, kernelInitializer: tf.initializers.heNormal({ seed: 1 }) }))
  m.add(L.batchNormalization({}))
  m.add(L.activation({ activation: "relu" }))
  m.add(L.conv2d({ filters: 32, kernelSize: 3, padding: "same", useBias: false, kernelInitializer: tf.initializers.heNormal({ seed: 2 }) }))
  m.add(L.batchNormalization({}))
  m.add(L.activation({ activation: "relu" }))
  m.add(L.globalAveragePooling2d({}))
  m.add(L.dense({ units: 10, kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) }))
  const x = tf.randomNormal([16, 64, 64, 3], 0, 1, "float32", 4)
  const y = tf.oneHot(tf.tensor1d(Array.from({ length: 16 }, (_, i) => i % 10), "int32"), 10)
  const adam = tf.train.adam(0.001)
  return async () => {
    const cost = adam.minimize(() => tf.losses.softmaxCrossEntropy(y, m.apply(x, { training: true }) as import("@tensorflow/tfjs").Tensor) as import("@tensorflow/tfjs").Scalar, true)!
    await cost.data()
    cost.dispose()
  }
}

console.log(`backend ${backend}, ${rounds} rounds of ${steps} steps per call, alternated`)
console.log("model                  tfjs-layers' call ms/step  gradwire's ms/step   conv input gradients a step (tfjs-layers', gradwire's)")
const models: Array<[string, () => Promise<() => Promise<void>>]> = [
  ["residual CNN, b32", async () => (await plainZooStep(tf, "resnet", 32)).step],
  ["LeNet, b32", async () => (await plainZooStep(tf, "lenet", 32)).step],
  ["CNN, b32", async () => (await plainZooStep(tf, "cnn", 32)).step],
  ["embedding, b32", async () => (await plainZooStep(tf, "embedding", 32)).step],
  ["7x7/2 stem, b16", async () => stemStep()]
]
for (const [name, make] of models) {
  const step = await make()
  // The model's calls run inside minimize, before its first await: the swap covers them.
  const run = (tfjs: boolean): Promise<void> => (tfjs ? withTfjsTrainLayers(tf, step) : step())
  for (let i = 0; i < 3; i++) for (const tfjs of [true, false]) await run(tfjs)
  const inputGrads = async (tfjs: boolean): Promise<number> => (await tf.profile(() => run(tfjs))).kernels.filter((k) => k.name === "Conv2DBackpropInput").length
  const counts = [await inputGrads(true), await inputGrads(false)]
  const times: [number[], number[]] = [[], []]
  for (let r = 0; r < rounds; r++)
    for (const tfjs of [true, false]) {
      const t0 = performance.now()
      for (let i = 0; i < steps; i++) await run(tfjs)
      times[tfjs ? 0 : 1].push((performance.now() - t0) / steps)
    }
  console.log(`${name.padEnd(22)} ${median(times[0]).toFixed(2).padEnd(26)} ${median(times[1]).toFixed(2).padEnd(20)} ${counts.join(", ")}`)
}
process.exit(0)
