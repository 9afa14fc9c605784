// Training with gradient compression, and what it saved: runs compression-loop.ts on the embedded
// cluster with collectiveConfig.compression and prints, per rank, the gradient bytes sent against
// dense fp32 (fp16 halves them; top-k at 1% sends about 2% once indices are counted).
//
//   node examples/custom-loop/compression.ts [--compression fp16|topk|int8|powersgd|sign|none]
//                                            [--workers 2] [--epochs 3] [--algorithm ring]
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer, loadDigits, trainTestSplit, type CollectiveConfig } from "../../index.ts"

const { values } = parseArgs({
  options: {
    compression: { type: "string", default: "fp16" },
    workers: { type: "string", default: "2" },
    epochs: { type: "string", default: "3" },
    algorithm: { type: "string" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") }
  }
})

// The string forms the CLI accepts, as the config objects collectiveConfig.compression takes.
const compressions: Record<string, unknown> = {
  none: "none",
  fp16: "fp16",
  topk: { type: "topk", ratio: 0.01 },
  int8: { type: "int8" },
  powersgd: { type: "powersgd", rank: 2, warmupSteps: 5 },
  sign: { type: "sign" }
}
const compression = compressions[values.compression]
if (compression === undefined) {
  console.error(`--compression: one of ${Object.keys(compressions).join(", ")}`)
  process.exit(2)
}

const { train, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./compression-loop.ts", import.meta.url).href, export: "compressionLoop" },
  trainLoopConfig: { epochs: Number(values.epochs) },
  scalingConfig: { numWorkers: Number(values.workers) },
  runConfig: { name: `custom_compression_${values.compression}_${Date.now()}`, storagePath: values.storage, progress: false },
  collectiveConfig: { compression, ...(values.algorithm ? { algorithm: values.algorithm } : {}) } as CollectiveConfig,
  datasets: { train, test }
}).fit().catch((e: Error) => {
  // fit() rejects with a typed error carrying the partial Result (e.result) when training fails.
  console.error(`failed: ${e.message}`)
  process.exit(1)
})
const mib = (b: number): string => `${(b / 1024 / 1024).toFixed(2)} MiB`
console.log(`compression ${values.compression}: held-out accuracy ${(Number(result.metrics?.val_accuracy) * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs`)
for (const [rank, m] of (result.metricsPerRank.at(-1) ?? []).entries()) {
  const wire = Number(m.wireBytes)
  const dense = Number(m.denseBytes)
  console.log(
    `rank ${rank}: ${m.steps} steps, sent ${mib(wire)} of gradients instead of ${mib(dense)}: ` +
      `saved ${mib(dense - wire)} (${dense > 0 ? (dense / Math.max(1, wire)).toFixed(1) : "-"}x less)`
  )
}
console.log(`run directory: ${result.path}`)
