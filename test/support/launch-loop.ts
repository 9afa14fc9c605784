// A loop for `gradwire train` (the launcher): it makes its own data (launched loops bring their
// own, no driver hands them any), fits y = 2x + 1 with one dense unit for `epochs` steps, prints
// a line with `tag` on every rank and reports the loss with a checkpoint (rank 0's), going on after
// the epoch of the checkpoint it starts from when there is one. With `data`, it trains instead one epoch
// of a softmax classifier on that dataset (a --dataset of the command line) and reports the rows
// its rank read and their feature count.
import type { FileStream, TrainContext } from "../../index.ts"

export async function launchLoop(config: { readonly epochs: number; readonly tag: string; readonly data?: string }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  console.log(`launched ${config.tag}: rank ${ctx.worldRank} of ${ctx.worldSize}`)
  if (config.data !== undefined) {
    const shard = await ctx.getDatasetShard<FileStream>(config.data)
    const d = shard.dataset
    let rows = 0
    shard.map((b) => {
      rows += b.n
      return b
    })
    const classifier = tf.sequential({ layers: [tf.layers.dense({ units: d.numClasses, inputShape: [...d.featureShape], activation: "softmax" })] })
    classifier.compile({ optimizer: tf.train.sgd(0.01), loss: "sparseCategoricalCrossentropy" })
    const [r] = await (await ctx.prepareModel(classifier)).fit(shard, { epochs: 1, batchSize: 50 })
    await ctx.report({ rows, features: d.featureShape[0]!, classes: d.numClasses, loss: r!.loss })
    return
  }
  const xs = Float32Array.from({ length: 32 }, (_, i) => (i + ctx.worldRank * 32) / 64)
  const x = tf.tensor2d(xs, [32, 1])
  const y = tf.tensor2d(xs.map((v) => 2 * v + 1), [32, 1])
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 1, inputShape: [1] })] })
  model.compile({ optimizer: tf.train.sgd(0.5), loss: "meanSquaredError" })
  const dp = await ctx.prepareModel(model)
  // started from a checkpoint (--resume-from): from the epoch after it
  const from = await ctx.getCheckpoint()
  let start = 0
  if (from) {
    await ctx.restoreModel(dp, from)
    start = Number(from.metadata?.epoch) + 1
    if (ctx.worldRank === 0) console.log(`launched ${config.tag}: resumed after epoch ${start - 1}`)
  }
  for (let epoch = start; epoch < config.epochs; epoch++) {
    const r = await dp.trainStep(x, y)
    const checkpoint = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report({ epoch, loss: r.loss }, { checkpoint })
  }
}
