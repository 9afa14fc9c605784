// A loop for `gradwire train` (the launcher): it makes its own data (launched loops bring their
// own, no driver hands them any), fits y = 2x + 1 with one dense unit for `epochs` steps, prints
// a line with `tag` on every rank and reports the loss.
import type { TrainContext } from "../../index.ts"

export async function launchLoop(config: { readonly epochs: number; readonly tag: string }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  console.log(`launched ${config.tag}: rank ${ctx.worldRank} of ${ctx.worldSize}`)
  const xs = Float32Array.from({ length: 32 }, (_, i) => (i + ctx.worldRank * 32) / 64)
  const x = tf.tensor2d(xs, [32, 1])
  const y = tf.tensor2d(xs.map((v) => 2 * v + 1), [32, 1])
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 1, inputShape: [1] })] })
  model.compile({ optimizer: tf.train.sgd(0.5), loss: "meanSquaredError" })
  const dp = await ctx.prepareModel(model)
  for (let epoch = 0; epoch < config.epochs; epoch++) {
    const r = await dp.trainStep(x, y)
    await ctx.report({ epoch, loss: r.loss })
  }
}
