// Trains the digits MLP from files instead of in-memory arrays: the driver reads only the files'
// metadata and every worker streams its own rows. With --address, the files are first uploaded to
// that cluster's JetStream object store (as `gradwire data put` does) and the workers read them
// from there, for machines that share no filesystem.
//
//   node examples/files/main.ts [--format csv|shards] [--workers 2] [--epochs 10] [--data DIR]
//                               [--address nats://HEAD:4222 --cluster NAME] [--storage DIR]
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { parseArgs } from "node:util"
import { Trainer, fromFiles, openNats, putFiles } from "../../index.ts"
import { prepareDigitsFiles } from "./prepare.ts"

const { values } = parseArgs({
  options: {
    format: { type: "string", default: "csv" },
    workers: { type: "string", default: "2" },
    epochs: { type: "string", default: "10" },
    data: { type: "string" },
    address: { type: "string" },
    cluster: { type: "string", default: "default" },
    storage: { type: "string", default: path.join(os.tmpdir(), "gradwire_results") },
    name: { type: "string" }
  }
})
if (values.format !== "csv" && values.format !== "shards") throw new RangeError(`--format is csv or shards, got ${values.format}`)

const dir = values.data ?? (await fs.mkdtemp(path.join(os.tmpdir(), "gw-files-example-")))
const prepared = await prepareDigitsFiles(dir, values.format)
console.log(`wrote ${prepared.files.length} training files (${values.format}) and ${path.basename(prepared.test)} to ${dir}`)

let trainSource: string = prepared.train
if (values.address) {
  // The workers of a multi-machine cluster may not see this disk: give them the files through NATS.
  const conn = await openNats({ servers: values.address, name: "files example upload" })
  try {
    await putFiles(conn.nc, prepared.files, "nats-obj://gradwire-examples/digits", {
      onFile: (f) => console.log(`uploaded ${path.basename(f.file)}: ${f.rows} rows in ${f.parts} part(s)`)
    })
  } finally {
    await conn.close()
  }
  trainSource = "nats-obj://gradwire-examples/digits"
}

try {
  const result = await new Trainer({
    trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" },
    trainLoopConfig: { epochs: Number(values.epochs) },
    scalingConfig: { numWorkers: Number(values.workers) },
    runConfig: { name: values.name ?? `digits_files_${Date.now()}`, storagePath: values.storage, checkpointConfig: { numToKeep: 1 } },
    datasets: {
      // CSV files: a header row, the label column named "label"; shards carry their own header.
      train: fromFiles(trainSource, { label: "label" }),
      test: fromFiles(prepared.test, { label: "label" })
    },
    ...(values.address ? { cluster: { address: values.address, clusterName: values.cluster } } : {})
  }).fit()
  const m = result.metrics ?? {}
  console.log(`held-out accuracy: ${(Number(m.val_accuracy) * 100).toFixed(1)}% after ${result.metricsHistory.length} epochs`)
  console.log(`rank 0 read ${Number(m.data_mib).toFixed(2)} MiB of training data and waited ${Number(m.data_wait_ms).toFixed(0)} ms for it`)
  console.log(`run directory: ${result.path}`)
} catch (e) {
  console.error(`training failed: ${(e as Error).message}`)
  process.exitCode = 1
} finally {
  if (!values.data) await fs.rm(dir, { recursive: true, force: true })
}
