// The heterogeneity-aware batcher (actors/train/worker/hetero-batching.ts) against simulated ranks whose
// step time is affine in the batch (a fixed cost per step plus a cost per sample), as a
// CPU-throttled worker's is: the split must settle where the ranks' step times are equal, and stop
// re-balancing, instead of starving the rank with the fixed cost. Pure logic: the all-gather is
// computed from the simulated ranks.
import { describe, expect, it } from "vitest"
import { HeteroBatcher, affineThroughputs, fitStepTime } from "../actors/train/worker/hetero-batching.ts"

/** Step time in ms of a rank with fixed cost a and per-sample cost c at batch b. */
const time = (m: { a: number; c: number }, b: number): number => m.a + m.c * b

/** Runs `steps` steps of rank 0's batcher over ranks `models`; returns its batches after each step and its rebalance count. */
const simulate = async (models: Array<{ a: number; c: number }>, globalBatch: number, steps: number) => {
  let batcher!: HeteroBatcher
  batcher = new HeteroBatcher({
    rank: 0,
    worldSize: models.length,
    globalBatch,
    adaptive: true,
    // Every rank's (mean batch, mean ms) since the last exchange: constant batches in between.
    allGather: async () => Float32Array.from(models.flatMap((m, i) => [batcher.batches[i]!, time(m, batcher.batches[i]!)])),
    warmupSteps: 3,
    exchangeEvery: 5
  })
  const trace: number[][] = []
  for (let s = 0; s < steps; s++) {
    const b = batcher.batches[0]!
    await batcher.afterStep(b, time(models[0]!, b))
    trace.push([...batcher.batches])
  }
  return { trace, rebalances: batcher.metrics()["batch/rebalances"]! }
}

describe("heterogeneity-aware batching with a fixed cost per step", () => {
  it("fits a rank's fixed and per-sample cost from steps at batches apart, and not from one batch", () => {
    expect(fitStepTime([[64, 4 + 0.2 * 64], [20, 4 + 0.2 * 20], [40, 4 + 0.2 * 40]])).toEqual({ a: expect.closeTo(4, 9), c: expect.closeTo(0.2, 9) })
    expect(fitStepTime([[64, 10], [64, 11]])).toBeUndefined()
    expect(fitStepTime([[64, 10]])).toBeUndefined()
    // A negative intercept (noise): proportional through the totals instead.
    expect(fitStepTime([[10, 1], [100, 20]])).toEqual({ a: 0, c: 21 / 110 })
  })

  it("the split that equalises affine step times is a fixed point of the proportional split", () => {
    const models = [{ a: 1, c: 0.05 }, { a: 4, c: 0.2 }]
    const thr = affineThroughputs(128, models, [64, 64])
    // Proportional to these throughputs: b0 / b1 = thr0 / thr1, with b0 + b1 = 128.
    const b0 = (128 * thr[0]!) / (thr[0]! + thr[1]!)
    expect(time(models[0]!, b0)).toBeCloseTo(time(models[1]!, 128 - b0), 0)
  })

  it("settles near the equal-time split (a slow rank with a large fixed cost is not starved) and stops re-balancing", async () => {
    const models = [{ a: 1, c: 0.05 }, { a: 4, c: 0.2 }]
    // Equal times: 1 + 0.05 b0 = 4 + 0.2 (128 - b0): b0 = 114.4.
    const { trace, rebalances } = await simulate(models, 128, 200)
    const last = trace.at(-1)!
    expect(last[0]! + last[1]!).toBe(128)
    expect(Math.abs(last[0]! - 114.4)).toBeLessThanOrEqual(3)
    const stepMs = (b: number[]) => Math.max(time(models[0]!, b[0]!), time(models[1]!, b[1]!))
    expect(stepMs(last)).toBeLessThanOrEqual(1.05 * time(models[0]!, 114.4))
    // Settled: the second half of the run keeps one split.
    expect(new Set(trace.slice(100).map((b) => b.join("/"))).size).toBe(1)
    expect(rebalances).toBeLessThanOrEqual(6)
  })

  it("with no fixed cost it is the proportional split, as before", async () => {
    const models = [{ a: 0, c: 0.05 }, { a: 0, c: 0.2 }]
    const { trace } = await simulate(models, 100, 100)
    // 4x the throughput: 80 / 20.
    expect(trace.at(-1)).toEqual([80, 20])
  })
})
