// The README's example training loop, taken from the README as it stands and run as written (real
// embedded cluster, worker processes, digits): a second run under the same name resumes from the
// first's checkpoint and goes on with the next epoch instead of starting again at epoch 0.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { Trainer, loadDigits, trainTestSplit, type ArrayDataset } from "../index.ts"

const README = fs.readFileSync(new URL("../README.md", import.meta.url), "utf8")
let dir: string
let train: ArrayDataset

beforeAll(async () => {
  dir = fs.mkdtempSync(path.join(os.tmpdir(), "gw-readme-loop-"))
  ;({ train } = trainTestSplit(await loadDigits(), 0.2, 3))
})
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }))

describe("the README's training loop", () => {
  it("resumes after the checkpoint's epoch", async () => {
    const block = /```ts\n(\/\/ train\.ts: runs in every worker process\n[\s\S]*?)```/.exec(README)?.[1]
    expect(block, "the README's train.ts block").toBeDefined()
    // its only import is a type, which Node strips: the module runs anywhere
    expect(block).toContain('import type { TrainContext } from "gradwire"')
    const loop = path.join(dir, "train.ts")
    fs.writeFileSync(loop, block!)
    const fit = (epochs: number) =>
      new Trainer({
        trainLoopPerWorker: { module: loop, export: "trainLoop" },
        trainLoopConfig: { epochs },
        scalingConfig: { numWorkers: 2 },
        runConfig: { name: "readme", storagePath: dir, progress: false },
        datasets: { train }
      }).fit()
    const first = await fit(1)
    expect(first.metricsHistory.map((m) => m.epoch)).toEqual([0])
    const second = await fit(3)
    // (the rerun's history goes on from the first fit()'s round: epochs 1 and 2 trained now)
    expect(second.metricsHistory.map((m) => m.epoch)).toEqual([0, 1, 2])
    expect(second.metricsHistory[0]).toEqual(first.metricsHistory[0])
  }, 120_000)
})
