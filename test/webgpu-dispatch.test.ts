// core/kernels/webgpu-dispatch.ts: on webgpu, a kernel is recorded with its uniforms and bind group
// reused from earlier steps, not a new uniform write and bind group each. Checked on the software
// adapter (support/swiftshader.ts) in a child process against tfjs's own recording: the same
// kernels (uniforms of every length, programs' own values) give the same bits, a small CNN trains
// to the same weights, and caches that start over every few kernels (old uniform buffers retired
// while unsubmitted commands use them) give the same bits with no WebGPU validation error.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { WEBGPU_SUBMIT_EVERY } from "../core/engine.ts"
import { uniformLayout } from "../core/kernels/webgpu-dispatch.ts"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-dispatch-child.ts", import.meta.url))
const DEADLINE_MS = 2 * 60_000

interface Result {
  backend: string
  installed: boolean
  submitEvery: number
  first: string[]
  repeat: string[]
  small: string[]
  trained: string[]
  errors: string[]
  repeatKernels: number
  repeatUniformsMade: number
  repeatBindGroupsMade: number
  misses: number[]
  smallRestarts: number
  smallKernels: number
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("webgpu kernels reuse their uniforms and bind groups", { tags: ["webgpu"] }, () => {
  it("is installed when the webgpu engine loads, and records the kernels", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.installed).toBe(true)
    expect(r.submitEvery).toBe(WEBGPU_SUBMIT_EVERY)
    expect(r.repeatKernels).toBeGreaterThan(100)
  })

  it("gives the same bits as tfjs's own recording, the first time and when every uniform comes from the cache", () => {
    expect(r.first).toEqual([])
    expect(r.repeat).toEqual([])
    expect(r.repeatUniformsMade).toBe(0)
    expect(r.errors).toEqual([])
  })

  it("trains a CNN to the same weights as tfjs's own recording", () => {
    expect(r.trained).toEqual([])
  })

  it("reuses the bind groups of a training step within a few steps (the pool hands buffers out in a fixed order)", () => {
    // The first step makes a bind group for nearly every kernel; tfjs's stack order of free
    // buffers keeps it near that every step, the pool's order by id brings it to (near) none.
    expect(r.misses.length).toBe(8)
    expect(r.misses[0]).toBeGreaterThan(0.5)
    expect(Math.max(...r.misses.slice(-3))).toBeLessThan(0.1)
  })

  it("starts its caches over without a validation error or a wrong bit", () => {
    expect(r.smallRestarts).toBeGreaterThan(10)
    expect(r.small).toEqual([])
  })
})

describe("uniformLayout", () => {
  it("aligns as WGSL does: a number to 4 bytes, a vec2 to 8, longer to 16, and whatever follows 5 or 6 numbers to 16", () => {
    // NaN, Infinity, a rank-2 shape and its strides (1 number), the size.
    expect(uniformLayout([1, 1, 2, 1, 1])).toEqual({ offsets: [0, 4, 8, 16, 20], size: 24 })
    // A rank-3 shape aligns to 16; the struct's size rounds up to its largest alignment.
    expect(uniformLayout([1, 1, 3, 2])).toEqual({ offsets: [0, 4, 16, 32], size: 48 })
    // After a 6-number field, even a single number aligns to 16.
    expect(uniformLayout([1, 6, 1])).toEqual({ offsets: [0, 16, 48], size: 64 })
    // An empty field holds one number (tfjs writes 1 there).
    expect(uniformLayout([0, 0])).toEqual({ offsets: [0, 4], size: 8 })
  })

  it("refuses a field of more than 6 numbers", () => {
    expect(() => uniformLayout([7])).toThrow(/at most 6/)
  })
})
