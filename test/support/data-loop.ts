// A train loop over a streamed file dataset for the Trainer's data tests: a linear regression
// (float labels) on rows whose first feature is the row's id / rows, so the loop can log which
// rows every step trained (a map transform sees every batch). It checkpoints every few steps in the
// middle of epochs (every rank reports; rank 0 adds the checkpoint), resumes from the latest
// checkpoint where its data position says, and can kill itself or throw at a chosen step. A hold
// file slows a short group's steps, so a replacement joins before the epochs run out.
import * as fs from "node:fs"
import * as path from "node:path"
import type { FileStream, IterableStream, TrainContext } from "../../index.ts"
import { holdStep } from "./hold.ts"

export interface DataLoopConfig {
  readonly epochs: number
  readonly batchSize: number
  /** Rows of the dataset (ids are round(x0 * rows)). */
  readonly rows: number
  /** Where each (attempt, rank) writes the ids of every step, one JSON line per step. */
  readonly logDir: string
  /** A checkpoint (and report) every this many steps; and one at every epoch's end. */
  readonly checkpointEvery: number
  /** kill -9 (or throw) on this rank at this step of this epoch, in attempt 0. */
  readonly fail?: { readonly how: "kill" | "throw"; readonly rank: number; readonly epoch: number; readonly step: number }
  /** After the epochs: one epoch over the dataset "aux" (a worker-side factory's tf.data rows), reported. */
  readonly aux?: boolean
  /** A short group's steps are slowed while this file names a larger size (hold.ts). */
  readonly holdFile?: string
}

export async function dataLoop(config: DataLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const shard = await ctx.getDatasetShard<FileStream>("train")
  let ids: number[] = []
  shard.map((b) => {
    for (let k = 0; k < b.n; k++) ids.push(Math.round(b.x[k * 3]! * config.rows))
    return b
  })
  const model = tf.sequential({ layers: [tf.layers.dense({ units: 1, inputShape: [3], kernelInitializer: "zeros" })] })
  model.compile({ optimizer: tf.train.sgd(0.05), loss: "meanSquaredError" })
  const dp = await ctx.prepareModel(model)
  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch) + (checkpoint.metadata?.end === true ? 1 : 0)
  }
  const log = path.join(config.logDir, `a${ctx.attempt}-r${ctx.worldRank}-p${ctx.worldSize}.jsonl`)
  const fail = config.fail
  const weights = () => Array.from(model.getWeights().flatMap((w) => Array.from(w.dataSync()))).map((v) => v.toFixed(6)).join(",")
  for (let epoch = start; epoch < config.epochs; epoch++) {
    const [r] = await dp.fit(shard, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      batchSize: config.batchSize,
      onStep: async ({ index, loss }) => {
        fs.appendFileSync(log, JSON.stringify({ epoch, index, ids }) + "\n")
        ids = []
        await holdStep(config.holdFile, ctx.worldSize)
        if (fail && ctx.attempt === 0 && ctx.worldRank === fail.rank && epoch === fail.epoch && index === fail.step) {
          if (fail.how === "kill") process.kill(process.pid, "SIGKILL")
          throw new RangeError(`injected failure at epoch ${epoch} step ${index}`)
        }
        if ((index + 1) % config.checkpointEvery === 0) {
          const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch, step: index, end: false } }) : undefined
          await ctx.report({ epoch, step: index, loss }, ckpt ? { checkpoint: ckpt } : {})
        }
      }
    })
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch, end: true } }) : undefined
    await ctx.report({ epoch, loss: r!.loss, weights: weights(), rows: shard.stats.rows }, ckpt ? { checkpoint: ckpt } : {})
  }
  if (config.aux) {
    const aux = await ctx.getDatasetShard<IterableStream>("aux")
    const [r] = await dp.fit(aux, { epochs: 1, batchSize: 5 })
    await ctx.report({ aux_loss: r!.loss, aux_samples: r!.samples, weights: weights() })
  }
}
