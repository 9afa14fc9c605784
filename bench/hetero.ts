// Heterogeneity-aware batching vs an equal split: `npm run bench -- hetero [--workers 3]
// [--slow 1] [--delay 1.5] [--batch 96] [--epochs 3]`. Two Trainer runs in the same process, same
// data, same global batch, one rank slowed by a simulated extra compute delay per sample (a slower
// device): first the equal split (adaptiveBatching off), then throughput-proportional batches
// (adaptiveBatching on). Prints steps/s after warm-up for both, the speed-up, the final per-rank
// batches and the stragglers reported.
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { fileURLToPath } from "node:url"
import { Trainer, loadDigits, trainTestSplit } from "../index.ts"
import { optionReader } from "./args.ts"

const LOOP = fileURLToPath(new URL("../test/support/hetero-loop.ts", import.meta.url)) + "#heteroLoop"

export async function run(argv: ReadonlyArray<string>): Promise<void> {
  const get = optionReader(argv)
  const workers = Number(get("--workers", "3"))
  const slow = Number(get("--slow", "1"))
  const delay = Number(get("--delay", "1.5"))
  const batch = Number(get("--batch", "96"))
  const epochs = Number(get("--epochs", "3"))
  const { train } = trainTestSplit(await loadDigits(), 0.2, 7)
  const storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-bench-hetero-"))
  try {
    const fit = async (adaptive: boolean) => {
      const r = await new Trainer({
        trainLoopPerWorker: LOOP,
        trainLoopConfig: { epochs, globalBatchSize: batch, slowdown: { [String(slow)]: delay } },
        scalingConfig: { numWorkers: workers },
        runConfig: { name: adaptive ? "adaptive" : "equal", storagePath: storage, progress: false },
        datasets: { train },
        collectiveConfig: { adaptiveBatching: adaptive }
      }).fit()
      return r.metrics!
    }
    console.log(
      `hetero: ${workers} workers, rank ${slow} slowed by ${delay} ms/sample, global batch ${batch}, ${epochs} epochs of ${Math.floor(train.size / batch)} steps (digits MLP)`
    )
    const equal = await fit(false)
    const adaptive = await fit(true)
    const e = equal.steps_per_s as number
    const a = adaptive.steps_per_s as number
    const batches = (m: Record<string, unknown>) => Array.from({ length: workers }, (_, i) => m[`batch/rank${i}`]).join("/")
    const stragglers = (m: Record<string, unknown>) =>
      Object.entries(m)
        .filter(([k]) => k.startsWith("straggler/"))
        .map(([k, v]) => `${k.slice(10)} (${String(v)}x)`)
        .join(", ") || "none"
    console.log(`  equal split        ${e.toFixed(1).padStart(7)} steps/s   batches ${batches(equal)}`)
    console.log(`  heterogeneity-aware ${a.toFixed(1).padStart(6)} steps/s   batches ${batches(adaptive)}   re-balances ${String(adaptive["batch/rebalances"])}   stragglers ${stragglers(adaptive)}`)
    console.log(`  speed-up ${(a / e).toFixed(2)}x (goal >= 1.4x); final loss equal ${(equal.loss as number).toFixed(3)}, adaptive ${(adaptive.loss as number).toFixed(3)}`)
  } finally {
    await fs.rm(storage, { recursive: true, force: true })
  }
}
