// A training loop for heterogeneity tests and the `hetero` benchmark: the digits MLP trained with
// fit({ globalBatchSize }), some ranks slowed by a simulated per-sample delay (a slower device),
// reporting per epoch the loss, a fingerprint of the weights and the steps/s after warm-up.
import type { TrainContext } from "../../index.ts"
import { gatherRows } from "../../core/datasets.ts"
import { buildModel, weightsHash } from "../../examples/digits/model.ts"

export interface HeteroLoopConfig {
  readonly epochs?: number
  readonly globalBatchSize?: number
  /** Extra ms per sample by rank, e.g. { "1": 0.5 }. */
  readonly slowdown?: Readonly<Record<string, number>>
  /** Steps ignored when measuring steps/s (warm-up and first re-balances). Default 6. */
  readonly skipSteps?: number
  /** Rank 0 checkpoints after every epoch, and a run resumes from the latest checkpoint. Default false. */
  readonly checkpoint?: boolean
  /** "adam" instead of SGD 0.1. */
  readonly optimizer?: "sgd" | "adam"
  /**
   * Instead of dp.fit(): every rank steps through its own shard until the group has trained the
   * epoch's steps (dp.globalStep), so fast ranks may take over a slow one's share where the
   * strategy lets them run ahead (backup workers, async, SSP), as a parameter-server loop does.
   */
  readonly free?: boolean
}

export async function heteroLoop(config: HeteroLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: config.optimizer === "adam" ? tf.train.adam(0.01) : tf.train.sgd(0.1), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model, { simulatedDelayMsPerSample: config.slowdown?.[String(ctx.worldRank)] ?? 0 })
  const skip = config.skipSteps ?? 6
  const stamps: number[] = []
  let start = 0
  const resume = config.checkpoint ? await ctx.getCheckpoint() : undefined
  if (resume) {
    await ctx.restoreModel(dp, resume)
    start = Number(resume.metadata?.epoch) + 1
  }
  const batch = Math.ceil((config.globalBatchSize ?? 128) / ctx.worldSize)
  const steps = Math.ceil(train.size / batch)
  let pass = 0
  let pos = 0
  const freeEpoch = async (epoch: number): Promise<{ loss: number }> => {
    let sum = 0
    let n = 0
    while (dp.globalStep < (epoch + 1) * steps) {
      let rows = train.rows(pass)
      if (pos + batch > rows.length) [pass, pos, rows] = [pass + 1, 0, train.rows(pass + 1)]
      const b = gatherRows(train.dataset, rows.subarray(pos, pos + batch))
      pos += batch
      const loss = tf.tidy(() => {
        const x = tf.tensor(b.x, [batch, ...train.dataset.featureShape])
        return { x, y: dp.lossTargets(tf.tensor1d(b.y, "int32"), train.dataset.numClasses) }
      })
      try {
        sum += (await dp.trainStep(loss.x, loss.y)).loss
        n++
      } finally {
        tf.dispose([loss.x, loss.y])
      }
      stamps.push(performance.now())
    }
    return { loss: n > 0 ? sum / n : Number.NaN }
  }
  for (let epoch = start; epoch < (config.epochs ?? 2); epoch++) {
    const [r] = config.free ? [await freeEpoch(epoch)] : await dp.fit(train, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      globalBatchSize: config.globalBatchSize ?? 128,
      onStep: () => void stamps.push(performance.now())
    })
    const timed = stamps.slice(skip)
    const stepsPerS = timed.length >= 2 ? ((timed.length - 1) * 1000) / (timed.at(-1)! - timed[0]!) : 0
    const metrics = { epoch, loss: r.loss, steps: stamps.length, steps_per_s: stepsPerS, weights: weightsHash(model.getWeights()) }
    const checkpoint = config.checkpoint && ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report(metrics, checkpoint ? { checkpoint } : {})
  }
}
