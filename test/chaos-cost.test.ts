// The chaos bench's per-fault cost (bench/chaos-cost.ts): a synthetic pair of runs whose chaos run
// is 5% slower throughout (the machine's drift) and stalls at two faults; the costs come out as the
// stalls, the drift as its rate, and goodput without the drift from the stalls alone.
import { describe, expect, it } from "vitest"
import { faultCosts } from "../bench/chaos-cost.ts"

/** Epoch report times (ms): `perEpoch` ms each, plus `stalls` ms added at the first epoch at or past each time. */
const run = (epochs: number, perEpoch: number, stalls: ReadonlyArray<readonly [number, number]> = []): number[] => {
  const out: number[] = []
  let t = 0
  const pending = [...stalls]
  for (let e = 0; e < epochs; e++) {
    t += perEpoch
    while (pending.length && t >= pending[0]![0]) t += pending.shift()![1]
    out.push(t)
  }
  return out
}

describe("faultCosts", () => {
  it("separates the faults' stalls from a steady drift", () => {
    const free = run(600, 50)
    const chaos = run(600, 52.5, [
      [5_000, 800],
      [15_000, 1_200]
    ])
    const r = faultCosts(free, chaos, [5_000, 15_000])
    expect(r.drift).toBeCloseTo(2.5 / 52.5, 3)
    // The drift is taken off the stall's time too: a stall s counts as s (1 - drift).
    expect(r.costs[0]).toBeCloseTo(0.8 * (1 - r.drift), 1)
    expect(r.costs[1]).toBeCloseTo(1.2 * (1 - r.drift), 1)
    expect(r.netGoodput).toBeCloseTo(30 / (30 + r.costs[0]! + r.costs[1]!), 3)
    // Without drift and without faults: nothing.
    const same = faultCosts(free, free, [])
    expect([same.drift, same.netGoodput]).toEqual([0, 1])
    // A fault past the last epoch has no cost to tell.
    expect(faultCosts(free, chaos, [5_000, 60_000]).costs[1]).toBeUndefined()
  })
})
