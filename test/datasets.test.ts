import { describe, expect, it } from "vitest"
import fc from "fast-check"
import { loadDigits, shardIndices, trainTestSplit, gatherRows, makeDataset } from "../core/datasets.ts"
import { permutation } from "../core/random.ts"
import { ConfigError } from "../core/errors.ts"

describe("datasets", () => {
  it("loads the digits dataset", async () => {
    const d = await loadDigits()
    expect(d.size).toBe(1797)
    expect(d.featureShape).toEqual([64])
    expect(d.numClasses).toBe(10)
    let max = 0
    for (const v of d.x) max = Math.max(max, v)
    expect(max).toBe(1)
    const counts = new Array(10).fill(0)
    for (const y of d.y) counts[y]++
    expect(Math.min(...counts)).toBeGreaterThan(150)
  })

  it("permutations are permutations and depend on the seed", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 500 }), fc.integer(), (n, seed) => {
        const p = permutation(n, seed)
        expect([...p].sort((a, b) => a - b)).toEqual([...Array(n).keys()])
      }),
      { numRuns: 50 }
    )
    expect([...permutation(50, 1)]).not.toEqual([...permutation(50, 2)])
  })

  it("shards are disjoint, equal, deterministic and reshuffled per epoch", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 400 }), fc.integer({ min: 1, max: 9 }), fc.integer(), (size, world, seed) => {
        const shards = Array.from({ length: world }, (_, r) => shardIndices(size, r, world, seed, 0))
        const all = shards.flatMap((s) => [...s])
        expect(new Set(all).size).toBe(all.length)
        for (const s of shards) expect(s.length).toBe(Math.floor(size / world))
        expect([...shardIndices(size, 0, world, seed, 0)]).toEqual([...shards[0]])
      }),
      { numRuns: 60 }
    )
    expect([...shardIndices(100, 0, 2, 7, 0)]).not.toEqual([...shardIndices(100, 0, 2, 7, 1)])
  })

  it("rejects a rank outside the world", () => {
    expect(() => shardIndices(10, 3, 3, 0, 0)).toThrow(ConfigError)
  })

  it("splits train/test without overlap and gathers rows", async () => {
    const x = new Float32Array(20).map((_, i) => i)
    const y = new Int32Array(10).map((_, i) => i % 3)
    const ds = makeDataset(x, y, [2])
    const { train, test } = trainTestSplit(ds, 0.3, 1)
    expect(train.size + test.size).toBe(10)
    const rowsOf = (d: typeof ds) => new Set(Array.from({ length: d.size }, (_, i) => d.x[i * 2]))
    const a = rowsOf(train), b = rowsOf(test)
    for (const v of a) expect(b.has(v)).toBe(false)
    const g = gatherRows(ds, [3, 1])
    expect([...g.x]).toEqual([6, 7, 2, 3])
    expect([...g.y]).toEqual([0, 1])
    expect(() => makeDataset(new Float32Array(5), new Int32Array(2), [2])).toThrow(ConfigError)
  })
})

describe("a shard's shape, whatever it holds", () => {
  it("an in-memory shard and a file dataset's stream answer featureShape, numClasses and size alike (and their dataset its size)", async () => {
    const { DatasetShard } = await import("../actors/train/worker/train-context.ts")
    const { FileStream } = await import("../core/data/stream.ts")
    const { resolveFileDataset } = await import("../core/data/resolve.ts")
    const { fromFiles } = await import("../core/data/file-spec.ts")
    const fs = await import("node:fs/promises")
    const os = await import("node:os")
    const path = await import("node:path")
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), "gw-shard-shape-"))
    try {
      const x = Float32Array.from({ length: 10 * 3 }, (_, i) => i)
      const y = Int32Array.from({ length: 10 }, (_, i) => i % 4)
      const mem = new DatasetShard(makeDataset(x, y, [3]), 1, 2, 0)
      const file = path.join(dir, "rows.csv")
      await fs.writeFile(file, ["a,b,c,label", ...Array.from({ length: 10 }, (_, r) => `${x[r * 3]},${x[r * 3 + 1]},${x[r * 3 + 2]},${y[r]}`)].join("\n"))
      const resolved = await resolveFileDataset("rows", fromFiles(file))
      const stream = new FileStream("rows", resolved, 0, () => ({ rank: 1, worldSize: 2 }))
      for (const s of [mem, stream]) {
        expect(s.featureShape).toEqual([3])
        expect(s.labelShape).toEqual([])
        expect(s.numClasses).toBe(4)
        expect(s.size).toBe(5)
        expect(s.dataset.size).toBe(10)
      }
      await stream.close?.()
    } finally {
      await fs.rm(dir, { recursive: true, force: true })
    }
  })
})
