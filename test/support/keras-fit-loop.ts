// A loop written as tfjs code already is: the whole dataset as tensors, then model.fit(x, y, {
// epochs, batchSize, validationSplit, callbacks }) on the prepared model (keras-fit.ts). With
// `differ`, rank 1 leaves out the last row (other data than rank 0's). With `kill`, that rank of the
// first attempt dies (kill -9) at the end of that epoch; `epochMs` makes every epoch last at least so
// long, and `holdFile` slows each step of a group smaller than the size it holds (hold.ts): a
// replacement then joins before the run ends, however long it takes to start on a loaded machine.
// With `unprepared`, the model is never prepared (a user's mistake the run must say).
import type { TrainContext } from "../../index.ts"
import { weightsHashAsync } from "../../examples/digits/model.ts"
import { holdStep } from "./hold.ts"

export async function kerasFitLoop(
  config: { epochs: number; differ?: boolean; kill?: { readonly rank: number; readonly epoch: number }; epochMs?: number; holdFile?: string; unprepared?: boolean },
  ctx: TrainContext
): Promise<void> {
  const tf = ctx.tf
  const data = await ctx.getDataset("train")
  const model = tf.sequential({
    layers: [tf.layers.dense({ units: 32, inputShape: [64], activation: "relu" }), tf.layers.dense({ units: 10, activation: "softmax" })]
  })
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy", metrics: ["accuracy"] })
  // (`unprepared`: the mistake of never preparing it, so each rank trains alone)
  if (!config.unprepared) await ctx.prepareModel(model)
  const n = config.differ && ctx.worldRank === 1 ? data.size - 1 : data.size
  const x = tf.tensor2d(data.x.subarray(0, n * 64), [n, 64])
  const y = tf.oneHot(tf.tensor1d(data.y.subarray(0, n), "int32"), 10)
  const epochsSeen: number[] = []
  let began = 0
  const h = await model.fit(x, y, {
    epochs: config.epochs,
    batchSize: 64,
    validationSplit: 0.2,
    callbacks: {
      onEpochBegin: async () => void (began = performance.now()),
      onBatchEnd: async () => holdStep(config.holdFile, ctx.worldSize),
      onEpochEnd: async (epoch) => {
        epochsSeen.push(epoch)
        if (config.kill && ctx.attempt === 0 && ctx.worldRank === config.kill.rank && epoch === config.kill.epoch) process.kill(process.pid, "SIGKILL")
        const left = (config.epochMs ?? 0) - (performance.now() - began)
        if (left > 0) await new Promise((r) => setTimeout(r, left))
      }
    }
  })
  await ctx.report({
    loss: h.history.loss.at(-1)!,
    firstLoss: h.history.loss[0]!,
    acc: h.history.acc!.at(-1)!,
    valAcc: h.history.val_acc!.at(-1)!,
    epochsSeen: epochsSeen.join(","),
    weights: await weightsHashAsync(model.getWeights())
  })
}
