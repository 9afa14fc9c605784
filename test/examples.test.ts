// Smoke tests of the custom-loop examples, run as a user runs them (their own process, on the
// embedded cluster): the collectives example agrees on every rank, the compression example trains
// and reports the bytes fp16 saved (half of dense fp32), and the files example trains from CSV files.
import * as fs from "node:fs"
import * as os from "node:os"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { runScript } from "./support/run-script.ts"

const storage = fs.mkdtempSync(path.join(os.tmpdir(), "gw-examples-"))
afterAll(() => fs.rmSync(storage, { recursive: true, force: true }))

describe("examples/custom-loop", () => {
  it("collectives.ts: all-reduced shard statistics and rank 0's broadcast agree on every rank", async () => {
    const r = await runScript("examples/custom-loop/collectives.ts", ["--workers", "2", "--storage", storage], { timeoutMs: 90_000 })
    expect(r.output).toContain("all ranks agree")
    expect(r.code).toBe(0)
    // Equal shards of 1797 rows over 2 ranks: 898 each.
    expect(r.output).toContain("rows seen over all shards: 1796")
  })

  it("compression.ts: trains with fp16 and prints the bytes it saved", async () => {
    const r = await runScript("examples/custom-loop/compression.ts", ["--compression", "fp16", "--epochs", "1", "--storage", storage], { timeoutMs: 90_000 })
    expect(r.code, r.output).toBe(0)
    const lines = r.output.split("\n").filter((l) => /^rank \d: /.test(l))
    expect(lines).toHaveLength(2)
    for (const l of lines) expect(l).toMatch(/saved [\d.]+ MiB \(2\.0x less\)/)
    expect(r.output).toMatch(/held-out accuracy \d+\.\d%/)
  })
})

describe("examples/files", () => {
  it("main.ts: trains the digits MLP from CSV files each worker streams its rows of", async () => {
    const r = await runScript("examples/files/main.ts", ["--epochs", "2", "--storage", storage], { timeoutMs: 90_000 })
    expect(r.code, r.output).toBe(0)
    expect(r.output).toMatch(/wrote 4 training files \(csv\)/)
    expect(r.output).toMatch(/held-out accuracy: \d+\.\d%/)
    expect(r.output).toMatch(/rank 0 read [\d.]+ MiB of training data/)
  })
})
