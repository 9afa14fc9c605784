// A driver for the run-directory tests, run as its own process so that it can get Ctrl-C: it
// trains the dashboard loop on 2 workers of an embedded cluster with plain progress lines (the
// workers' output, with their pids, among them) and prints "REPORT <index>" after each round.
// With "catch", the program listens for SIGINT itself and catches fit()'s rejection: it prints
// "CAUGHT <tag> <state of the run directory's summary>" and "AFTER", goes on for a second and
// ends on its own.
//   node test/support/interrupt-driver.ts <storagePath> <name> <stopFile> [catch]
import * as fs from "node:fs"
import * as path from "node:path"
import { Trainer, loadDigits, trainTestSplit } from "../../index.ts"

const [storagePath, name, stopFile, mode] = process.argv.slice(2)
if (mode === "catch") process.on("SIGINT", () => console.log("PROGRAM SIGINT"))
const { train } = trainTestSplit(await loadDigits(), 0.2, 1)
const fit = new Trainer({
  trainLoopPerWorker: { module: new URL("./dashboard-loop.ts", import.meta.url).href, export: "dashboardLoop" },
  trainLoopConfig: { stopFile, maxEpochs: 200, minEpochMs: 300 },
  scalingConfig: { numWorkers: 2 },
  runConfig: { name, storagePath, progress: "auto", callbacks: [{ onReport: ({ index }) => void console.log(`REPORT ${index}`) }] },
  datasets: { train }
}).fit()
if (mode !== "catch") await fit
else {
  try {
    await fit
    console.log("RESOLVED")
  } catch (e) {
    const summary = JSON.parse(fs.readFileSync(path.join((e as { result: { path: string } }).result.path, "summary.json"), "utf8")) as { state: string }
    console.log(`CAUGHT ${(e as { _tag?: string })._tag} ${summary.state}`)
  }
  console.log("AFTER")
  // a program that goes on (a server, a sweep's next trial) for a while
  await new Promise((resolve) => setTimeout(resolve, 1000))
}
