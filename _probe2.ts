import type { TrainContext } from "./index.ts"
export async function loop(config: { epochs: number }, ctx: TrainContext) {
  const tf = ctx.tf
  const shard = await ctx.getDatasetShard("train")
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 32, inputShape: [64], activation: "relu" }), tf.layers.dense({ units: 10, activation: "softmax" })] })
  model.compile({ optimizer: tf.train.adam(0.01), loss: "sparseCategoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  const resume = await ctx.getCheckpoint()
  let start = 0
  if (resume) { await ctx.restoreModel(dp, resume); start = Number(resume.metadata?.epoch) + 1 }
  await dp.fit(shard, {
    epochs: config.epochs, initialEpoch: start, batchSize: 32,
    onEpochEnd: async (r) => {
      const checkpoint = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch: r.epoch } }) : undefined
      await ctx.report({ epoch: r.epoch, loss: r.loss, accuracy: r.accuracy }, { checkpoint })
    }
  })
}
