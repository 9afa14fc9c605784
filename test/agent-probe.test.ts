// What a node agent finds out about its node: nvidia-smi output parsing, and the tfjs backend
// probe (run in child processes, cached in the state dir).
import * as fs from "node:fs"
import * as path from "node:path"
import { afterAll, describe, expect, it } from "vitest"
import { parseNvidiaSmi, probeBackends, probeHardware } from "../actors/node/node-probe.ts"
import { TestRig } from "./support/actors-processes.ts"

const rig = new TestRig()
afterAll(() => rig.cleanup())

describe("node probe", () => {
  it("parses nvidia-smi's CSV (names with commas, units or not)", () => {
    expect(parseNvidiaSmi("0, NVIDIA H100 80GB HBM3, 81559\n1, NVIDIA H100 80GB HBM3, 81559 MiB\n\n")).toEqual([
      { index: 0, name: "NVIDIA H100 80GB HBM3", memoryMiB: 81559 },
      { index: 1, name: "NVIDIA H100 80GB HBM3", memoryMiB: 81559 }
    ])
    expect(parseNvidiaSmi("0, Tesla T4, rev, 2, 15360")).toEqual([{ index: 0, name: "Tesla T4, rev, 2", memoryMiB: 15360 }])
    expect(parseNvidiaSmi("garbage")).toEqual([])
  })

  it("reports hardware", async () => {
    const hw = await probeHardware()
    expect(hw.cpus).toBeGreaterThan(0)
    expect(hw.memoryBytes).toBeGreaterThan(0)
    expect(Array.isArray(hw.gpus)).toBe(true)
  })

  it("probes tfjs backends in child processes and caches the result", async () => {
    const dir = rig.tempDir()
    const cacheFile = path.join(dir, "backends.json")
    const first = await probeBackends({ gpus: [], cacheFile })
    // wasm ships inside its npm package and cpu is pure JS: both load everywhere.
    expect(first.backends).toContain("cpu")
    expect(first.backends).toContain("wasm")
    expect(first.errors["tensorflow-gpu"]).toBeDefined()
    expect(fs.existsSync(cacheFile)).toBe(true)
    const started = Date.now()
    const second = await probeBackends({ gpus: [], cacheFile })
    expect(second).toEqual(first)
    expect(Date.now() - started).toBeLessThan(1_000) // from the cache, no child process
  }, 120_000)
})
