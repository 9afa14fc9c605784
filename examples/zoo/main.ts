// The model zoo on the embedded cluster: trains one model of the zoo (models.ts) data-parallel on
// the default backend and prints the held-out accuracy per epoch.
//
//   node examples/zoo/main.ts --model mlp|cnn|lenet|resnet|resnet28|resnet18|mobilenet|embedding|transformer|lstm|gru [--workers 2]
//                             [--epochs 5] [--batch-size 32] [--backend auto|wasm|cpu|webgpu]
//                             [--seed N] (the same initial weights, and so the same run, for the same N)
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer } from "../../index.ts"
import { loadZooData } from "./data.ts"
import { TASK_OF, ZOO_MODELS, type ZooModel } from "./models.ts"

const { values } = parseArgs({
  options: {
    model: { type: "string", default: "cnn" },
    workers: { type: "string", default: "2" },
    epochs: { type: "string", default: "5" },
    "batch-size": { type: "string", default: "32" },
    "learning-rate": { type: "string" },
    backend: { type: "string", default: "auto" },
    seed: { type: "string" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") }
  }
})
const model = values.model as ZooModel
if (!ZOO_MODELS.includes(model)) {
  console.error(`--model must be one of ${ZOO_MODELS.join(", ")}, got ${JSON.stringify(values.model)}`)
  process.exit(2)
}
if (values.seed !== undefined && !/^\d+$/.test(values.seed)) {
  console.error(`--seed must be a whole number, got ${JSON.stringify(values.seed)}`)
  process.exit(2)
}
const data = await loadZooData(TASK_OF[model])
console.log(`${model}: ${data.train.size} training rows, ${data.test.size} held out; ${values.workers} worker(s)`)
const t0 = performance.now()
const result = await new Trainer({
  trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "zooLoop" },
  trainLoopConfig: {
    model,
    epochs: Number(values.epochs),
    batchSize: Number(values["batch-size"]),
    ...(values["learning-rate"] ? { learningRate: Number(values["learning-rate"]) } : {}),
    ...(data.text ? { text: data.text } : {}),
    ...(values.seed !== undefined ? { seed: Number(values.seed) } : {})
  },
  // A GPU backend asked for by name means GPU workers.
  scalingConfig: {
    numWorkers: Number(values.workers),
    backend: values.backend as "auto",
    useGpu: values.backend === "webgpu" || values.backend === "tensorflow-gpu"
  },
  runConfig: { name: `zoo_${model}_${Date.now()}`, storagePath: values.storage },
  datasets: { train: data.train, test: data.test }
}).fit().catch((e: Error) => {
  console.error(`training failed: ${e.message}`)
  process.exit(1)
})
const acc = Number(result.metrics?.val_accuracy ?? 0)
console.log(`${model}: held-out accuracy ${(acc * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs, ${((performance.now() - t0) / 1000).toFixed(1)} s`)
console.log(`run directory: ${result.path}`)
