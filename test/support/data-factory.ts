// A worker-side dataset factory for the Trainer's data tests (datasetFactory): called on each
// worker with its rank, it builds a tf.data pipeline of this rank's rows { xs, ys } (float targets).
import type { Tf } from "../../index.ts"

export function makeRows(options: { rowsPerRank: number }, info: { rank: number; worldSize: number; tf: Tf }) {
  const { rank, tf } = info
  const rows = Array.from({ length: options.rowsPerRank }, (_, i) => {
    const id = rank * options.rowsPerRank + i
    return { xs: [id / 100, Math.sin(id), Math.cos(id)], ys: 2 * Math.sin(id) - Math.cos(id) }
  })
  return tf.data.array(rows).map((r) => r)
}
