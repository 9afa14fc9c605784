import { Trainer, loadDigits } from "./index.ts"
const t0 = Date.now()
try {
  const r = await new Trainer({
    trainLoopPerWorker: { module: new URL("./_probe2.ts", import.meta.url).href, export: "loop" },
    trainLoopConfig: { epochs: Number(process.argv[2] ?? 4) },
    scalingConfig: { numWorkers: Number(process.argv[3] ?? 2) },
    runConfig: { name: "probe2", storagePath: "/tmp/nu/results-p2", progress: false, failureConfig: { maxFailures: 1 } },
    datasets: { train: await loadDigits() }
  }).fit()
  console.log("RESULT", r.metricsHistory.map((m) => `${m.epoch}:${(m.accuracy as number).toFixed(3)}`).join(" "), "restarts", r.restarts, (Date.now() - t0) / 1000)
} catch (e) { console.error("FAILED", (e as Error).message.slice(0, 800)) }
