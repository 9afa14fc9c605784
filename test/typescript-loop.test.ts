// A loop in TypeScript that Node's type stripping does not cover (an enum), in a project of its own
// outside gradwire: with the driver started with --experimental-transform-types its workers run with
// it too and the loop trains; without, the run fails at once with a SyntaxError that says what to do.
// The drivers run as their own processes, as a user's script does.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { pathToFileURL } from "node:url"
import { runScript } from "./support/run-script.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"

let dir: string

beforeAll(async () => {
  dir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-ts-loop-"))
  const gradwire = pathToFileURL(path.resolve("index.ts")).href
  await fs.writeFile(
    path.join(dir, "train.ts"),
    [
      `import type { TrainContext } from "${gradwire}"`,
      "enum Phase { Warmup = 1, Main = 2 }",
      "export async function trainLoop(config: { epochs: number }, ctx: TrainContext): Promise<void> {",
      "  for (let epoch = 0; epoch < config.epochs; epoch++) await ctx.report({ epoch, phase: epoch === 0 ? Phase.Warmup : Phase.Main })",
      "}"
    ].join("\n")
  )
  await fs.writeFile(
    path.join(dir, "driver.ts"),
    [
      `import { Trainer } from "${gradwire}"`,
      "try {",
      "  const r = await new Trainer({",
      '    trainLoopPerWorker: { module: new URL("./train.ts", import.meta.url).href, export: "trainLoop" },',
      "    trainLoopConfig: { epochs: 2 },",
      "    scalingConfig: { numWorkers: 2 },",
      `    runConfig: { name: "ts-loop", storagePath: ${JSON.stringify(path.join(dir, "results"))}, progress: false }`,
      "  }).fit()",
      "  console.log(`RESULT ${JSON.stringify(r.metricsHistory.map((m) => m.phase))}`)",
      "} catch (e) {",
      "  console.log(`FAILED ${(e as Error).message}`)",
      "}"
    ].join("\n")
  )
})
afterAll(async () => {
  await fs.rm(dir, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

describe("a TypeScript loop with an enum", () => {
  it("trains when the driver runs with --experimental-transform-types: its workers run with it too", { timeout: 90_000 }, async () => {
    const run = await runScript(path.join(dir, "driver.ts"), [], { timeoutMs: 80_000, nodeArgs: ["--experimental-transform-types", "--no-warnings"] })
    expect(run.output).toContain("RESULT [1,2]")
  })

  it("fails at once without it, with a SyntaxError that says what to do", { timeout: 90_000 }, async () => {
    const run = await runScript(path.join(dir, "driver.ts"), [], { timeoutMs: 80_000 })
    expect(run.output).toMatch(/FAILED training failed on rank \d \(SyntaxError in the training loop\): TypeScript enum is not supported in strip-only mode .*write those as plain objects and fields.*--experimental-transform-types.*not retryable/)
  })
})
