// One training run of `npm run bench -- data`, in a process of its own so its RSS is the driver's
// alone: `node bench/data-run.ts '<json>'` trains test/support/data-bench-loop.ts on the embedded
// cluster, from files (fromFiles: the driver reads metadata) or in memory (the driver reads every
// row into arrays, as makeDataset users do, and the workers fetch them), samples this process's
// RSS while it runs, and prints one line `RESULT {json}`.
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, fromFiles, makeDataset } from "../index.ts"
import { resolveFileDataset } from "../core/data/resolve.ts"
import { FileStream } from "../core/data/stream.ts"
import type { DataBenchConfig } from "../test/support/data-bench-loop.ts"

const LOOP = fileURLToPath(new URL("../test/support/data-bench-loop.ts", import.meta.url)) + "#dataBenchLoop"

interface RunConfig extends DataBenchConfig {
  readonly mode: "files" | "memory"
  readonly dir: string
  readonly workers: number
  readonly storage: string
  readonly name: string
}

const cfg = JSON.parse(process.argv[2]!) as RunConfig
let rssMax = process.memoryUsage().rss
const sampler = setInterval(() => (rssMax = Math.max(rssMax, process.memoryUsage().rss)), 50)

const spec = fromFiles(cfg.dir, { label: "label" })
let train: ReturnType<typeof makeDataset> | typeof spec = spec
if (cfg.mode === "memory") {
  // What an in-memory user does: read every row into the driver.
  const d = await resolveFileDataset("train", spec)
  const s = new FileStream("train", d, 0, () => ({ rank: 0, worldSize: 1 }))
  const all = await s.readAll()
  await s.close()
  train = makeDataset(all.x, all.y, all.featureShape, 10)
}
const loaded = performance.now()
const r = await new Trainer({
  trainLoopPerWorker: LOOP,
  trainLoopConfig: { steps: cfg.steps, warmup: cfg.warmup, batch: cfg.batch } satisfies DataBenchConfig,
  scalingConfig: { numWorkers: cfg.workers },
  runConfig: { name: cfg.name, storagePath: cfg.storage, progress: false },
  datasets: { train }
}).fit()
clearInterval(sampler)
rssMax = Math.max(rssMax, process.memoryUsage().rss)
const ranks = r.metricsPerRank[0] ?? []
console.log(
  `RESULT ${JSON.stringify({
    mode: cfg.mode,
    driverRss: rssMax,
    loadMs: loaded,
    firstStepMs: Math.max(...ranks.map((m) => Number(m.first_step_at))) - performance.timeOrigin,
    ranks,
    dir: path.basename(cfg.dir)
  })}`
)
process.exit(0)
