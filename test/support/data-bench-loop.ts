// The loop of `npm run bench -- data`: the digits MLP trained for a fixed number of steps on the
// dataset "train", in memory or streamed from files, doing per step what dp.fit() does (get the
// batch, make its tensors, dp.trainStep) and timing the first part: the time spent getting rows
// (gathering them in memory, or taking them from the stream, waits for windows included), the
// whole step, this process's peak RSS, and when the first step finished.
import { buildModel } from "../../examples/digits/model.ts"
import type { Shard, TrainContext } from "../../index.ts"
import { isStreamingSource } from "../../core/data/stream.ts"
import { batchTensors, fitBatch } from "../../actors/train/worker/batches.ts"

export interface DataBenchConfig {
  readonly steps: number
  readonly warmup: number
  readonly batch: number
}

export async function dataBenchLoop(config: DataBenchConfig, ctx: TrainContext): Promise<void> {
  const tf = ctx.tf
  const shard = await ctx.getDatasetShard<Shard>("train")
  const model = buildModel(tf, "mlp")
  model.compile({ optimizer: tf.train.adam(0.01), loss: "categoricalCrossentropy" })
  const dp = await ctx.prepareModel(model)
  const bs = config.batch
  const stream = isStreamingSource(shard) ? shard : undefined
  const rows = stream ? undefined : (shard as { rows(e: number): ArrayLike<number> }).rows(0)
  const left = stream ? stream.openEpoch(0, ctx.worldRank, ctx.worldSize) : rows!.length
  const steps = Math.min(config.steps, Math.floor(left / bs))
  let rss = process.memoryUsage().rss
  let firstStepAt = 0
  let dataMs = 0
  let stepMs = 0
  const waitAtWarmup = { v: 0 }
  for (let i = 0; i < steps; i++) {
    const t0 = performance.now()
    const ids = stream ? Array.from({ length: bs }, (_, k) => i * bs + k) : Array.prototype.slice.call(rows, i * bs, (i + 1) * bs)
    const batch = await fitBatch(shard, ids)
    const t1 = performance.now()
    const { x, y, yLoss } = batchTensors(tf, batch, true, (t) => dp.lossTargets(t, 10))
    try {
      await dp.trainStep(x, yLoss)
    } finally {
      tf.dispose([x, y, yLoss])
    }
    const t2 = performance.now()
    if (i === 0) firstStepAt = performance.timeOrigin + t2
    if (i === config.warmup - 1) waitAtWarmup.v = (shard as { stats?: { waitMs: number } }).stats?.waitMs ?? 0
    if (i >= config.warmup) {
      dataMs += t1 - t0
      stepMs += t2 - t0
    }
    if (i % 16 === 0) rss = Math.max(rss, process.memoryUsage().rss)
  }
  rss = Math.max(rss, process.memoryUsage().rss)
  const timed = steps - config.warmup
  const stats = (shard as { stats?: { waitMs: number; bytesRead: number } }).stats
  await ctx.report({
    steps,
    first_step_at: firstStepAt,
    step_ms: stepMs / Math.max(1, timed),
    data_ms: dataMs / Math.max(1, timed),
    data_share: dataMs / Math.max(1e-9, stepMs),
    // Of that, waiting for windows not loaded yet (streams).
    window_wait_ms: stats ? (stats.waitMs - waitAtWarmup.v) / Math.max(1, timed) : 0,
    rows_per_s: (timed * bs) / Math.max(1e-9, stepMs / 1000),
    bytes_read: stats?.bytesRead ?? 0,
    rss
  })
}
