// `npm run demo`: trains the digits example data-parallel on an embedded local cluster (a
// nats-server and a local agent started and stopped by gradwire), with live progress, and prints
// the held-out accuracy and the run directory.
//
//   node examples/digits/main.ts [--workers 4] [--model mlp|cnn] [--epochs 20] [--compression fp16]
//                                [--timeline] [--storage DIR] [--name NAME]
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer, loadDigits, trainTestSplit } from "../../index.ts"

const { values } = parseArgs({
  options: {
    workers: { type: "string", default: "4" },
    model: { type: "string", default: "mlp" },
    epochs: { type: "string", default: "20" },
    "batch-size": { type: "string", default: "32" },
    compression: { type: "string" },
    timeline: { type: "boolean", default: true },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") },
    name: { type: "string" }
  }
})

const digits = await loadDigits()
const { train, test } = trainTestSplit(digits, 0.2, 2024)
console.log(`digits: ${train.size} training rows, ${test.size} held out; ${values.workers} workers, ${values.model}`)

const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" },
  trainLoopConfig: { epochs: Number(values.epochs), model: values.model, batchSize: Number(values["batch-size"]) },
  scalingConfig: { numWorkers: Number(values.workers) },
  runConfig: {
    name: values.name ?? `digits_${values.model}_${Date.now()}`,
    storagePath: values.storage,
    checkpointConfig: { numToKeep: 2, scoreAttribute: "val_accuracy", scoreOrder: "max" },
    failureConfig: { maxFailures: 2 },
    timeline: values.timeline
  },
  ...(values.compression ? { collectiveConfig: { compression: values.compression } } : {}),
  datasets: { train, test }
}).fit().catch((e: Error) => {
  // fit() rejects with a typed error carrying the partial Result (e.result) when training fails.
  console.error(`training failed: ${e.message}`)
  process.exit(1)
})
const acc = Number(result.metrics?.val_accuracy ?? 0)
console.log(`held-out accuracy: ${(acc * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs`)
console.log(`best checkpoint: ${result.bestCheckpoints[0]?.path ?? "none"}`)
console.log(`run directory: ${result.path}`)
