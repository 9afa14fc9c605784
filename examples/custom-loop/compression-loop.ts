// A hand-written training loop (batches and steps under the loop's control, not dp.fit) on the
// digits MLP whose gradients travel compressed: the compressor comes from the Trainer's
// collectiveConfig.compression, error feedback keeps what it drops for the next step. After every
// epoch each rank reports its loss, held-out accuracy and ctx.communicationStats(): the bytes it
// put on the wire for gradients against what dense fp32 would have cost.
import type { TrainContext } from "../../index.ts"
import { buildModel } from "../digits/model.ts"

export interface CompressionLoopConfig {
  readonly epochs?: number
  readonly batchSize?: number
}

export async function compressionLoop(config: CompressionLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const epochs = config.epochs ?? 3
  const batchSize = config.batchSize ?? 32
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  const xTest = tf.tensor2d(test.x, [test.size, 64])
  const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), 10)
  const { x: X, y: Y } = train.dataset

  for (let epoch = 0; epoch < epochs; epoch++) {
    const rows = train.rows(epoch)
    let lossSum = 0
    for (let start = 0; start < rows.length; start += batchSize) {
      const batch = Array.from(rows.subarray(start, start + batchSize))
      const xs = new Float32Array(batch.length * 64)
      batch.forEach((r, i) => xs.set(X.subarray(r * 64, r * 64 + 64), i * 64))
      const x = tf.tensor2d(xs, [batch.length, 64])
      const y = tf.oneHot(tf.tensor1d(Int32Array.from(batch, (r) => Y[r]), "int32"), 10)
      const step = await dp.trainStep(x, y)
      lossSum += step.loss * step.samples
      tf.dispose([x, y])
    }
    const val = await dp.evaluateAsync(xTest, yTest)
    const stats = ctx.communicationStats()
    await ctx.report({
      epoch,
      loss: lossSum / rows.length,
      val_accuracy: val.accuracy ?? 0,
      wireBytes: stats.totalWireBytes,
      denseBytes: stats.totalDenseBytes,
      steps: stats.steps
    })
  }
  tf.dispose([xTest, yTest])
}
