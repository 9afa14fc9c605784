// A training loop with a resume bug: it restores the checkpoint's weights but then starts again at
// epoch 0 instead of after the checkpoint's epoch. A rank that joins survivors by replaying this
// loop from the checkpoint cannot line up with them (test/peer-recovery.test.ts): recovery from
// peers must notice and fall back to the checkpoint. Kill hook as in the digits example; with
// `holdFile` a short group's steps are slowed (hold.ts) until the replacement has tried to join.
import type { TrainContext } from "../../index.ts"
import { buildModel, weightsHash } from "../../examples/digits/model.ts"
import { holdStep } from "./hold.ts"

export async function misalignedLoop(config: { epochs: number; kill: { rank: number; epoch: number; step: number }; holdFile?: string }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) await ctx.restoreModel(dp, checkpoint)
  const dies = ctx.worldRank === config.kill.rank && ctx.attempt === 0
  for (let epoch = 0; epoch < config.epochs; epoch++) {
    const killAt = dies && epoch === config.kill.epoch ? config.kill.step : undefined
    const [r] = await dp.fit(train, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      batchSize: 32,
      onStep: async ({ index }) => {
        if (index === killAt) process.kill(process.pid, "SIGKILL")
        await holdStep(config.holdFile, ctx.worldSize)
      }
    })
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report({ epoch, loss: r.loss, weights: weightsHash(model.getWeights()) }, ckpt ? { checkpoint: ckpt } : {})
  }
}
