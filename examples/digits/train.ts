// The per-worker training loop of the digits example: each worker trains on its shard of the
// training set, gradients are all-reduced every step, and rank 0 checkpoints after every epoch.
// Resumes from the latest checkpoint after a restart. (Test hooks: `fail` makes a chosen rank die
// with kill -9, throw, or report an extra time, to exercise the trainer's fault handling.)
import { writeFileSync } from "node:fs"
import type { TrainContext } from "../../index.ts"
import { buildModel, weightsHashAsync, type ModelKind } from "./model.ts"

export interface DigitsConfig {
  readonly epochs?: number
  readonly batchSize?: number
  readonly learningRate?: number
  /** "adam" (default) or plain minibatch "sgd" (learningRate then needs to be larger, e.g. 0.1). */
  readonly optimizer?: "adam" | "sgd"
  readonly model?: ModelKind
  readonly fail?: {
    readonly how: "kill" | "throw" | "extra-report" | "hang"
    readonly rank: number
    readonly epoch: number
    /** kill only: die at this step of the epoch (mid-epoch) instead of at the epoch's start. */
    readonly step?: number
    /** Only in this attempt (default 0); -1 for every attempt. */
    readonly attempt?: number
    /** Write the time of death (ms since the epoch) here first, for the recovery benchmark. */
    readonly stampFile?: string
  }
}

export async function trainLoop(config: DigitsConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const epochs = config.epochs ?? 10
  const batchSize = config.batchSize ?? 32
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const model = buildModel(tf, config.model ?? "mlp")
  const optimizer = config.optimizer ?? "adam"
  if (optimizer !== "adam" && optimizer !== "sgd") throw new RangeError(`optimizer must be "adam" or "sgd", got ${JSON.stringify(optimizer)}`)
  const lr = config.learningRate ?? (optimizer === "sgd" ? 0.1 : 0.01)
  model.compile({ optimizer: optimizer === "sgd" ? tf.train.sgd(lr) : tf.train.adam(lr), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  // One line per rank at the start: it lands in the run directory's logs/worker_rank=<r>.log.
  console.log(`rank ${ctx.worldRank}/${ctx.worldSize}: backend ${ctx.backend}, ${train.size} training rows, ${dp.parameterCount} parameters`)

  let start = 0
  const checkpoint = await ctx.getCheckpoint()
  if (checkpoint) {
    await ctx.restoreModel(dp, checkpoint)
    start = Number(checkpoint.metadata?.epoch ?? -1) + 1
    if (ctx.worldRank === 0) console.log(`resuming from ${checkpoint.path} at epoch ${start + 1}`)
  }

  const xTest = tf.tensor2d(test.x, [test.size, 64])
  const yTest = tf.oneHot(tf.tensor1d(test.y, "int32"), 10)
  const fail = config.fail
  const failing = fail && fail.rank === ctx.worldRank && (fail.attempt ?? 0) === (fail.attempt === -1 ? -1 : ctx.attempt)
  const die = (): never => {
    if (fail?.stampFile) writeFileSync(fail.stampFile, String(Date.now()))
    return process.kill(process.pid, "SIGKILL") as never
  }
  for (let epoch = start; epoch < epochs; epoch++) {
    if (failing && fail.epoch === epoch && !(fail.how === "kill" && fail.step !== undefined)) {
      if (fail.how === "kill") die()
      if (fail.how === "throw") throw new RangeError(`injected failure on rank ${ctx.worldRank} in epoch ${epoch}`)
      // Alive (heartbeats go on) but out of the collectives: the others time out and name this rank.
      if (fail.how === "hang") await new Promise((resolve) => setTimeout(resolve, 120_000))
    }
    const killAt = failing && fail.how === "kill" && fail.epoch === epoch ? fail.step : undefined
    const [r] = await dp.fit(train, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      batchSize,
      ...(killAt !== undefined ? { onStep: ({ index }) => void (index === killAt && die()) } : {})
    })
    const val = await dp.evaluateAsync(xTest, yTest)
    const metrics = {
      epoch,
      loss: r.loss,
      accuracy: r.accuracy ?? 0,
      val_loss: val.loss,
      val_accuracy: val.accuracy ?? 0,
      weights: await weightsHashAsync(model.getWeights())
    }
    const ckpt = ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report(metrics, ckpt ? { checkpoint: ckpt } : {})
    if (failing && fail.how === "extra-report" && fail.epoch === epoch) await ctx.report(metrics)
  }
  xTest.dispose()
  yTest.dispose()
}
