// A loop that reports the ways a new user does: a metric kept as a tensor (`mode: "scalar"`, a
// tf.Scalar loss, beside a bigint, a Date and an undefined value; `"vector"`, a tensor of 3 elements), or report() calls it does not await
// (`"unawaited"`, two an epoch, their scalar disposed at once, the last one still on its way when the
// loop returns). `"no-dataset"` asks for a
// dataset the Trainer was not given; `"no-await"` forgets to await ctx.prepareModel; `"shape"` steps on
// rows of 5 features where the model takes 4 (tfjs-layers refuses the shape), `"keras-shape"` the
// same through the model's own fit(), `"op-shape"` multiplies matrices whose shapes do not fit
// (tfjs-core refuses them); `"accumulated"` ends with two batches added by trainStep({ accumulate:
// true }) that no update applies; `"reserved"` reports a metric named `report`, metrics.jsonl's report number, and
// `"reserved-time"` one named `time`, the row's stamp.
import type { TrainContext } from "../../index.ts"

export async function reportLoop(config: { mode: "scalar" | "vector" | "unawaited" | "no-dataset" | "no-await" | "shape" | "keras-shape" | "op-shape" | "accumulated" | "reserved" | "reserved-time"; epochs: number }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  if (config.mode === "no-dataset") await ctx.getDatasetShard("train")
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 3, inputShape: [4], activation: "softmax" })] })
  model.compile({ optimizer: tf.train.sgd(0.1), loss: "sparseCategoricalCrossentropy" })
  // (`"no-await"`: the model prepared without await, as Node runs TypeScript unchecked)
  const dp = config.mode === "no-await" ? (ctx.prepareModel(model) as unknown as Awaited<ReturnType<TrainContext["prepareModel"]>>) : await ctx.prepareModel(model)
  const x = tf.tensor2d([1, 0, 0, 0, 0, 1, 0, 0, 0, 0, 1, 0], [3, 4])
  const y = tf.tensor1d([0, 1, 2])
  if (config.mode === "shape") await dp.trainStep(tf.zeros([3, 5]), y)
  if (config.mode === "op-shape") tf.matMul(x, tf.zeros([3, 2]))
  if (config.mode === "keras-shape") await model.fit(tf.zeros([3, 5]), y, { epochs: 1, batchSize: 3, verbose: 0 })
  for (let epoch = 0; epoch < config.epochs; epoch++) {
    const { loss } = await dp.trainStep(x, y)
    // with values JSON has no form for (a bigint, one past 2^53, a Date) and one left undefined
    if (config.mode === "scalar") await ctx.report({ epoch, loss: tf.scalar(loss), steps: BigInt(epoch + 1), huge: 2n ** 70n, at: new Date(Date.UTC(2026, 0, 1)), gone: undefined })
    else if (config.mode === "accumulated") {
      await ctx.report({ epoch, loss })
      if (epoch === config.epochs - 1) for (let i = 0; i < 2; i++) await dp.trainStep(x, y, { accumulate: true })
    } else if (config.mode === "reserved") await ctx.report({ epoch, loss, report: 1 })
    else if (config.mode === "reserved-time") await ctx.report({ epoch, loss, time: 1.5 })
    else if (config.mode === "vector") await ctx.report({ epoch, losses: tf.tensor1d([loss, loss, loss]) })
    else {
      // two reports, not awaited (the second waits for the first), their tensors disposed at once
      const l = tf.scalar(loss)
      void ctx.report({ epoch, loss: l })
      void ctx.report({ epoch, loss: l })
      l.dispose()
    }
  }
}

/** A loop made by a function (a closure): no module exports it, so it cannot be passed as trainLoopPerWorker. */
export const makeLoop = (): ((config: unknown, ctx: TrainContext) => Promise<void>) => async () => {}
