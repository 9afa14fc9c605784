// core/kernels/relu-grad.ts on webgpu: ReLU's gradient as one program where tfjs records Step and
// Multiply; checked on the software adapter in a child (support/webgpu-relu-grad-child.ts) against
// the cpu backend's gradient, element for element (zeros, negatives, NaN).
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-relu-grad-child.ts", import.meta.url))
const DEADLINE_MS = 2 * 60_000
let r: { engine: string; mismatches: number; nan: number; programs: number; n: number }

beforeAll(async () => {
  r = await runWebGpuChild(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("ReLU's gradient on webgpu", () => {
  it("equals the cpu backend's element for element, NaN where the input is NaN", () => {
    expect(r.n).toBeGreaterThan(1000)
    expect(r.mismatches).toBe(0)
    expect(r.nan).toBeGreaterThan(0)
  })
  it("is one program: with the forward ReLU, two where tfjs's gradient makes three", () => {
    expect(r.engine).toContain("ReLU's gradient runs as one program")
    expect(r.programs).toBe(2)
  })
})
