// core/kernels/fused-layers.ts columnSums: sums down the columns of a [rows, columns] problem on
// webgpu in parallel (chunks of rows per workgroup, then the chunks' sums), which batch and layer
// normalization's gradients and batch statistics use; one thread per column looping over every row
// (what they did before) left a GPU nearly idle on a long column. Checked on the software adapter in
// a child process (support/webgpu-column-sums-child.ts) against float64 sums and the cpu backend;
// also batch norm's moving statistics, updated by one program each.
import { fileURLToPath } from "node:url"
import { beforeAll, describe, expect, it } from "vitest"
import { columnSumGroups, columnSumRowsPerThread } from "../core/kernels/fused-layers.ts"
import { runWebGpuChild } from "./support/webgpu-child.ts"

const CHILD = fileURLToPath(new URL("./support/webgpu-column-sums-child.ts", import.meta.url))
const DEADLINE_MS = 3 * 60_000

interface Result {
  backend: string
  failures: string[]
  worst: Record<string, number>
  levels: number[]
  bnGroups: number
  lnGroups: number
  movingKernels: number
}
let r: Result

beforeAll(async () => {
  r = await runWebGpuChild<Result>(CHILD, DEADLINE_MS)
}, DEADLINE_MS + 30_000)

describe("column sums on webgpu", () => {
  it("splits a long column into chunks only as far as it must: no thread adds more than 512 rows, however long the column", () => {
    for (const [rows, columns] of [
      [262_144, 16],
      [32_768, 64],
      [1_000_000, 1],
      [4096, 512],
      [200_704, 150]
    ] as const) {
      expect(columnSumGroups(rows, columns)).toBeGreaterThan(1)
      expect(columnSumRowsPerThread(rows, columns)).toBeLessThanOrEqual(512)
      // One chunk fewer would leave some thread more than 512 rows.
      expect(Math.ceil(rows / (columnSumGroups(rows, columns) - 1)) / Math.floor(256 / Math.min(columns, 256))).toBeGreaterThan(512)
    }
    // A problem whose threads loop over at most 512 rows each is one level: a residual block's filter gradient at batch 8, batch norm at batch 32.
    expect(columnSumGroups(7, 3)).toBe(1)
    expect(columnSumGroups(512, 2304)).toBe(1)
    expect(columnSumGroups(2048, 16)).toBe(1)
  })

  it("adds as float64 sums do, over one, two and three levels, with one and two terms", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.levels).toEqual([1, 1, 1, 2, 2, 2, 3])
    expect(r.failures.filter((f) => f.startsWith("columnSums"))).toEqual([])
    expect(Object.keys(r.worst).filter((k) => k.startsWith("columnSums"))).toHaveLength(14)
  })

  it("gives batch and layer normalization on inputs of several chunks what the cpu backend gives", () => {
    expect(r.bnGroups).toBeGreaterThan(1)
    expect(r.lnGroups).toBeGreaterThan(1)
    expect(r.failures).toEqual([])
    expect(Object.keys(r.worst).filter((k) => k.startsWith("batch norm"))).toHaveLength(6)
    expect(Object.keys(r.worst).filter((k) => k.startsWith("layer norm"))).toHaveLength(4)
  })

  it("updates the moving statistics with one program each, as the cpu backend does", () => {
    expect(r.movingKernels).toBe(2)
    expect(Object.keys(r.worst).filter((k) => k.startsWith("moving statistics"))).toHaveLength(2)
  })
})
