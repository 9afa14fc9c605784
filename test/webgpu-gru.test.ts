// core/kernels/gru-cell.ts on webgpu: a GRU step's gates as two programs and their gradients as
// seven more, instead of tfjs-layers' cell's dozens a time step; and core/kernels/gru-sequence.ts:
// the GRU layer's whole recurrence as one program forward and one backward. Checked on the software
// adapter in a child process (support/webgpu-gru-child.ts): the loss and every gradient of a small
// tagger against tfjs-layers' own GRU cell on webgpu and on the cpu backend, the programs a training
// step records each way and at two sequence lengths, and the layers the loop keeps.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"
import { wholeSequenceTests } from "./support/webgpu-sequence.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-gru-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  results: Array<{ name: string; fused: boolean; tfjsFused: boolean; againstTfjs: number; againstTfjsCpu: number; programs: number; tfjsPrograms: number }>
  sequence: Array<{ name: string; ran: boolean; loopRan: boolean; againstLoop: number; againstTfjsCpu: number; programs: number; loopPrograms: number }>
  lengths: { short: number; long: number }
  masked: { short: number; long: number }
  backwards: { short: number; long: number }
  backwardsAgainstTfjsCpu: number
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("a GRU cell's gates as webgpu programs", { tags: ["webgpu"] }, () => {
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

describe("a GRU's whole recurrence as one webgpu program each way", { tags: ["webgpu"] }, () => {
  wholeSequenceTests("GRU", "every step's outputs or the last, both recurrent activations, 144 units, one step", () => ({ ...r, cases: r.sequence }))
})
