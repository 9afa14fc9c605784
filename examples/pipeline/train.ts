// The per-worker loop of the pipeline example: the digits MLP cut into pipeline stages (and, with
// tensorParallel > 1, its dense pairs split over tensor ranks), trained with pp.fit(), evaluated,
// and checkpointed by every rank after every epoch (each stage adds its shard; rank 0 the layout).
// Resumes from the latest checkpoint after a restart.
import type { TrainContext } from "../../index.ts"

export interface PipelineExampleConfig {
  readonly epochs?: number
  readonly stages?: number
  readonly tensorParallel?: number
  readonly microBatches?: number
  readonly schedule?: "gpipe" | "1f1b"
  readonly batchSize?: number
}

export async function trainLoop(config: PipelineExampleConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  // Every rank builds the same model (seeded initializers); each keeps only its stage's layers.
  const seeded = (seed: number) => ({ kernelInitializer: tf.initializers.glorotUniform({ seed }) })
  const model = tf.sequential({
    layers: [
      tf.layers.dense({ units: 128, activation: "relu", inputShape: [64], name: "hidden1", ...seeded(1) }),
      tf.layers.dense({ units: 128, activation: "relu", name: "hidden2", ...seeded(2) }),
      tf.layers.dense({ units: 64, activation: "relu", name: "hidden3", ...seeded(3) }),
      tf.layers.dense({ units: 10, activation: "softmax", name: "classes", ...seeded(4) })
    ]
  })
  model.compile({ optimizer: tf.train.adam(0.005), loss: "categoricalCrossentropy" })
  const pp = await ctx.preparePipeline(model, {
    stages: config.stages ?? 2,
    tensorParallel: config.tensorParallel ?? 1,
    microBatches: config.microBatches ?? 4,
    schedule: config.schedule ?? "1f1b"
  })
  const where = `stage ${pp.place.stage + 1}/${pp.place.stages}, replica ${pp.place.replica + 1}/${pp.place.replicas}, tensor rank ${pp.place.tpRank + 1}/${pp.place.tp}`
  console.log(`rank ${ctx.worldRank}: ${where}: ${pp.parameterCount} parameters (cut at units ${pp.layout.bounds.join(", ")})`)

  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(pp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
  }
  // The first stage needs the features, the last the targets; the others only the row count.
  const xTest = pp.isFirstStage ? tf.tensor2d(test.x, [test.size, 64]) : null
  const yTest = pp.isLastStage ? tf.oneHot(tf.tensor1d(test.y as Int32Array, "int32"), 10) : null
  for (let epoch = start; epoch < (config.epochs ?? 10); epoch++) {
    const [r] = await pp.fit(train, { epochs: epoch + 1, initialEpoch: epoch, batchSize: config.batchSize ?? 64 })
    const val = await pp.evaluate(xTest, yTest, { rows: test.size })
    const t = pp.lastStepTiming
    const metrics = { epoch, loss: r.loss, accuracy: r.accuracy ?? 0, val_loss: val.loss, val_accuracy: val.accuracy ?? 0, bubble: t.bubble }
    // every rank: a pipeline's checkpoint is the stages' shards together
    await ctx.report(metrics, { checkpoint: await ctx.checkpointFromModel(pp, { metadata: { epoch } }) })
  }
  xTest?.dispose()
  yTest?.dispose()
  await pp.close()
}
