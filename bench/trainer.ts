// `npm run bench -- trainer`: (1) time from fit() to the first completed training step on the
// embedded cluster with 4 CPU workers; (2) time from a worker's death (kill -9) to resumed
// training; (3) per-step overhead of the data-parallel wrapper on 1 worker against plain tfjs on
// the same model and batch, measured in the same process and run.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit, loadEngine, type ArrayDataset } from "../index.ts"
import { DataParallelModel, type GradientSync } from "../actors/train/worker/data-parallel.ts"
import { median } from "../scheduler/cost-model.ts"

const LOOP = { module: new URL("../examples/digits/train.ts", import.meta.url).href, export: "trainLoop" }

const firstStep = async (storage: string, train: ArrayDataset, test: ArrayDataset, i: number): Promise<number> => {
  const t0 = performance.now()
  let first = 0
  await new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: 1 },
    scalingConfig: { numWorkers: 4 },
    runConfig: {
      name: `first-step-${i}`,
      storagePath: storage,
      progress: false,
      callbacks: [{ onProgress: () => void (first ||= performance.now()) }]
    },
    datasets: { train, test }
  }).fit()
  return first - t0
}

const recovery = async (storage: string, train: ArrayDataset, test: ArrayDataset, i: number): Promise<{ detectMs: number; resumeMs: number }> => {
  const stampFile = path.join(storage, `death-${i}`)
  let resumedAt = 0
  let detectedAt = 0
  const r = await new Trainer({
    trainLoopPerWorker: LOOP,
    trainLoopConfig: { epochs: 4, fail: { how: "kill", rank: 1, epoch: 2, stampFile } },
    scalingConfig: { numWorkers: 4 },
    runConfig: {
      name: `recovery-${i}`,
      storagePath: storage,
      progress: false,
      failureConfig: { maxFailures: 1 },
      callbacks: [
        {
          onStateChange: (s) => void (s.to === "restarting" && (detectedAt ||= Date.now())),
          onProgress: (p) => void (p.attempt === 1 && (resumedAt ||= Date.now()))
        }
      ]
    },
    datasets: { train, test }
  }).fit()
  if (r.restarts !== 1) throw new Error(`recovery run restarted ${r.restarts} times, not once`)
  const died = Number(await fs.readFile(stampFile, "utf8"))
  return { detectMs: detectedAt - died, resumeMs: resumedAt - died }
}

const overhead = async (units: number[], batch: number, steps: number): Promise<{ plainMs: number; wrappedMs: number; exchangeMs: number; params: number }> => {
  const { tf } = await loadEngine("auto")
  const build = () => {
    const m = tf.sequential()
    units.slice(1).forEach((u, i) =>
      m.add(tf.layers.dense({ units: u, inputShape: i === 0 ? [units[0]] : undefined, activation: i === units.length - 2 ? "softmax" : "relu" }))
    )
    m.compile({ optimizer: tf.train.sgd(0.01), loss: "categoricalCrossentropy" })
    return m
  }
  const x = tf.randomNormal([batch, units[0]])
  const y = tf.oneHot(tf.randomUniform([batch], 0, units.at(-1)!, "int32"), units.at(-1)!)
  const plain = build()
  const opt = plain.optimizer
  const vars = plain.trainableWeights.map((w) => w.read() as import("@tensorflow/tfjs").Variable)
  const plainStep = async () => {
    const loss = opt.minimize(() => tf.metrics.categoricalCrossentropy(y, plain.apply(x) as import("@tensorflow/tfjs").Tensor).mean() as import("@tensorflow/tfjs").Scalar, true, vars)
    await loss!.data()
    loss!.dispose()
  }
  const solo: GradientSync = { rank: 0, worldSize: 1, reduceGradients: async () => {}, broadcast: async () => {}, sum: async () => {} }
  const dp = await DataParallelModel.prepare(tf, build(), solo)
  const wrappedStep = async () => void (await dp.trainStep(x, y))
  // The same wrapper forced through the flat-gradient exchange path (what p >= 2 pays besides the network).
  const dpx = await DataParallelModel.prepare(tf, build(), solo)
  dpx.exchangeAlone = true
  const exchangeStep = async () => void (await dpx.trainStep(x, y))
  const time = async (f: () => Promise<void>) => {
    const t0 = performance.now()
    for (let i = 0; i < steps; i++) await f()
    return (performance.now() - t0) / steps
  }
  // Warm up both, then alternate blocks so load changes hit both alike.
  await time(plainStep)
  await time(wrappedStep)
  await time(exchangeStep)
  const p: number[] = []
  const w: number[] = []
  const e: number[] = []
  for (let round = 0; round < 5; round++) {
    p.push(await time(plainStep))
    w.push(await time(wrappedStep))
    e.push(await time(exchangeStep))
  }
  return { plainMs: median(p), wrappedMs: median(w), exchangeMs: median(e), params: dp.parameterCount }
}

export async function run(args: ReadonlyArray<string>): Promise<void> {
  const runs = Number(args.find((a) => a.startsWith("--runs="))?.slice(7) ?? 3)
  const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-bench-trainer-"))
  try {
    const { train, test } = trainTestSplit(await loadDigits(), 0.2, 1)
    console.log(`\ntrainer benchmark (${os.availableParallelism()} cores, load ${os.loadavg()[0].toFixed(1)}), median of ${runs}`)
    const fs1: number[] = []
    for (let i = 0; i < runs; i++) fs1.push(await firstStep(storage, train, test, i))
    console.log(`fit() -> first completed step, embedded cluster, 4 CPU workers: ${(median(fs1) / 1000).toFixed(2)} s (target <= 3 s; runs ${fs1.map((v) => (v / 1000).toFixed(2)).join(", ")})`)
    const rec: Array<{ detectMs: number; resumeMs: number }> = []
    for (let i = 0; i < runs; i++) rec.push(await recovery(storage, train, test, i))
    console.log(
      `worker kill -9 -> failure detected: ${(median(rec.map((r) => r.detectMs)) / 1000).toFixed(2)} s; ` +
        `-> training resumed (first step of the restarted group): ${(median(rec.map((r) => r.resumeMs)) / 1000).toFixed(2)} s (target <= 5 s)`
    )
    console.log("\ndata-parallel wrapper on 1 worker vs plain tfjs (optimizer.minimize), same model and batch:")
    console.log("(exchange path: the same wrapper forced through the flat-gradient copy out of and back into the engine, as with >= 2 workers)")
    console.log("model                      params   batch  plain ms/step  wrapped ms/step  overhead  exchange path ms/step  overhead")
    const pct = (a: number, b: number) => `${((a / b - 1) * 100).toFixed(1).padStart(7)}%`
    for (const [units, batch] of [[[64, 64, 10], 32], [[784, 512, 512, 10], 64]] as const) {
      const o = await overhead([...units], batch, 20)
      console.log(
        `${`MLP ${units.join("-")}`.padEnd(26)} ${String(o.params).padStart(7)}  ${String(batch).padStart(5)}  ${o.plainMs.toFixed(2).padStart(13)}  ${o.wrappedMs.toFixed(2).padStart(15)}  ${pct(o.wrappedMs, o.plainMs)}  ${o.exchangeMs.toFixed(2).padStart(21)}  ${pct(o.exchangeMs, o.plainMs)}`
      )
    }
  } finally {
    await fs.rm(storage, { recursive: true, force: true })
  }
}
