// core/kernels/conv-grads-webgpu.ts: a 2-D convolution's filter gradient (also depthwise) on webgpu summed over the
// batch in parallel (columnSums), where tfjs's own program runs one GPU thread per filter weight
// over the whole batch. Checked on the software adapter in a child process
// (support/webgpu-conv-filter-child.ts) against float64 sums, beside tfjs's program on the same inputs.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-conv-filter-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  engine: string
  failures: string[]
  worst: Record<string, number>
  programs: Record<string, number>
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("a convolution's filter gradient on webgpu", { tags: ["webgpu"] }, () => {
  it("equals float64 sums for LeNet's and the residual CNN's layers, stride 2, a 1x1 filter, a long batch and depthwise filters, as tfjs's own program does", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.failures).toEqual([])
    expect(Object.keys(r.worst).filter((k) => k.endsWith(": gradwire"))).toHaveLength(8)
    expect(Object.keys(r.worst).filter((k) => k.endsWith(": tfjs"))).toHaveLength(8)
  })

  it("runs as gradwire's column sums, in as many levels as the batch needs, also inside tf.grad", () => {
    expect(r.engine).toContain("convolutions' filter gradients sum over the batch in parallel")
    expect(r.programs["a 1x1 filter"]).toBe(1)
    expect(r.programs["LeNet's first layer"]).toBe(2)
    expect(r.programs["a residual block's layer"]).toBe(2)
    expect(r.programs["a batch of three levels"]).toBe(3)
    expect(r.programs["depthwise"]).toBe(1)
    expect(r.programs["depthwise, multiplier 2, stride 2"]).toBe(1)
    expect(r.programs["tf.grad"]).toBeGreaterThanOrEqual(1)
    expect(r.worst["tf.grad of conv2d + ReLU"]).toBeLessThan(1e-5)
  })
})
