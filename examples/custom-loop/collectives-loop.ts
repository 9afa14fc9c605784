// A training loop that talks to the group directly through ctx.communicator instead of
// prepareModel: it computes the training set's per-feature mean and standard deviation over every
// rank's shard with all-reduces (the statistics a normalisation layer needs, without any rank
// reading the whole dataset), broadcasts a random projection drawn on rank 0 (so every rank uses
// the same one without sharing a seed), then all-reduces a max and checks every rank agrees.
import type { TrainContext } from "../../index.ts"

export interface CollectivesConfig {
  /** Width of the random projection rank 0 broadcasts. */
  readonly projection?: number
}

export async function collectivesLoop(config: CollectivesConfig, ctx: TrainContext): Promise<void> {
  const comm = ctx.communicator
  const shard = await ctx.getDatasetShard("train")
  const { dataset } = shard
  const rows = shard.rows(0)
  const width = dataset.featureShape.reduce((a, b) => a * b, 1)

  // Sums of x and x^2 per feature plus the row count, in one buffer: one all-reduce instead of three.
  const stats = new Float32Array(2 * width + 1)
  for (let i = 0; i < rows.length; i++) {
    const base = rows[i] * width
    for (let f = 0; f < width; f++) {
      const v = dataset.x[base + f]
      stats[f] += v
      stats[width + f] += v * v
    }
  }
  stats[2 * width] = rows.length
  await comm.allReduce(stats, { op: "sum", algorithm: "ring" })
  const n = stats[2 * width]
  const mean = Array.from({ length: width }, (_, f) => stats[f] / n)
  const std = mean.map((m, f) => Math.sqrt(Math.max(0, stats[width + f] / n - m * m)))

  // Rank 0 draws the projection; broadcast overwrites every other rank's buffer with it.
  const projection = new Float32Array(config.projection ?? 16)
  if (ctx.worldRank === 0) for (let i = 0; i < projection.length; i++) projection[i] = Math.random() * 2 - 1
  await comm.broadcast(projection, 0)
  // In float32, as the all-reduce below carries it.
  const checksum = Math.fround(projection.reduce((a, b) => a + b, 0))

  // Every rank must now hold the same checksum: the max over ranks equals this rank's value.
  const max = Float32Array.of(checksum)
  await comm.allReduce(max, { op: "max", algorithm: "tree" })

  if (ctx.worldRank === 0) console.log(`rank 0: ${n} rows over ${ctx.worldSize} ranks`)
  await ctx.report({
    rows: n,
    meanPixel: mean.reduce((a, b) => a + b, 0) / width,
    meanStd: std.reduce((a, b) => a + b, 0) / width,
    projectionChecksum: checksum,
    sameProjection: max[0] === checksum
  })
}
