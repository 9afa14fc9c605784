// The per-worker loop of the files example: each worker streams only its own rows of the training
// files (read in the background while it computes, shuffled within a bounded buffer, in a new
// seeded order every epoch), scales them with a map transform, and checkpoints every epoch; the
// checkpoint keeps the data position, so a restart goes on where the data was.
import { scale, type FileStream, type TrainContext } from "../../index.ts"
import { buildModel, weightsHashAsync } from "../digits/model.ts"

export interface FilesConfig {
  readonly epochs?: number
  readonly batchSize?: number
}

export async function trainLoop(config: FilesConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  // Pixel counts 0..16 in the files: scaled to 0..1 as each batch is built.
  const train = (await ctx.getDatasetShard<FileStream>("train")).map(scale(1 / 16))
  // The held-out file is small: read whole.
  const test = await ctx.getDataset("test")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
  }
  if (ctx.worldRank === 0) console.log(`rank 0/${ctx.worldSize}: ${train.size} rows per epoch from ${train.dataset.files.length} files (${train.dataset.format})`)
  const xTest = tf.tensor2d(test.x, [test.size, 64]).div(16)
  const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), 10)
  for (let epoch = start; epoch < (config.epochs ?? 10); epoch++) {
    const [r] = await dp.fit(train, { epochs: epoch + 1, initialEpoch: epoch, batchSize: config.batchSize ?? 32 })
    const val = await dp.evaluateAsync(xTest, yTest)
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report(
      {
        epoch,
        loss: r!.loss,
        accuracy: r!.accuracy ?? 0,
        val_accuracy: val.accuracy ?? 0,
        // How long this rank waited for rows, of the time it spent getting them (prefetch hides the rest).
        data_wait_ms: train.stats.waitMs,
        data_mib: train.stats.bytesRead / 2 ** 20,
        weights: await weightsHashAsync(model.getWeights())
      },
      ckpt ? { checkpoint: ckpt } : {}
    )
  }
  tf.dispose([xTest, yTest])
}
