// core/kernels/gru-cell.ts on webgpu: a GRU step's gates as two programs and their gradients as
// seven more, instead of tfjs-layers' cell's dozens a time step. Checked on the software adapter in
// a child process (support/webgpu-gru-child.ts): the loss and every gradient of a small tagger
// against tfjs-layers' own GRU cell on webgpu and on the cpu backend, and the programs a training
// step records each way.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-gru-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  results: Array<{ name: string; fused: boolean; tfjsFused: boolean; againstTfjs: number; againstTfjsCpu: number; programs: number; tfjsPrograms: number }>
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("a GRU cell's gates as webgpu programs", () => {
  it("give the loss and every gradient tfjs-layers' own GRU gives on webgpu and on cpu, both recurrent activations, every step's outputs or the last", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.results).toHaveLength(2)
    for (const c of r.results) {
      expect(c.fused, c.name).toBe(true)
      expect(c.tfjsFused, c.name).toBe(false)
      expect(c.againstTfjs, c.name).toBeLessThan(1e-4)
      expect(c.againstTfjsCpu, c.name).toBeLessThan(1e-4)
    }
  })

  it("record fewer than half the programs a training step of tfjs-layers' own cell records", () => {
    for (const c of r.results) expect(c.programs, c.name).toBeLessThan(c.tfjsPrograms * 0.5)
  })
})
