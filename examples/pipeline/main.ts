// Pipeline (and tensor) parallelism on the digits MLP: the model is cut into stages, one worker
// each, micro-batches keep them busy (GPipe or 1F1B), and with more workers than stages x tensor
// ranks the pipelines are data-parallel replicas. At the end the stage-sharded checkpoint is
// merged into one tfjs model here, in the driver, and scored on the held-out rows.
//
//   node examples/pipeline/main.ts [--workers 4] [--stages 2] [--tensor-parallel 1] [--micro-batches 4]
//                                  [--schedule 1f1b|gpipe] [--epochs 10] [--storage DIR]
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer, loadDigits, loadEngine, loadPipelineCheckpoint, trainTestSplit } from "../../index.ts"

const { values } = parseArgs({
  options: {
    workers: { type: "string", default: "4" },
    stages: { type: "string", default: "2" },
    "tensor-parallel": { type: "string", default: "1" },
    "micro-batches": { type: "string", default: "4" },
    schedule: { type: "string", default: "1f1b" },
    epochs: { type: "string", default: "10" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") }
  }
})

const { train, test } = trainTestSplit(await loadDigits(), 0.2, 2024)
const workers = Number(values.workers)
const stages = Number(values.stages)
const tp = Number(values["tensor-parallel"])
console.log(`digits: ${workers} workers = ${workers / (stages * tp)} replica(s) x ${stages} stage(s) x ${tp} tensor rank(s), ${values.schedule}, ${values["micro-batches"]} micro-batches`)

const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" },
  trainLoopConfig: { epochs: Number(values.epochs), stages, tensorParallel: tp, microBatches: Number(values["micro-batches"]), schedule: values.schedule },
  scalingConfig: { numWorkers: workers },
  runConfig: { name: `pipeline_${Date.now()}`, storagePath: values.storage, checkpointConfig: { numToKeep: 1 }, failureConfig: { maxFailures: 1 } },
  datasets: { train, test }
})
  .fit()
  .catch((e: Error) => {
    console.error(`training failed: ${e.message}`)
    process.exit(1)
  })
const m = result.metrics ?? {}
console.log(`pipeline: held-out accuracy ${(Number(m.val_accuracy) * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs`)

// The stages' shards, merged into one model: inference (or model.save to export it) without a cluster.
const { tf } = await loadEngine("auto")
const model = await loadPipelineCheckpoint(tf, result.checkpoint!.path)
const pred = (model.predict(tf.tensor2d(test.x, [test.size, 64])) as import("@tensorflow/tfjs").Tensor).argMax(-1).dataSync()
let correct = 0
for (let i = 0; i < test.size; i++) if (pred[i] === test.y[i]) correct++
console.log(`merged model: held-out accuracy ${((100 * correct) / test.size).toFixed(1)}% (${model.layers.length} layers, one process)`)
