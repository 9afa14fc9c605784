// The zoo's per-worker training loop, hand-written around dp.trainStep (the batches are this
// loop's own: each rank takes its shard's rows of the epoch, 32 per step by default). Every epoch
// it reports the training loss, the held-out accuracy (per word for the tagging task) and this
// rank's samples/s. With `bench` it instead times a fixed number of steps after a warm-up and
// reports samples/s only (bench/train.ts).
import { crossEntropy, type ArrayDataset, type TrainContext, type Tf } from "../../index.ts"
import { weightsHashAsync } from "../digits/model.ts"
import { buildZooModel, readsTokens, type TextShape, type ZooModel } from "./models.ts"

export interface ZooConfig {
  readonly model: ZooModel
  readonly epochs?: number
  /** Per rank (as PyTorch DDP's batch size). Default 32. */
  readonly batchSize?: number
  readonly learningRate?: number
  /** The tagging task's sizes (the text models). */
  readonly text?: TextShape
  readonly bench?: { readonly steps: number; readonly warmup: number }
  /** Stop each epoch after this many steps (a quick run, as the tests take). */
  readonly maxStepsPerEpoch?: number
  /**
   * Seeds the model's initial weights (rank 0's, which every rank starts from), so that two runs
   * with the same seed start alike: with the seeded shards and a fixed reduction order, a run is
   * then repeatable, and two settings can be compared start for start. Unset: a new start each run.
   */
  readonly seed?: number
}

/** Adam's learning rate where the default 0.003 is not the one that trains the model well. */
const DEFAULT_LR: Partial<Record<ZooModel, number>> = { embedding: 0.01 }

type Tensor = import("@tensorflow/tfjs").Tensor
type Scalar = import("@tensorflow/tfjs").Scalar

/**
 * `build()` with tfjs's unseeded initializers drawing from `seed`: each takes the seed of its own
 * generator from Math.random, which is swapped, while the model's weights are made, for a
 * sequence that `seed` fixes (a linear congruential one: it only seeds tfjs's generators).
 */
export const withSeed = <A>(seed: number | undefined, build: () => A): A => {
  if (seed === undefined) return build()
  const random = Math.random
  let state = seed >>> 0
  Math.random = () => {
    state = (Math.imul(state, 1664525) + 1013904223) >>> 0
    return state / 4294967296
  }
  try {
    return build()
  } finally {
    Math.random = random
  }
}

/** Softmax cross-entropy on the logits and class ids (per word for the tagging task), as torch's CrossEntropyLoss: gradwire's crossEntropy, one kernel each way. */
export const zooLoss =
  (tf: Tf, classes: number) =>
  (y: Tensor, logits: Tensor): Scalar =>
    crossEntropy(tf, logits.reshape([-1, classes]), y)

/**
 * `batchOf(rows, from)`: the batch of `dataset`'s rows `rows[from .. from + batch)` as tensors (token
 * ids as int32 when `tokens`), built in two reused buffers.
 */
export const zooBatcher = (tf: Tf, dataset: ArrayDataset, batch: number, tokens: boolean) => {
  const width = dataset.featureShape.reduce((a, b) => a * b, 1)
  const perLabel = (dataset.labelShape ?? []).reduce((a, b) => a * b, 1)
  const xBuf = new Float32Array(batch * width)
  const yBuf = new Int32Array(batch * perLabel)
  return (rows: ArrayLike<number>, from: number): [Tensor, Tensor] => {
    for (let i = 0; i < batch; i++) {
      const r = rows[from + i]!
      xBuf.set(dataset.x.subarray(r * width, (r + 1) * width), i * width)
      for (let k = 0; k < perLabel; k++) yBuf[i * perLabel + k] = dataset.y[r * perLabel + k]!
    }
    const x = tokens ? tf.tensor(Int32Array.from(xBuf), [batch, ...dataset.featureShape], "int32") : tf.tensor(xBuf, [batch, ...dataset.featureShape])
    return [x, tf.tensor(yBuf, perLabel > 1 ? [batch, perLabel] : [batch], "int32")]
  }
}

export async function zooLoop(config: ZooConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const batch = config.batchSize ?? 32
  const text = readsTokens(config.model)
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const classes = config.text?.tags ?? 10
  const model = withSeed(config.seed, () => buildZooModel(tf, config.model, config.text))
  const dp = await ctx.prepareModel(model, { optimizer: tf.train.adam(config.learningRate ?? DEFAULT_LR[config.model] ?? 0.003), loss: zooLoss(tf, classes) })
  if (ctx.worldRank === 0) console.log(`${config.model}: ${dp.parameterCount} parameters, backend ${ctx.backend}, ${ctx.worldSize} worker(s), batch ${batch} per worker`)

  const perLabel = (train.dataset.labelShape ?? []).reduce((a, b) => a * b, 1)
  const batchOf = zooBatcher(tf, train.dataset, batch, text)

  if (config.bench) {
    const { steps, warmup } = config.bench
    let rows = train.rows(0)
    let at = 0
    let epoch = 0
    const step = async () => {
      if (at + batch > rows.length) {
        rows = train.rows(++epoch)
        at = 0
      }
      const [x, y] = batchOf(rows, at)
      at += batch
      await dp.trainStep(x, y)
      tf.dispose([x, y])
    }
    for (let s = 0; s < warmup; s++) await step()
    const times: number[] = []
    const t0 = performance.now()
    for (let s = 0; s < steps; s++) {
      const a = performance.now()
      await step()
      times.push(performance.now() - a)
    }
    const seconds = (performance.now() - t0) / 1000
    times.sort((a, b) => a - b)
    await ctx.report({ samplesPerSec: (steps * batch) / seconds, stepMs: (seconds * 1000) / steps, stepP50Ms: times[Math.floor(times.length / 2)]!, stepP99Ms: times[Math.floor(times.length * 0.99)]! })
    return
  }

  const EVAL_BATCH = 64
  const xTest = text ? tf.tensor(Int32Array.from(test.x), [test.size, ...test.featureShape], "int32") : tf.tensor(test.x, [test.size, ...test.featureShape])
  const yTest = Int32Array.from(test.y)
  // Held-out batches of 64, with a turn of the event loop between them: on the wasm backend
  // `await pred.data()` resolves at once, so without one the whole evaluation is a single
  // synchronous stretch (18 s for resnet18 on a loaded 2-core machine), in which nothing else in the
  // worker runs: NATS pings, the answers to its peers' probes. Its heartbeats come from a thread of
  // their own and go on regardless (docs/failure-model.md).
  const heldOut = async (): Promise<number> => {
    let correct = 0
    for (let from = 0; from < test.size; from += EVAL_BATCH) {
      const n = Math.min(EVAL_BATCH, test.size - from)
      const pred = tf.tidy(() => (model.apply(xTest.slice(from, n), { training: false }) as Tensor).argMax(-1))
      const p = (await pred.data()) as Int32Array
      pred.dispose()
      for (let i = 0; i < p.length; i++) if (p[i] === yTest[from * perLabel + i]) correct++
      await new Promise((resolve) => setImmediate(resolve))
    }
    return correct / yTest.length
  }
  for (let epoch = 0; epoch < (config.epochs ?? 5); epoch++) {
    const rows = train.rows(epoch)
    let lossSum = 0
    let steps = 0
    const t0 = performance.now()
    const limit = config.maxStepsPerEpoch ?? Infinity
    for (let from = 0; from + batch <= rows.length && steps < limit; from += batch) {
      const [x, y] = batchOf(rows, from)
      lossSum += (await dp.trainStep(x, y)).loss
      steps++
      tf.dispose([x, y])
    }
    const seconds = (performance.now() - t0) / 1000
    await ctx.report({
      epoch,
      loss: lossSum / Math.max(1, steps),
      val_accuracy: await heldOut(),
      samples_per_s: (steps * batch) / seconds,
      // Every rank's trainable weights after the epoch: the same on every rank. (Batch norm's moving
      // statistics are not all-reduced: each rank keeps those of its own batches.)
      weights: await weightsHashAsync(model.trainableWeights.map((w) => w.read()))
    })
  }
  xTest.dispose()
}
