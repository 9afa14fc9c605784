// Custom collectives from a training loop: each rank all-reduces per-shard statistics of the
// digits training set and receives a random projection broadcast from rank 0 (see
// collectives-loop.ts). Runs on the embedded cluster.
//
//   node examples/custom-loop/collectives.ts [--workers 3] [--algorithm auto|ring|tree|hierarchical]
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer, loadDigits } from "../../index.ts"

const { values } = parseArgs({
  options: {
    workers: { type: "string", default: "3" },
    algorithm: { type: "string" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") }
  }
})

const digits = await loadDigits()
const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./collectives-loop.ts", import.meta.url).href, export: "collectivesLoop" },
  trainLoopConfig: { projection: 16 },
  scalingConfig: { numWorkers: Number(values.workers) },
  runConfig: { name: `custom_collectives_${Date.now()}`, storagePath: values.storage, progress: false },
  ...(values.algorithm ? { collectiveConfig: { algorithm: values.algorithm as "ring" } } : {}),
  datasets: { train: digits }
}).fit().catch((e: Error) => {
  // fit() rejects with a typed error carrying the partial Result (e.result) when training fails.
  console.error(`failed: ${e.message}`)
  process.exit(1)
})
const perRank = result.metricsPerRank[0]
console.log(`rows seen over all shards: ${result.metrics?.rows} (dataset: ${digits.size}; shards are equal-sized, so up to ${perRank.length - 1} rows are left out)`)
console.log(`mean pixel: ${Number(result.metrics?.meanPixel).toFixed(4)}, mean per-feature std: ${Number(result.metrics?.meanStd).toFixed(4)}`)
for (const [rank, m] of perRank.entries()) {
  console.log(`rank ${rank}: projection checksum ${Number(m.projectionChecksum).toFixed(6)}, same as every rank: ${m.sameProjection}`)
}
const agree = perRank.every((m) => m.sameProjection === true && m.projectionChecksum === perRank[0].projectionChecksum && m.rows === perRank[0].rows)
console.log(agree ? "all ranks agree" : "ranks DISAGREE")
console.log(`run directory: ${result.path}`)
process.exit(agree ? 0 : 1)
