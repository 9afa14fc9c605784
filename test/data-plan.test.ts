// The plan of a streamed epoch (core/data/plan.ts), as pure functions: an epoch's order is a
// permutation of the rows, fixed by the seed and new every epoch; the ranks' parts are disjoint,
// equal, and cover every row but the last few; and a position taken at any point and re-planned
// for another world size hands out exactly the rows not trained yet.
import { describe, expect, it } from "vitest"
import fc from "fast-check"
import { EpochOrder, freshPosition, partRows, planFor, rankIntervals, remainingIntervals, replan, replanRegroup, rowsLeft, type DataPosition } from "../core/data/plan.ts"

const expand = (iv: ReadonlyArray<readonly [number, number]>): number[] => iv.flatMap(([a, b]) => Array.from({ length: b - a }, (_, i) => a + i))

/** Every rank takes `steps` batches of `batch` rows (or what is left). */
const take = (pos: DataPosition, rows: number): { taken: number[][]; pos: DataPosition } => {
  const n = Math.min(rows, rowsLeft(pos))
  const taken = Array.from({ length: pos.worldSize }, (_, r) => expand(rankIntervals(pos, r)).slice(0, n))
  return { taken, pos: { ...pos, consumed: pos.consumed + n } }
}

describe("epoch order", () => {
  it("is a permutation of the rows, windows tile the stream, and it depends on seed and epoch", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 1, max: 40 }), { minLength: 1, maxLength: 30 }),
        fc.integer({ min: 1, max: 64 }),
        fc.integer(),
        fc.boolean(),
        (sizes, window, seed, shuffle) => {
          const rows = Int32Array.from(sizes)
          const o = new EpochOrder(rows, window, shuffle, seed, 3)
          const total = sizes.reduce((a, b) => a + b, 0)
          expect(o.rows).toBe(total)
          const stream = Array.from({ length: total }, (_, q) => o.streamPosition(q))
          expect([...stream].sort((a, b) => a - b)).toEqual(Array.from({ length: total }, (_, i) => i))
          if (!shuffle) expect(stream).toEqual(Array.from({ length: total }, (_, i) => i))
          // Pieces of every window cover it exactly, with rows inside their chunk.
          for (let w = 0; w * o.window < total; w++) {
            const pieces = o.windowPieces(w)
            expect(pieces.reduce((n, p) => n + p.to - p.from, 0)).toBe(o.windowLength(w))
            let at = 0
            for (const p of pieces) {
              expect(p.at).toBe(at)
              expect(p.to).toBeLessThanOrEqual(rows[p.chunk]!)
              at += p.to - p.from
            }
          }
        }
      ),
      { numRuns: 80 }
    )
    const sizes = Int32Array.from({ length: 20 }, () => 50)
    const order = (seed: number, epoch: number) => Array.from({ length: 1000 }, (_, q) => new EpochOrder(sizes, 128, true, seed, epoch).streamPosition(q))
    expect(order(1, 0)).toEqual(order(1, 0))
    expect(order(1, 0)).not.toEqual(order(1, 1))
    expect(order(1, 0)).not.toEqual(order(2, 0))
    // The chunk (file) order itself is reshuffled each epoch.
    expect([...new EpochOrder(sizes, 128, true, 1, 0).chunkOrder]).not.toEqual([...new EpochOrder(sizes, 128, true, 1, 1).chunkOrder])
  })
})

describe("plans", () => {
  it("give every rank an equal, disjoint part, and leave fewer rows than ranks", () => {
    fc.assert(
      fc.property(fc.integer({ min: 0, max: 3000 }), fc.integer({ min: 1, max: 9 }), (rows, p) => {
        const pos = freshPosition("f", 0, rows, p)
        const parts = Array.from({ length: p }, (_, r) => expand(rankIntervals(pos, r)))
        for (const part of parts) expect(part).toHaveLength(Math.floor(rows / p))
        const all = parts.flat()
        expect(new Set(all).size).toBe(all.length)
        expect(rows - all.length).toBeLessThan(p)
      }),
      { numRuns: 100 }
    )
  })

  it("re-planned at any point for any size, hand out exactly the rows not taken: none twice, none lost but the last few", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2000 }),
        fc.array(fc.tuple(fc.integer({ min: 1, max: 8 }), fc.integer({ min: 0, max: 300 })), { minLength: 1, maxLength: 5 }),
        (rows, phases) => {
          let pos = freshPosition("f", 2, rows, phases[0]![0])
          const seen: number[] = []
          for (const [p, n] of phases) {
            const finished = rowsLeft(pos) === 0
            pos = planFor(pos, "f", rows, 2, p)
            expect(pos.worldSize).toBe(p)
            // Remaining = everything not yet seen but what p ranks cannot split evenly (fewer than
            // p rows; nothing once the epoch's plan was finished).
            const rest = expand(remainingIntervals(pos))
            expect(new Set([...rest, ...seen]).size).toBe(rest.length + seen.length)
            if (finished) expect(rest).toEqual([])
            else {
              expect(rest.length + seen.length).toBeLessThanOrEqual(rows)
              expect(rows - (rest.length + seen.length)).toBeLessThan(p)
            }
            const t = take(pos, n)
            seen.push(...t.taken.flat())
            pos = t.pos
          }
          // Finish the epoch at the last size.
          const t = take(pos, rows)
          seen.push(...t.taken.flat())
          expect(new Set(seen).size).toBe(seen.length)
          // Rows never handed out: only what the plan that finished the epoch could not split evenly.
          expect(rows - seen.length).toBeLessThan(Math.max(...phases.map(([p]) => p)))
        }
      ),
      // The first: fewer rows than ranks after a re-plan (one row, two ranks).
      { numRuns: 150, examples: [[1, [[1, 0], [2, 0]]]] }
    )
  })

  it("re-planned after a regroup where ranks trained unequal counts (a lost rank one step short), hand out exactly the rows no rank trained", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 1, max: 2000 }),
        fc.integer({ min: 1, max: 8 }),
        fc.integer({ min: 0, max: 300 }),
        fc.integer({ min: 1, max: 40 }),
        fc.array(fc.boolean(), { minLength: 8, maxLength: 8 }),
        fc.integer({ min: 1, max: 8 }),
        (rows, p, before, step, lost, q) => {
          // A plan opened part-way (rows taken before it), then every rank took one more step; the
          // lost ranks' last step did not count.
          const opened = take(freshPosition("f", 0, rows, p), before).pos
          const base = opened.consumed
          const trained = Array.from({ length: p }, (_, r) => Math.min(partRows(opened), base + (lost[r] ? 0 : step)))
          const done = new Set<number>()
          for (let r = 0; r < p; r++) for (const x of expand(rankIntervals({ ...opened, consumed: 0 }, r)).slice(0, trained[r])) done.add(x)
          const next = replanRegroup(opened, trained, q)
          expect(next.worldSize).toBe(q)
          expect(next.consumed).toBe(0)
          const rest = expand(next.intervals)
          // Nothing trained comes again, and every row of the old plan not trained is in the new one.
          for (const x of rest) expect(done.has(x)).toBe(false)
          expect(rest.length + done.size).toBe(expand(opened.intervals).length)
          // The new plan's parts are disjoint and equal, as any plan's.
          const parts = Array.from({ length: q }, (_, r) => expand(rankIntervals(next, r)))
          for (const part of parts) expect(part).toHaveLength(Math.floor(rest.length / q))
        }
      ),
      { numRuns: 150 }
    )
    // Ranks that trained their whole part (or are not named) leave nothing of it.
    const pos = freshPosition("f", 0, 12, 3)
    expect(expand(replanRegroup(pos, [4, 2], 2).intervals)).toEqual([6, 7])
  })

  it("goes on at the same size, re-plans at another, and starts over in a new epoch or on other rows", () => {
    const pos: DataPosition = { ...freshPosition("f", 1, 100, 4), consumed: 10 }
    expect(planFor(pos, "f", 100, 1, 4)).toBe(pos)
    expect(planFor(pos, "f", 100, 1, 2)).toEqual(replan(pos, 2))
    expect(partRows(replan(pos, 2))).toBe(30)
    expect(planFor(pos, "f", 100, 2, 4)).toEqual(freshPosition("f", 2, 100, 4))
    expect(planFor(pos, "g", 100, 1, 4)).toEqual(freshPosition("g", 1, 100, 4))
  })
})
