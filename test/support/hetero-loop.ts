// A training loop for heterogeneity tests and the `hetero` benchmark: the digits MLP trained with
// fit({ globalBatchSize }), some ranks slowed by a simulated per-sample delay (a slower device),
// reporting per epoch the loss, a fingerprint of the weights and the steps/s after warm-up. For the
// cgroup benchmark, optionally: wider hidden layers, a validation accuracy on the "test" dataset,
// each rank's own forward+backward throughput measured before training (no communication), and
// the seconds spent in training (evaluation excluded).
import type { TrainContext } from "../../index.ts"
import { gatherRows } from "../../core/datasets.ts"
import { buildModel, weightsHash } from "../../examples/digits/model.ts"

export interface HeteroLoopConfig {
  readonly epochs?: number
  readonly globalBatchSize?: number
  /** Extra ms per sample by rank, e.g. { "1": 0.5 }. */
  readonly slowdown?: Readonly<Record<string, number>>
  /** dp.fit's accumulationSteps (micro-batches of globalBatchSize rows per update). Default 1. */
  readonly accumulationSteps?: number
  /** Extra ms per step with rows by rank (a device's fixed cost per step), e.g. { "1": 40 }. */
  readonly stepDelay?: Readonly<Record<string, number>>
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
  /** Hidden layer widths of the MLP (e.g. [256, 256]) instead of the digits example's model. */
  readonly hidden?: ReadonlyArray<number>
  /**
   * Instead of an MLP: a CNN over the 8x8 images with these filters per 3x3 convolution (a 2x2 max
   * pool after the first), then dense 64 and 10: more compute per sample for fewer weights.
   */
  readonly conv?: ReadonlyArray<number>
  /** Learning rate (default 0.1 for SGD, 0.01 for Adam). */
  readonly learningRate?: number
  /** After every epoch, val_loss / val_accuracy on the "test" dataset (outside the train clock). */
  readonly evaluate?: boolean
  /**
   * Before training, time this many local forward+backward passes (gradients computed, never
   * applied, nothing exchanged; for at least one second) on `calibrateBatch` rows: reported as
   * calib_samples_per_s, the rank's own throughput, with the worker's pid; again after the last
   * epoch (calib_after_samples_per_s). Default 0 (none).
   */
  readonly calibrateSteps?: number
  /** Rows per calibration pass. Default globalBatchSize / worldSize. */
  readonly calibrateBatch?: number
  /** In the first group (attempt 0), rank `rank` is killed (SIGKILL) after step `step` of epoch `epoch` (recovery tests). */
  readonly kill?: { readonly rank: number; readonly epoch: number; readonly step: number }
}

/** A CNN 8x8x1 -> conv(f0) -> pool -> conv(f1)... -> dense 64 -> 10, seeded (the same on every rank). */
const buildCnn = (tf: TrainContext["tf"], filters: ReadonlyArray<number>): import("@tensorflow/tfjs").LayersModel => {
  const init = (s: number) => tf.initializers.glorotUniform({ seed: 200 + s })
  const m = tf.sequential()
  m.add(tf.layers.reshape({ targetShape: [8, 8, 1], inputShape: [64] }))
  filters.forEach((f, i) => {
    m.add(tf.layers.conv2d({ filters: f, kernelSize: 3, activation: "relu", padding: "same", kernelInitializer: init(i) }))
    if (i === 0) m.add(tf.layers.maxPooling2d({ poolSize: 2 }))
  })
  m.add(tf.layers.flatten())
  m.add(tf.layers.dense({ units: 64, activation: "relu", kernelInitializer: init(filters.length) }))
  m.add(tf.layers.dense({ units: 10, activation: "softmax", kernelInitializer: init(filters.length + 1) }))
  return m
}

/** A dense MLP 64-hidden...-10 with seeded initial weights (the same on every rank). */
const buildMlp = (tf: TrainContext["tf"], hidden: ReadonlyArray<number>): import("@tensorflow/tfjs").LayersModel => {
  const m = tf.sequential()
  hidden.forEach((units, i) =>
    m.add(tf.layers.dense({ units, activation: "relu", ...(i === 0 ? { inputShape: [64] } : {}), kernelInitializer: tf.initializers.glorotUniform({ seed: 100 + i }) }))
  )
  m.add(tf.layers.dense({ units: 10, activation: "softmax", kernelInitializer: tf.initializers.glorotUniform({ seed: 100 + hidden.length }) }))
  return m
}

export async function heteroLoop(config: HeteroLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const train = await ctx.getDatasetShard("train")
  const model = config.conv ? buildCnn(tf, config.conv) : config.hidden ? buildMlp(tf, config.hidden) : buildModel(tf, "mlp")
  const lr = config.learningRate ?? (config.optimizer === "adam" ? 0.01 : 0.1)
  model.compile({ optimizer: config.optimizer === "adam" ? tf.train.adam(lr) : tf.train.sgd(lr), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model, {
    simulatedDelayMsPerSample: config.slowdown?.[String(ctx.worldRank)] ?? 0,
    simulatedDelayMsPerStep: config.stepDelay?.[String(ctx.worldRank)] ?? 0
  })
  const test = config.evaluate ? await ctx.getDataset("test") : undefined
  const xTest = test ? tf.tensor2d(test.x, [test.size, 64]) : undefined
  const yTest = test ? tf.oneHot(tf.tensor1d(test.y, "int32"), test.numClasses) : undefined
  // Local forward+backward passes, nothing applied or exchanged: this rank's own samples/s.
  const calibrate = async (): Promise<number> => {
    const rows = Math.min(train.dataset.size, config.calibrateBatch ?? Math.ceil((config.globalBatchSize ?? 128) / ctx.worldSize))
    const b = gatherRows(train.dataset, Uint32Array.from({ length: rows }, (_, i) => i))
    const x = tf.tensor(b.x, [rows, ...train.dataset.featureShape])
    const y = tf.oneHot(tf.tensor1d(b.y, "int32"), train.dataset.numClasses)
    const pass = () => {
      const { value, grads } = tf.variableGrads(() => tf.metrics.categoricalCrossentropy(y, model.apply(x) as import("@tensorflow/tfjs").Tensor).mean() as import("@tensorflow/tfjs").Scalar)
      value.dataSync()
      tf.dispose([value, ...Object.values(grads)])
    }
    pass() // warm-up: kernels compiled, buffers allocated
    // At least calibrateSteps passes and one second, so CPU-quota periods and noise average out.
    const t0 = performance.now()
    let n = 0
    // (The event loop's turn between passes: the worker's heartbeats go out on a slow backend.)
    for (; n < config.calibrateSteps! || performance.now() - t0 < 1000; n++) {
      pass()
      await new Promise<void>((resolve) => setImmediate(resolve))
    }
    const perS = (rows * n * 1000) / (performance.now() - t0)
    tf.dispose([x, y])
    return perS
  }
  const calib = (config.calibrateSteps ?? 0) > 0 ? await calibrate() : undefined
  let trainMs = 0
  // The epochs' steps alone: from each epoch's first step's end to its last's, scaled by n / (n - 1)
  // for the first step. trainMs (each dp.fit call whole) also holds the wait in an epoch's first
  // exchange for a slower rank still in its epoch-end work (evaluation, report): how much of it
  // depends on how long this rank's own report took (bench hetero).
  let stepMs = 0
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
  const kill = config.kill !== undefined && ctx.attempt === 0 && ctx.worldRank === config.kill.rank ? config.kill : undefined
  for (let epoch = start; epoch < (config.epochs ?? 2); epoch++) {
    const t0 = performance.now()
    const before = stamps.length
    let stepInEpoch = 0
    const [r] = config.free ? [await freeEpoch(epoch)] : await dp.fit(train, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      globalBatchSize: config.globalBatchSize ?? 128,
      ...(config.accumulationSteps !== undefined ? { accumulationSteps: config.accumulationSteps } : {}),
      onStep: () => {
        stamps.push(performance.now())
        if (kill !== undefined && kill.epoch === epoch && ++stepInEpoch === kill.step) process.kill(process.pid, "SIGKILL")
      }
    })
    const fitMs = performance.now() - t0
    trainMs += fitMs
    const epochSteps = stamps.length - before
    stepMs += epochSteps >= 2 ? ((stamps.at(-1)! - stamps[before]!) * epochSteps) / (epochSteps - 1) : fitMs
    const val = xTest && yTest ? await dp.evaluateAsync(xTest, yTest) : undefined
    const calibAfter = calib !== undefined && epoch === (config.epochs ?? 2) - 1 ? await calibrate() : undefined
    const timed = stamps.slice(skip)
    const stepsPerS = timed.length >= 2 ? ((timed.length - 1) * 1000) / (timed.at(-1)! - timed[0]!) : 0
    const metrics = {
      epoch,
      loss: r.loss,
      steps: stamps.length,
      steps_per_s: stepsPerS,
      weights: weightsHash(model.getWeights()),
      ...(val ? { val_loss: val.loss, val_accuracy: val.accuracy ?? 0 } : {}),
      ...(calib !== undefined ? { calib_samples_per_s: calib, pid: process.pid } : {}),
      ...(calibAfter !== undefined ? { calib_after_samples_per_s: calibAfter } : {}),
      ...(config.hidden || config.conv || config.evaluate ? { train_s: trainMs / 1000, step_s: stepMs / 1000, epoch_steps: epochSteps } : {})
    }
    const checkpoint = config.checkpoint && ctx.worldRank === 0 ? await ctx.checkpointFromModel(dp, { metadata: { epoch } }) : undefined
    await ctx.report(metrics, checkpoint ? { checkpoint } : {})
  }
}
