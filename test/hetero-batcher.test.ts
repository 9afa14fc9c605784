// The heterogeneity-aware batcher (actors/train/worker/hetero-batching.ts) against simulated ranks whose
// step time is affine in the batch (a fixed cost per step plus a cost per sample), as a
// CPU-throttled worker's is: the split must settle where the ranks' step times are equal, and stop
// re-balancing, instead of starving the rank with the fixed cost. Pure logic: the all-gather is
// computed from the simulated ranks.
import { describe, expect, it } from "vitest"
import { HeteroBatcher, TRIAL_EXCHANGES, ZERO_RECHECK, affineThroughputs, fitStepTime } from "../actors/train/worker/hetero-batching.ts"

/** Step time in ms of a rank with fixed cost a and per-sample cost c at batch b. */
const time = (m: { a: number; c: number }, b: number): number => m.a + m.c * b

/** Runs `steps` steps of rank 0's batcher over ranks `models`; returns its batches after each step and its rebalance count. */
const simulate = async (models: Array<{ a: number; c: number }>, globalBatch: number, steps: number, noise = 0) => {
  // Deterministic multiplicative noise in [1 - noise, 1 + noise] on every measured time.
  let seed = 12345
  const jitter = (): number => {
    seed = (Math.imul(seed, 1103515245) + 12345) >>> 0
    return 1 + noise * ((seed / 2 ** 32) * 2 - 1)
  }
  let batcher!: HeteroBatcher
  batcher = new HeteroBatcher({
    rank: 0,
    worldSize: models.length,
    globalBatch,
    adaptive: true,
    // Every rank's (mean batch, mean ms) since the last exchange: constant batches in between.
    allGather: async () => Float32Array.from(models.flatMap((m, i) => [batcher.batches[i]!, time(m, batcher.batches[i]!) * jitter(), Number.NaN])),
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

  it("a slow rank whose fixed cost outweighs the fast rank's whole batch settles at the smallest batch despite noisy times", async () => {
    // Rank 1 pays 30 ms a step whatever its batch (a quarter core's quota waits); rank 0 takes
    // 2 + 0.2 b: the best split is 127/1. Times measured within +-15%: small batch changes of the
    // slow rank (1 <-> 3) barely change the step, and are not worth a re-balance.
    const models = [{ a: 2, c: 0.2 }, { a: 30, c: 0.3 }]
    const { trace, rebalances } = await simulate(models, 128, 300, 0.15)
    expect(trace.at(-1)![1]).toBeLessThanOrEqual(3)
    // One way there (the slow rank's batch never grows back), then settled.
    const slow = trace.map((b) => b[1]!)
    expect(slow.every((b, i) => i === 0 || b <= slow[i - 1]!)).toBe(true)
    expect(new Set(trace.slice(100).map((b) => b.join("/"))).size).toBe(1)
    expect(rebalances).toBeLessThanOrEqual(6)
  })

  it("a settled split still follows a rank that slows down for good", async () => {
    // Rank 1 at half speed: the split settles. From step 150 rank 1 runs 4x slower again, which
    // the settled split pays over 2x for: followed within 12 exchanges.
    let models = [{ a: 1, c: 0.1 }, { a: 2, c: 0.2 }]
    let batcher!: HeteroBatcher
    batcher = new HeteroBatcher({
      rank: 0,
      worldSize: 2,
      globalBatch: 128,
      adaptive: true,
      allGather: async () => Float32Array.from(models.flatMap((m, i) => [batcher.batches[i]!, time(m, batcher.batches[i]!), Number.NaN])),
      warmupSteps: 3,
      exchangeEvery: 5
    })
    for (let s = 0; s < 150; s++) await batcher.afterStep(batcher.batches[0]!, 0)
    const settled = [...batcher.batches]
    const before = batcher.metrics()["batch/rebalances"]!
    expect(before).toBeGreaterThanOrEqual(1)
    // Equal times: 1 + 0.1 b = 2 + 0.2 (128 - b), b = 88.7: within the threshold (10%) of that step.
    const stepMs = (b: number[]) => Math.max(time(models[0]!, b[0]!), time(models[1]!, b[1]!))
    expect(stepMs(settled)).toBeLessThanOrEqual(1.1 * time(models[0]!, 88.7))
    models = [{ a: 1, c: 0.1 }, { a: 8, c: 0.8 }]
    for (let s = 0; s < 60; s++) await batcher.afterStep(batcher.batches[0]!, 0)
    expect(batcher.metrics()["batch/rebalances"]!).toBeGreaterThan(before)
    // Equal times: 1 + 0.1 b = 8 + 0.8 (128 - b): b = 121.6.
    expect(batcher.batches[0]!).toBeGreaterThanOrEqual(110)
  })

  it("with no fixed cost it is the proportional split, as before", async () => {
    const models = [{ a: 0, c: 0.05 }, { a: 0, c: 0.2 }]
    const { trace } = await simulate(models, 100, 100)
    // 4x the throughput: 80 / 20.
    expect(trace.at(-1)).toEqual([80, 20])
  })

  /**
   * Ranks with forward+backward a + c b and `o` ms a step of other work (the exchange's and
   * update's share a quarter core waits its quota for): the group's step is its slowest rank's
   * o + (a + c b), a rank without rows taking o alone. Runs `steps` steps of rank 0's batcher.
   */
  const simulateWhole = async (models: Array<{ a: number; c: number; o: number }>, steps: number, allowZero: boolean | (() => boolean) = true, burst = (_exchange: number) => 1) => {
    const wall = (b: readonly number[]): number => Math.max(...models.map((m, i) => m.o + (b[i]! > 0 ? time(m, b[i]!) : 0)))
    let exchanges = 0
    let batcher!: HeteroBatcher
    batcher = new HeteroBatcher({
      rank: 0,
      worldSize: models.length,
      globalBatch: 128,
      adaptive: true,
      allowZero,
      allGather: async () => {
        const f = burst(++exchanges)
        return Float32Array.from(models.flatMap((m, i) => [batcher.batches[i]!, batcher.batches[i]! > 0 ? time(m, batcher.batches[i]!) : 0, f * wall(batcher.batches)]))
      },
      warmupSteps: 3,
      exchangeEvery: 5
    })
    const trace: number[][] = []
    for (let s = 0; s < steps; s++) {
      await batcher.afterStep(batcher.batches[0]!, time(models[0]!, batcher.batches[0]!), wall(batcher.batches))
      trace.push([...batcher.batches])
    }
    return trace
  }

  it("a rank whose one row still holds every step back is left without rows, and stays so when one row again is no faster", async () => {
    // The slow rank at one row: max(1 + 2 + 6.35, 6 + 30.3) = 36.3 ms a step; without rows 9.4 ms.
    const models = [{ a: 2, c: 0.05, o: 1 }, { a: 30, c: 0.3, o: 6 }]
    const steps = 5 * (3 * ZERO_RECHECK) + 100
    const trace = await simulateWhole(models, steps)
    expect(trace.at(-1)).toEqual([128, 0])
    // Settled without rows: after the way there, one row again only in the trials every ZERO_RECHECK
    // exchanges (TRIAL_EXCHANGES exchanges of 5 steps each).
    const later = trace.slice(200)
    expect(later.filter((b) => b[1] === 0).length).toBeGreaterThanOrEqual(later.length - 3 * 5 * TRIAL_EXCHANGES)
    expect(later.every((b) => b[0]! + b[1]! === 128)).toBe(true)
    // Not without allowZero (a strategy whose ranks without rows would fall behind): the one-row floor.
    const floor = await simulateWhole(models, 400, false)
    expect(floor.every((b) => b[1]! >= 1)).toBe(true)
    expect(floor.at(-1)).toEqual([127, 1])
  })

  it("one exchange's steps slowed by a burst (a CPU quota's) does not decide a trial: a rank whose one row holds every step back is still left without rows", async () => {
    // Every third exchange's steps take 4x as long: a single window of the trial may be the one.
    const models = [{ a: 2, c: 0.05, o: 1 }, { a: 30, c: 0.3, o: 6 }]
    for (const phase of [0, 1, 2]) {
      const trace = await simulateWhole(models, 400, true, (x) => ((x + phase) % 3 === 0 ? 4 : 1))
      // Its first trial kept (a few exchanges in), until the first check with one row again.
      expect(trace.slice(30, 5 * ZERO_RECHECK).every((b) => b[1] === 0)).toBe(true)
      expect(trace.at(-1)).toEqual([128, 0])
    }
  })

  it("a rank without rows gets one back once allowZero says no (strategy auto leaving the all-reduce), and is not tried without rows again while it says no", async () => {
    const models = [{ a: 2, c: 0.05, o: 1 }, { a: 30, c: 0.3, o: 6 }]
    let asked = 0
    const trace = await simulateWhole(models, 600, () => ++asked < 60)
    // Asked at every exchange (the 3 warm-up steps', then every 5th step's): the 60th, which says
    // no, ends step 3 + 5 * 57; without rows before it, one row for good from it on.
    const cut = 3 + 5 * 57
    expect(trace.slice(200, cut - 1).some((b) => b[1] === 0)).toBe(true)
    expect(trace.slice(cut - 1).every((b) => b[1]! >= 1 && b[0]! + b[1]! === 128)).toBe(true)
    expect(trace.at(-1)).toEqual([127, 1])
  })

  it("a rank the fit settles at a few rows, whose fixed cost lies outside forward+backward, is tried without rows and left so where that is faster", async () => {
    // Equal fitted forward+backward times put the slow rank near 15 rows (2 + 0.05·113 ≈ 3 + 0.3·15):
    // max(1 + 7.65, 15 + 7.5) = 22.5 ms a step there, 15 ms without rows.
    const models = [{ a: 2, c: 0.05, o: 1 }, { a: 3, c: 0.3, o: 15 }]
    const trace = await simulateWhole(models, 5 * (2 * ZERO_RECHECK) + 100)
    expect(trace.at(-1)).toEqual([128, 0])
    // The same ranks with little other work (2 ms): without rows 1% faster at most, so the split the
    // fit gives stays, a few rows on the slow rank, with trials now and then.
    const light = await simulateWhole([models[0]!, { ...models[1]!, o: 2 }], 5 * (2 * ZERO_RECHECK) + 100)
    expect(light.at(-1)![1]).toBeGreaterThan(5)
    expect(light.at(-1)![1]).toBeLessThan(32)
    expect(light.slice(100).filter((b) => b[1] === 0).length).toBeLessThanOrEqual(6 * 5 * TRIAL_EXCHANGES)
  })

  it("a rank whose step without rows would be no faster keeps its row (a trial, then back)", async () => {
    // The slow rank's other work alone takes 100 ms: at one row (where its forward+backward puts it)
    // max(9.35, 100 + 10.3) = 110.3 ms, without rows 100 ms (under 10% faster).
    const models = [{ a: 2, c: 0.05, o: 1 }, { a: 10, c: 0.3, o: 100 }]
    const trace = await simulateWhole(models, 5 * (2 * ZERO_RECHECK) + 100)
    expect(trace.at(-1)).toEqual([127, 1])
    // Tried at the start, then again after 8, 16, 32 and 64 exchanges (each trial TRIAL_EXCHANGES
    // exchanges of 5 steps): the trials' starts further and further apart.
    const starts = trace.flatMap((b, i) => (b[1] === 0 && trace[i - 1]?.[1] !== 0 ? [i] : []))
    expect(starts.length).toBeGreaterThanOrEqual(4)
    expect(starts.length).toBeLessThanOrEqual(6)
    const gaps = starts.slice(1).map((s, i) => s - starts[i]!)
    for (let i = 1; i < gaps.length; i++) expect(gaps[i]!).toBeGreaterThan(gaps[i - 1]!)
    expect(trace.filter((b) => b[1] === 0).length).toBeLessThanOrEqual(starts.length * 5 * TRIAL_EXCHANGES)
  })

  it("reports each rank's whole and forward+backward ms per step from the latest exchange, and no forward+backward for a rank without rows", async () => {
    // Rank 1 without rows: its exchanged mean batch is 0 (it measured no forward+backward).
    let round = 0
    const batcher = new HeteroBatcher({
      rank: 0,
      worldSize: 2,
      globalBatch: 64,
      adaptive: true,
      allGather: async () => (round++ === 0 ? Float32Array.of(32, 10, 12, 32, 40, 41) : Float32Array.of(64, 18, 21.5, 0, 0.001, 20.25)),
      warmupSteps: 1,
      exchangeEvery: 1
    })
    expect(batcher.metrics()["step_ms/rank0"]).toBeUndefined()
    await batcher.afterStep(32, 10, 12)
    expect(batcher.metrics()).toMatchObject({ "step_ms/rank0": 12, "compute_ms/rank0": 10, "step_ms/rank1": 41, "compute_ms/rank1": 40 })
    await batcher.afterStep(32, 10, 12)
    const m = batcher.metrics()
    expect(m).toMatchObject({ "step_ms/rank0": 21.5, "compute_ms/rank0": 18, "step_ms/rank1": 20.25 })
    expect(m["compute_ms/rank1"]).toBeUndefined()
  })
})
