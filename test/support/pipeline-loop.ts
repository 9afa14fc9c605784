// Training loops for the model-parallel integration test (real workers over NATS).
//
// equivalenceLoop: for each case, every rank prepares the same seeded MLP as a pipeline / tensor
// grid, trains a few steps on batches it derives from the case's seed, trains the same model whole
// on the whole global batch itself (the single-worker reference), and reports how far its stage's
// weights (slices included) are from the reference's, and both losses.
//
// fitLoop: the digits MLP as a pipeline trained with pp.fit(), evaluated, checkpointed by every
// rank each epoch, resumed from the checkpoint after a restart; `kill` makes a rank die mid-epoch.
import type { TrainContext, PipelineOptions, PipelineModel } from "../../index.ts"
import { writeFileSync } from "node:fs"
import * as path from "node:path"
import { weightsHash } from "../../examples/digits/model.ts"
import { PositionFile } from "./positions.ts"

type Tf = TrainContext["tf"]
type Tensor = import("@tensorflow/tfjs").Tensor
type LayersModel = import("@tensorflow/tfjs").LayersModel

export interface EquivalenceCase {
  readonly name: string
  readonly options: PipelineOptions
  /** Rows per replica per batch. */
  readonly rows: number
  readonly steps: number
}

export const IN = 6
export const CLASSES = 5

/** The same seeded MLP every time it is built: 5 dense layers, widths even (tensor-parallel pairs). Also the model-parallel unit tests'. */
export const seededMlp = (tf: Tf, optimizer: "sgd" | "adam" = "sgd", widths: ReadonlyArray<number> = [8, 12, 8, 6]): LayersModel => {
  const layers = widths.map((units, i) =>
    tf.layers.dense({
      units,
      activation: i % 2 === 0 ? "relu" : "tanh",
      name: `d${i}`,
      kernelInitializer: tf.initializers.glorotUniform({ seed: 11 + i }),
      biasInitializer: tf.initializers.randomNormal({ seed: 31 + i, stddev: 0.1 }),
      ...(i === 0 ? { inputShape: [IN] } : {})
    })
  )
  layers.push(tf.layers.dense({ units: CLASSES, activation: "softmax", name: "out", kernelInitializer: tf.initializers.glorotUniform({ seed: 7 }) }))
  const m = tf.sequential({ layers })
  m.compile({ optimizer: optimizer === "sgd" ? tf.train.sgd(0.3) : tf.train.adam(0.02), loss: "categoricalCrossentropy" })
  return m
}

/** A seeded batch of `rows` normal inputs and one-hot labels. */
export const batchOf = (tf: Tf, rows: number, seed: number): { x: Tensor; y: Tensor } => {
  const x = tf.randomNormal([rows, IN], 0, 1, "float32", seed)
  const ids = tf.randomUniform([rows], 0, CLASSES, "int32", seed + 1)
  const y = tf.oneHot(ids, CLASSES)
  ids.dispose()
  return { x, y }
}

/** The largest difference between this rank's part and the whole model's weights (read asynchronously: webgpu has no synchronous read in Node). */
const distance = async (tf: Tf, pp: PipelineModel, ref: LayersModel): Promise<number> => {
  const named = new Map(ref.weights.map((w) => [w.originalName, w.read()]))
  let worst = 0
  for (const [i, v] of pp.variables.entries()) {
    const part = pp.stage.parts[i]
    const whole = named.get(part.name)!
    const d = tf.tidy(() => {
      let r = whole
      if (part.slice) {
        const c = (whole.shape[part.slice.axis] as number) / part.slice.parts
        r = tf.slice(whole, whole.shape.map((_, k) => (k === part.slice!.axis ? part.slice!.index * c : 0)), whole.shape.map((n, k) => (k === part.slice!.axis ? c : (n as number))))
      }
      return tf.max(tf.abs(tf.sub(v, r)))
    })
    worst = Math.max(worst, (await d.data())[0]!)
    d.dispose()
  }
  return worst
}

export async function equivalenceLoop(config: { cases: EquivalenceCase[] }, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const metrics: Record<string, unknown> = { rank: ctx.worldRank }
  for (const [k, c] of config.cases.entries()) {
    const pp = await ctx.preparePipeline(seededMlp(tf), c.options)
    const replicas = pp.place.replicas
    const data = Array.from({ length: replicas }, (_, d) => Array.from({ length: c.steps }, (_, s) => batchOf(tf, c.rows, 17 + 1000 * k + 100 * d + 2 * s)))
    let loss = 0
    for (let s = 0; s < c.steps; s++) {
      const mine = data[pp.place.replica][s]
      loss = (await pp.trainStep(pp.isFirstStage ? mine.x : null, pp.isLastStage ? mine.y : null, { batchSize: c.rows })).loss
    }
    // (tfjs takes a seed of 0 for no seed: every seed here is > 0)
    // the single worker: the whole model on every replica's batch at once
    const ref = seededMlp(tf)
    const opt = (ref as unknown as { optimizer: import("@tensorflow/tfjs").Optimizer }).optimizer
    let refLoss = 0
    for (let s = 0; s < c.steps; s++) {
      const x = tf.concat(data.map((d) => d[s].x))
      const y = tf.concat(data.map((d) => d[s].y))
      const { value, grads } = opt.computeGradients(() => tf.metrics.categoricalCrossentropy(y, ref.apply(x, { training: true }) as Tensor).mean() as never)
      opt.applyGradients(grads)
      // the global batch's loss (with one replica, the batch's; with several, the mean of theirs)
      if (s === c.steps - 1) refLoss = (await value.data())[0]!
      tf.dispose([value, x, y, ...Object.values(grads)])
    }
    metrics[`${c.name}/diff`] = await distance(tf, pp, ref)
    metrics[`${c.name}/loss`] = loss
    metrics[`${c.name}/ref_loss`] = refLoss
    metrics[`${c.name}/stage`] = pp.place.stage
    metrics[`${c.name}/bounds`] = pp.layout.bounds.join(",")
    metrics[`${c.name}/in_flight`] = pp.memoryStats().peakInFlight
    metrics[`${c.name}/params`] = pp.parameterCount
    await pp.close()
  }
  await ctx.report(metrics)
}

export interface FitLoopConfig {
  readonly epochs: number
  readonly stages: number
  /** Ranks each stage's dense pair (h1, h2) is split over (default 1). */
  readonly tensorParallel?: number
  /** Every rank writes its pid to <pidDir>/<attempt>-<rank>.pid as it starts (a test kills its own workers by pid). */
  readonly pidDir?: string
  /** With pidDir: every rank records where it got after each step it trained (positions.ts), for the chaos benchmark. */
  readonly positions?: boolean
  readonly schedule?: "gpipe" | "1f1b"
  readonly microBatches?: number
  /** Rank `rank` dies (kill -9) at step `step` of epoch `epoch`, in the first attempt only. */
  readonly kill?: { readonly rank: number; readonly epoch: number; readonly step: number }
  /** Rank `rank` stops taking part (alive, its event loop free) after step `step` of epoch 0. */
  readonly hang?: { readonly rank: number; readonly step: number }
}

export async function fitLoop(config: FitLoopConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  if (config.pidDir) writeFileSync(path.join(config.pidDir, `${ctx.attempt}-${ctx.worldRank}.pid`), String(process.pid))
  const positions = config.pidDir && config.positions ? new PositionFile(config.pidDir) : undefined
  const train = await ctx.getDatasetShard("train")
  const test = await ctx.getDataset("test")
  const model = tf.sequential({
    layers: [
      tf.layers.dense({ units: 32, activation: "relu", inputShape: [64], name: "h1", kernelInitializer: tf.initializers.glorotUniform({ seed: 1 }) }),
      tf.layers.dense({ units: 32, activation: "relu", name: "h2", kernelInitializer: tf.initializers.glorotUniform({ seed: 2 }) }),
      tf.layers.dense({ units: 10, activation: "softmax", name: "head", kernelInitializer: tf.initializers.glorotUniform({ seed: 3 }) })
    ]
  })
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const pp = await ctx.preparePipeline(model, {
    stages: config.stages,
    ...(config.tensorParallel ? { tensorParallel: config.tensorParallel } : {}),
    schedule: config.schedule ?? "1f1b",
    microBatches: config.microBatches ?? 4,
    balance: "memory"
  })
  let start = 0
  const resume = await ctx.getCheckpoint()
  if (resume) {
    await ctx.restoreModel(pp, resume)
    start = Number(resume.metadata?.epoch) + 1
  }
  // the stage shards this rank fetched with the checkpoint it resumed from (its own only), and
  // what loading that checkpoint into the whole model says (it lacks the other stages)
  const resumedShards = resume ? Object.keys(resume.files).filter((f) => f.startsWith("pipeline/stage-")).sort().join(",") : ""
  const wholeRestore = resume ? await ctx.restoreModel(model, resume).then(() => "loaded", (e: unknown) => (e instanceof Error ? e.message : String(e))) : ""
  const xTest = pp.isFirstStage ? tf.tensor2d(test.x, [test.size, 64]) : null
  const yTest = pp.isLastStage ? tf.oneHot(tf.tensor1d(test.y as Int32Array, "int32"), 10) : null
  const kill = config.kill
  for (let epoch = start; epoch < config.epochs; epoch++) {
    const [r] = await pp.fit(train, {
      epochs: epoch + 1,
      initialEpoch: epoch,
      batchSize: 32,
      onStep: async ({ index, samples, steps }) => {
        if (positions && samples > 0) positions.step(ctx.attempt, ctx.worldRank, epoch, index, steps)
        if (kill && ctx.attempt === 0 && kill.rank === ctx.worldRank && kill.epoch === epoch && kill.step === index) process.kill(process.pid, "SIGKILL")
        if (config.hang?.rank === ctx.worldRank && epoch === 0 && config.hang.step === index) await new Promise((r) => setTimeout(r, 60_000))
      }
    })
    const val = await pp.evaluate(xTest, yTest, { rows: test.size })
    const checkpoint = await ctx.checkpointFromModel(pp, { metadata: { epoch } })
    // (a fingerprint of this rank's stage and its optimizer steps: a stage's replicas hold the same)
    const stageState = { weights: weightsHash(pp.variables), steps: pp.steps, tp_rank: pp.place.tpRank }
    await ctx.report({ epoch, loss: r.loss, accuracy: r.accuracy ?? 0, val_loss: val.loss, val_accuracy: val.accuracy ?? 0, stage: pp.place.stage, attempt: ctx.attempt, resumed_shards: resumedShards, whole_restore: wholeRestore, ...stageState }, { checkpoint })
  }
  xTest?.dispose()
  yTest?.dispose()
  positions?.close()
  await pp.close()
}
