// A train loop over a streamed file dataset for the Trainer's data tests: a linear regression
// (float labels) on rows whose first feature is the row's id / rows, so the loop can log which
// rows every step trained (a map transform sees every batch). It checkpoints every few steps in the
// middle of epochs (every rank reports; rank 0 adds the checkpoint), resumes from the latest
// checkpoint where its data position says, and can kill itself or throw at a chosen step. A hold
// file slows a short group's steps, so a replacement joins before the epochs run out. With
// `handWritten` the same epochs are a hand-written loop: openEpoch(), take() and dp.trainStep().
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
  /** A report without a checkpoint every this many steps, between checkpointEvery's. */
  readonly reportEvery?: number
  /** kill -9 (or throw) on this rank at this step of this epoch, in attempt 0. */
  readonly fail?: { readonly how: "kill" | "throw"; readonly rank: number; readonly epoch: number; readonly step: number }
  /** After the epochs: one epoch over the dataset "aux" (a worker-side factory's tf.data rows), reported. */
  readonly aux?: boolean
  /** A short group's steps are slowed while this file names a larger size (hold.ts). */
  readonly holdFile?: string
  /**
   * A hand-written loop instead of dp.fit(): each epoch opens the stream itself (openEpoch with
   * this rank's place), takes its batches and trains them with dp.trainStep(); reports only at
   * epoch ends (checkpointEvery is not used).
   */
  readonly handWritten?: boolean
  /** The loop trains on this dataset instead of "train" (a worker-side factory's loader). */
  readonly trainOn?: string
  /**
   * After every epoch of dp.fit(), a distributed evaluation on 40 fixed rows, logged as
   * { epoch, eval, fit } (fit: dp.fit()'s loss of the epoch); and the epoch's checkpoint only every this many epochs (its report every epoch).
   */
  readonly evaluateEvery?: number
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
  const dies = (epoch: number, step: number): boolean => fail !== undefined && ctx.attempt === 0 && ctx.worldRank === fail.rank && epoch === fail.epoch && step === fail.step
  const source = config.trainOn !== undefined ? await ctx.getDatasetShard<IterableStream>(config.trainOn) : shard
  // A loader's rows (data-factory.ts#makeRows) carry their id * 0.01 as the first feature.
  if (source !== shard) {
    source.map((b) => {
      for (let k = 0; k < b.n; k++) ids.push(Math.round(b.x[k * 3]! * 100))
      return b
    })
  }
  for (let epoch = start; config.handWritten && epoch < config.epochs; epoch++) {
    const left = source.openEpoch(epoch, ctx.worldRank, ctx.worldSize)
    let lossSum = 0
    let samples = 0
    for (let from = 0, index = 0; from < left; from += config.batchSize, index++) {
      const b = await source.take(from, Math.min(config.batchSize, left - from))
      const x = tf.tensor2d(b.x as Float32Array, [b.n, 3])
      const y = tf.tensor2d(b.y as Float32Array, [b.n, 1])
      const r = await dp.trainStep(x, y)
      tf.dispose([x, y])
      // A step a joining rank replays (the survivors made it already) trains nothing here.
      if (r.samples > 0) {
        fs.appendFileSync(log, JSON.stringify({ epoch, index, ids }) + "\n")
        lossSum += r.loss * r.samples
        samples += r.samples
      }
      ids = []
      await holdStep(config.holdFile, ctx.worldSize)
      if (dies(epoch, index)) process.kill(process.pid, "SIGKILL")
    }
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch, end: true } }) : undefined
    await ctx.report({ epoch, loss: lossSum / Math.max(1, samples), weights: weights(), rows: shard.stats.rows }, ckpt ? { checkpoint: ckpt } : {})
  }
  for (let epoch = start; !config.handWritten && epoch < config.epochs; epoch++) {
    const [r] = await dp.fit(source, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      batchSize: config.batchSize,
      onStep: async ({ index, loss }) => {
        fs.appendFileSync(log, JSON.stringify({ epoch, index, ids }) + "\n")
        ids = []
        await holdStep(config.holdFile, ctx.worldSize)
        if (dies(epoch, index)) {
          if (fail!.how === "kill") process.kill(process.pid, "SIGKILL")
          throw new RangeError(`injected failure at epoch ${epoch} step ${index}`)
        }
        if (config.reportEvery !== undefined && (index + 1) % config.reportEvery === 0 && (index + 1) % config.checkpointEvery !== 0) await ctx.report({ epoch, step: index, loss })
        if ((index + 1) % config.checkpointEvery === 0) {
          const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch, step: index, end: false } }) : undefined
          await ctx.report({ epoch, step: index, loss }, ckpt ? { checkpoint: ckpt } : {})
        }
      }
    })
    if (config.evaluateEvery !== undefined) {
      const ids = Array.from({ length: 40 }, (_, i) => i * 7)
      const x = tf.tensor2d(ids.flatMap((i) => [i / config.rows, Math.sin(i), Math.cos(i)]), [40, 3])
      const y = tf.tensor2d(ids.map((i) => 2 * Math.sin(i) - Math.cos(i)), [40, 1])
      const e = await dp.evaluateAsync(x, y, { distributed: true })
      tf.dispose([x, y])
      fs.appendFileSync(log, JSON.stringify({ epoch, eval: e.loss, fit: r!.loss }) + "\n")
    }
    const saving = config.evaluateEvery === undefined || (epoch + 1) % config.evaluateEvery === 0
    const ckpt = ctx.worldRank === 0 && saving ? await ctx.checkpointFromModel(dp, { metadata: { epoch, end: true } }) : undefined
    await ctx.report({ epoch, loss: r!.loss, weights: weights(), rows: shard.stats.rows }, ckpt ? { checkpoint: ckpt } : {})
  }
  if (config.aux) {
    const aux = await ctx.getDatasetShard<IterableStream>("aux")
    const [r] = await dp.fit(aux, { epochs: 1, batchSize: 5 })
    await ctx.report({ aux_loss: r!.loss, aux_samples: r!.samples, weights: weights() })
  }
}
