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

describe("column sums on webgpu", { tags: ["webgpu"] }, () => {
  it("takes the fewest levels in which no thread adds more than 256 rows, the rows split evenly between them", () => {
    const lanes = (columns: number) => Math.floor(256 / Math.min(columns, 256))
    const levels = (rows: number, columns: number) => {
      let n = 1
      for (let r = columnSumGroups(rows, columns); r > 1; r = columnSumGroups(r, columns)) n++
      return n
    }
    for (const [rows, columns, want] of [
      [262_144, 16, 2],
      [32_768, 64, 2],
      [1_000_000, 1, 2],
      [4096, 512, 2],
      [16_384, 2304, 2],
      [200_704, 150, 3],
      [3_000_000, 300, 3]
    ] as const) {
      expect(levels(rows, columns)).toBe(want)
      expect(columnSumRowsPerThread(rows, columns)).toBeLessThanOrEqual(256)
      // Even: the first level's loop is about the L-th root of the rows a column's thread would add alone (not 256 then a remainder).
      expect(columnSumRowsPerThread(rows, columns)).toBeLessThanOrEqual(Math.ceil((rows / lanes(columns)) ** (1 / want)) + 1)
    }
    // Up to 256 rows a thread is one level: batch norm at batch 32, a layer norm of 1024 rows.
    expect(columnSumGroups(7, 3)).toBe(1)
    expect(columnSumGroups(2048, 16)).toBe(1)
    expect(columnSumGroups(1024, 64)).toBe(1)
  })

  it("adds as float64 sums do, over one, two and three levels, with one and two terms", () => {
    expect(r.backend).toBe("webgpu")
    expect(r.levels).toEqual([1, 1, 2, 2, 2, 2, 3])
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
