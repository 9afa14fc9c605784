// The training loop of `npm run bench -- pipeline` (bench/pipeline.ts), in every worker.
//
// mode "bubble": a model of `stages x layersPerStage` equal dense layers, cut into equal stages;
// for each (schedule, micro-batches) of `configs` in turn a pipeline over the group trains
// `warmup + steps` steps on a synthetic batch, and each rank reports the medians of its measured
// bubble (time waiting for a neighbour over the schedule's time), its compute per forward and per
// backward op, its peak activation bytes and the step time.
//
// mode "large": the model of the memory test (`layers` dense layers of `width`), trained as
// data-parallel ("dp": every rank builds and trains the whole model), or as a stack of layer
// factories cut into `stages` stages and/or `tp` tensor ranks (no rank builds the whole model).
// Each rank reports the peak bytes the tfjs engine held while preparing and while stepping
// (tf.profile's peakBytes), the bytes held after a step, and the median step time.
import type { TrainContext, PipelineModel, DataParallelModel } from "../../index.ts"
import { median } from "../../scheduler/cost-model.ts"

type Tf = TrainContext["tf"]
type Tensor = import("@tensorflow/tfjs").Tensor

export interface PipelineBenchConfig {
  readonly mode: "bubble" | "large"
  readonly steps: number
  readonly warmup: number
  readonly batch: number
  readonly width: number
  // bubble
  readonly stages?: number
  readonly layersPerStage?: number
  readonly configs?: ReadonlyArray<{ readonly schedule: "gpipe" | "1f1b"; readonly micro: number }>
  // large
  readonly variant?: "dp" | "pp" | "tp" | "pp-tp"
  readonly layers?: number
  readonly tp?: number
  readonly micro?: number
}

const CLASSES = 10

const dense = (tf: Tf, units: number, i: number, activation: "relu" | "softmax") =>
  tf.layers.dense({ units, activation, name: `l${i}`, kernelInitializer: tf.initializers.glorotUniform({ seed: 1 + i }) })

const data = (tf: Tf, batch: number, width: number): { x: Tensor; y: Tensor } => {
  const x = tf.randomNormal([batch, width], 0, 1, "float32", 3)
  const ids = tf.randomUniform([batch], 0, CLASSES, "int32", 4)
  const y = tf.oneHot(ids, CLASSES)
  ids.dispose()
  return { x, y }
}

export async function pipelineBenchLoop(config: PipelineBenchConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const { x, y } = data(tf, config.batch, config.width)
  const metrics: Record<string, unknown> = { rank: ctx.worldRank }
  if (config.mode === "bubble") {
    const S = config.stages ?? ctx.worldSize
    const L = S * (config.layersPerStage ?? 2)
    for (const c of config.configs ?? []) {
      const layers = Array.from({ length: L }, (_, i) => (i === L - 1 ? dense(tf, CLASSES, i, "softmax") : dense(tf, config.width, i, "relu")))
      const model = tf.sequential({ layers: [tf.layers.inputLayer({ inputShape: [config.width] }), ...layers] })
      model.compile({ optimizer: tf.train.sgd(0.01), loss: "categoricalCrossentropy" })
      const pp = await ctx.preparePipeline(model, { stages: S, schedule: c.schedule, microBatches: c.micro, balance: "uniform" })
      const bubble: number[] = []
      const fwd: number[] = []
      const bwd: number[] = []
      const stepMs: number[] = []
      for (let s = 0; s < config.warmup + config.steps; s++) {
        const t0 = performance.now()
        await pp.trainStep(pp.isFirstStage ? x : null, pp.isLastStage ? y : null, { batchSize: config.batch })
        if (s < config.warmup) continue
        stepMs.push(performance.now() - t0)
        const t = pp.lastStepTiming
        bubble.push(t.bubble)
        fwd.push(t.forwardMs / c.micro)
        bwd.push(t.backwardMs / c.micro)
      }
      const key = `${c.schedule}/m${c.micro}`
      metrics[`${key}/bubble`] = median(bubble)
      metrics[`${key}/forward_ms`] = median(fwd)
      metrics[`${key}/backward_ms`] = median(bwd)
      metrics[`${key}/step_ms`] = median(stepMs)
      metrics[`${key}/activation_bytes`] = pp.memoryStats().activationPeakBytes
      metrics[`${key}/in_flight`] = pp.memoryStats().peakInFlight
      await pp.close()
    }
    metrics.stage = Math.floor(ctx.worldRank % (config.stages ?? ctx.worldSize))
  } else {
    const variant = config.variant ?? "dp"
    const L = config.layers ?? 8
    const factories = Array.from({ length: L }, (_, i) => (t: Tf) => (i === L - 1 ? dense(t, CLASSES, i, "softmax") : dense(t, config.width, i, "relu")))
    let step: () => Promise<unknown>
    let prepared: PipelineModel | DataParallelModel
    // tf.profile hands back one object per engine, reused: read its peak before the next call (no
    // kernel ran: -Infinity; then what is held after it is the peak)
    const profiledPeak = (
      await tf.profile(async () => {
        if (variant === "dp") {
          const model = tf.sequential({ layers: [tf.layers.inputLayer({ inputShape: [config.width] }), ...factories.map((f) => f(tf))] })
          model.compile({ optimizer: tf.train.adam(1e-3), loss: "categoricalCrossentropy" })
          const dp = await ctx.prepareModel(model)
          prepared = dp
          step = () => dp.trainStep(x, y)
        } else {
          const stages = variant === "tp" ? 1 : (config.stages ?? 2)
          const tp = variant === "pp" ? 1 : (config.tp ?? 2)
          const pp = await ctx.preparePipeline(
            { inputShape: [config.width], layers: factories },
            { stages, tensorParallel: tp, microBatches: config.micro ?? 2 * stages, schedule: "1f1b", balance: "memory", optimizer: tf.train.adam(1e-3), loss: "categoricalCrossentropy" }
          )
          prepared = pp
          step = () => pp.trainStep(pp.isFirstStage ? x : null, pp.isLastStage ? y : null, { batchSize: config.batch })
        }
        return []
      })
    ).peakBytes
    const preparePeak = Number.isFinite(profiledPeak) ? Math.max(profiledPeak, tf.memory().numBytes) : tf.memory().numBytes
    // timed steps unprofiled (profiling reads every kernel's output), then one profiled step for the peak
    const stepMs: number[] = []
    for (let s = 0; s < config.warmup + config.steps; s++) {
      const t0 = performance.now()
      await step!()
      if (s >= config.warmup) stepMs.push(performance.now() - t0)
    }
    const stepPeak = (await tf.profile(() => step() as Promise<never>)).peakBytes
    metrics.prepare_peak_bytes = preparePeak
    metrics.step_peak_bytes = stepPeak
    metrics.held_bytes = tf.memory().numBytes
    metrics.step_ms = median(stepMs)
    metrics.parameters = prepared!.parameterCount
    if (prepared! && "close" in prepared!) await (prepared as PipelineModel).close()
  }
  x.dispose()
  y.dispose()
  await ctx.report(metrics)
}
