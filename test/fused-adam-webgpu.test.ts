// core/kernels/fused-adam-webgpu.ts: tfjs's Adam as one dispatch per variable on webgpu gives the
// weights and the optimizer state (moments, accBeta1/2, iterations) that applyGradients gives,
// over several steps, with a read (values cached on the CPU) between them; and it declines where it
// must not write in place. Run on the software adapter (support/swiftshader.ts) in a child process.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/fused-adam-webgpu-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  fused: number
  steps: number
  weights: number
  moments: number
  acc: number
  iterations: number[]
  sgd: boolean
  shared: boolean
  alone: boolean
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("the fused Adam step on webgpu", () => {
  it("takes every step on the webgpu backend", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.fused).toBe(r.steps)
  })

  it("gives applyGradients' weights, moments and accBeta1/2 (to float32 rounding) and counts the iterations", () => {
    expect(r.weights).toBeLessThan(1e-5)
    expect(r.moments).toBeLessThan(1e-5)
    expect(r.acc).toBeLessThan(1e-6)
    expect(r.iterations[1]).toBe(r.iterations[0])
  })

  it("declines another optimizer and a weight whose buffer a clone shares", () => {
    expect(r.sgd).toBe(false)
    expect(r.shared).toBe(false)
    expect(r.alone).toBe(true)
  })
})
