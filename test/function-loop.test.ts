// trainLoopPerWorker given as the function itself, as Ray Train's train_loop_per_worker: the driver
// finds the module that exports it (actors/train/driver/loop-function.ts) and the workers import that.
// A function no module exports, or one in the driver's own script, is a ConfigError saying where it
// is. The drivers run as their own processes, as a user's script does.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import * as fs from "node:fs/promises"
import * as os from "node:os"
import * as path from "node:path"
import { pathToFileURL } from "node:url"
import { locateLoopFunction } from "../actors/train/driver/loop-function.ts"
import { ConfigError } from "../core/errors.ts"
import { makeLoop, reportLoop } from "./support/report-loop.ts"
import { runScript } from "./support/run-script.ts"
import { liveNatsServerPids } from "../core/nats-server.ts"

const DRIVER = path.resolve("test/support/function-loop-driver.ts")
let storage: string

beforeAll(async () => {
  storage = await fs.mkdtemp(path.join(os.tmpdir(), "gw-function-loop-"))
})
afterAll(async () => {
  await fs.rm(storage, { recursive: true, force: true })
  expect(liveNatsServerPids()).toEqual([])
})

describe("trainLoopPerWorker as a function", () => {
  it("finds the module that exports it", async () => {
    expect(await locateLoopFunction(reportLoop, DRIVER)).toEqual({ module: pathToFileURL(path.resolve("test/support/report-loop.ts")).href, export: "reportLoop" })
  })

  it("refuses a function no module exports, or none at all, saying where it is", async () => {
    const closure = await locateLoopFunction(makeLoop(), DRIVER).then(() => undefined, (e: unknown) => e)
    expect(closure).toBeInstanceOf(ConfigError)
    expect((closure as ConfigError).message).toMatch(/\(test\/support\/report-loop\.ts:\d+\) is not exported by its module \(an inline function or a closure\): workers are separate processes/)
    await expect(locateLoopFunction(Math.max as never, DRIVER)).rejects.toThrow(/max was not found in any module/)
  })

  it("a driver script passes an imported loop function and trains", { timeout: 90_000 }, async () => {
    const run = await runScript(DRIVER, ["imported", storage], { timeoutMs: 80_000 })
    expect(run.output).toContain("RESULT [0,1]")
  })

  it("a driver script that passes a function of its own gets a ConfigError, not a worker that runs the driver again", { timeout: 90_000 }, async () => {
    const run = await runScript(DRIVER, ["own", storage], { timeoutMs: 80_000 })
    expect(run.output).toMatch(/FAILED ConfigError: .*ownLoop \(test\/support\/function-loop-driver\.ts:\d+\) is in the driver's own script/)
  })
})
