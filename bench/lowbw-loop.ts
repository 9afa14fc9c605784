// The per-worker loop of the low-bandwidth benchmark (lowbw.ts): an epoch at a time with dp.fit,
// then rank 0's held-out accuracy (its own parameters: under local SGD those of its last inner
// step), the seconds since training started and the bytes this rank's reductions put on the wire.
import type { TrainContext } from "../index.ts"
import { buildModel } from "../examples/digits/model.ts"

export interface LowbwConfig {
  readonly dataset: "digits" | "iris"
  readonly epochs: number
  readonly batchSize: number
  readonly learningRate: number
  /** digits: two hidden layers of this width (0: the example's 64-64-10 MLP). */
  readonly hidden?: number
}

export async function trainLoop(config: LowbwConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const features = test.featureShape[0]!
  let model
  const init = (s: number) => tf.initializers.glorotUniform({ seed: 100 + s })
  if (config.dataset === "digits" && !config.hidden) model = buildModel(tf, "mlp")
  else if (config.dataset === "digits") {
    model = tf.sequential()
    model.add(tf.layers.dense({ units: config.hidden!, activation: "relu", inputShape: [features], kernelInitializer: init(1) }))
    model.add(tf.layers.dense({ units: config.hidden!, activation: "relu", kernelInitializer: init(2) }))
    model.add(tf.layers.dense({ units: test.numClasses, activation: "softmax", kernelInitializer: init(3) }))
  } else {
    model = tf.sequential()
    model.add(tf.layers.dense({ units: 16, activation: "relu", inputShape: [features], kernelInitializer: init(1) }))
    model.add(tf.layers.dense({ units: test.numClasses, activation: "softmax", kernelInitializer: init(2) }))
  }
  model.compile({ optimizer: tf.train.adam(config.learningRate), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  const xTest = tf.tensor2d(test.x, [test.size, features])
  const yTest = tf.oneHot(tf.tensor1d(test.y as Int32Array, "int32"), test.numClasses)
  // prepareModel ends with a broadcast: every rank starts its clock at about the same moment.
  const started = performance.now()
  let samples = 0
  let steps = 0
  for (let epoch = 0; epoch < config.epochs; epoch++) {
    const [r] = await dp.fit(train, { epochs: epoch + 1, initialEpoch: epoch, batchSize: config.batchSize, onStep: (s) => void ((samples += s.samples), steps++) })
    const seconds = (performance.now() - started) / 1000
    const val = ctx.worldRank === 0 ? dp.evaluate(xTest, yTest) : { loss: 0, accuracy: 0 }
    const stats = ctx.communicationStats()
    await ctx.report({ epoch, seconds, steps, samples, loss: r!.loss, val_accuracy: val.accuracy ?? 0, wire_bytes: stats.totalWireBytes, dense_bytes: stats.totalDenseBytes })
  }
  xTest.dispose()
  yTest.dispose()
}
