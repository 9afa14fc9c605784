// A driver that passes its loop as the function itself, as Ray Train's train_loop_per_worker is
// (trainLoopPerWorker: reportLoop), run as its own process. `how`: "imported" (a function another
// module exports), "inline" (an arrow written in place), "own" (a function this script exports).
// Prints RESULT with the reports, or FAILED with the error.
import * as os from "node:os"
import * as path from "node:path"
import { Trainer } from "../../index.ts"
import { reportLoop } from "./report-loop.ts"

export async function ownLoop(): Promise<void> {}

const how = process.argv[2]
const storage = process.argv[3] ?? path.join(os.tmpdir(), "gw-function-loop")
const loop = how === "imported" ? reportLoop : how === "own" ? ownLoop : async () => {}
try {
  const r = await new Trainer({
    trainLoopPerWorker: loop,
    trainLoopConfig: { mode: "scalar", epochs: 2 },
    scalingConfig: { numWorkers: 2 },
    runConfig: { name: `function-${how}`, storagePath: storage, progress: false }
  }).fit()
  console.log(`RESULT ${JSON.stringify(r.metricsHistory.map((m) => m.epoch))}`)
} catch (e) {
  console.log(`FAILED ${(e as Error).name}: ${(e as Error).message}`)
}
