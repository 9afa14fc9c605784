// The digits MLP trained until a test says stop, for the dashboard tests: every epoch lasts at
// least `minEpochMs` (the rest is slept, which also leaves CPU to the browser on a small machine),
// and after each epoch the ranks all-reduce whether `stopFile` exists, so they stop after the same
// epoch (report() must be called equally often on every rank). `maxEpochs` bounds the run if the
// test never says stop. Rank 0 checkpoints every epoch; a restarted group resumes from it.
import * as fs from "node:fs"
import type { TrainContext } from "../../index.ts"
import { buildModel } from "../../examples/digits/model.ts"

export interface DashboardLoopConfig {
  readonly stopFile: string
  readonly maxEpochs: number
  readonly minEpochMs?: number
  readonly batchSize?: number
}

export async function dashboardLoop(config: DashboardLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  console.log(`rank ${ctx.worldRank}/${ctx.worldSize}: ${train.size} rows, attempt ${ctx.attempt}`)
  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
  }
  for (let epoch = start; epoch < config.maxEpochs; epoch++) {
    const t0 = Date.now()
    const [r] = await dp.fit(train, { epochs: epoch + 1, initialEpoch: epoch, batchSize: config.batchSize ?? 32 })
    const rest = (config.minEpochMs ?? 0) - (Date.now() - t0)
    if (rest > 0) await new Promise((resolve) => setTimeout(resolve, rest))
    console.log(`rank ${ctx.worldRank}: epoch ${epoch} loss ${r.loss.toFixed(4)}`)
    const stop = (await ctx.communicator.allReduce(new Float32Array([fs.existsSync(config.stopFile) ? 1 : 0])))[0] > 0
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report({ epoch, loss: r.loss, accuracy: r.accuracy ?? 0 }, ckpt ? { checkpoint: ckpt } : {})
    if (stop) break
  }
}
