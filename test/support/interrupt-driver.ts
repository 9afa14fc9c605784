// A driver for the run-directory tests, run as its own process so that it can get Ctrl-C: it
// trains the dashboard loop on 2 workers of an embedded cluster with plain progress lines (the
// workers' output, with their pids, among them) and prints "REPORT <index>" after each round.
//   node test/support/interrupt-driver.ts <storagePath> <name> <stopFile>
import { Trainer, loadDigits, trainTestSplit } from "../../index.ts"

const [storagePath, name, stopFile] = process.argv.slice(2)
const { train } = trainTestSplit(await loadDigits(), 0.2, 1)
await new Trainer({
  trainLoopPerWorker: { module: new URL("./dashboard-loop.ts", import.meta.url).href, export: "dashboardLoop" },
  trainLoopConfig: { stopFile, maxEpochs: 200, minEpochMs: 300 },
  scalingConfig: { numWorkers: 2 },
  runConfig: { name, storagePath, progress: "auto", callbacks: [{ onReport: ({ index }) => void console.log(`REPORT ${index}`) }] },
  datasets: { train }
}).fit()
