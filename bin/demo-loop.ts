// The loop `gradwire demo` runs on every worker: the digits MLP (64-64-10), data-parallel, held-out
// accuracy and a checkpoint after every epoch, resuming from the latest checkpoint after a restart.
// It ships with the package (examples/ does not), so an installed gradwire can run the demo.
import type { TrainContext } from "../index.ts"

export interface DemoConfig {
  readonly epochs: number
  readonly batchSize?: number
}

export async function demoLoop(config: DemoConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const model = tf.sequential({
    layers: [tf.layers.dense({ units: 64, inputShape: [64], activation: "relu" }), tf.layers.dense({ units: 10, activation: "softmax" })]
  })
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  console.log(`rank ${ctx.worldRank}/${ctx.worldSize}: backend ${ctx.backend}, ${train.size} training rows, ${dp.parameterCount} parameters`)
  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
  }
  const xTest = tf.tensor2d(test.x as Float32Array, [test.size, 64])
  const yTest = tf.oneHot(tf.tensor1d(test.y as Int32Array, "int32"), 10)
  for (let epoch = start; epoch < config.epochs; epoch++) {
    const [r] = await dp.fit(train, { epochs: epoch + 1, initialEpoch: epoch, batchSize: config.batchSize ?? 32 })
    const val = dp.evaluate(xTest, yTest)
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report({ epoch, loss: r.loss, accuracy: r.accuracy ?? 0, val_loss: val.loss, val_accuracy: val.accuracy ?? 0 }, ckpt ? { checkpoint: ckpt } : {})
  }
  xTest.dispose()
  yTest.dispose()
}
