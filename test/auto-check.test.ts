// bench hetero's check of strategy auto against the fastest strategy it could have run
// (bench/auto-check.ts): pure, on rates as the bench measures them.
import { describe, expect, it } from "vitest"
import { autoAgainstBest, formatAutoCheck, type StrategyRun } from "../bench/auto-check.ts"

const run = (strategy: string, adaptive: boolean, samplesPerS: number, endedOn?: string): StrategyRun => ({ strategy, adaptive, samplesPerS, ...(endedOn ? { endedOn } : {}) })

describe("autoAgainstBest", () => {
  it("compares each auto run with the fastest candidate measured with the same split", () => {
    const checks = autoAgainstBest([
      run("allreduce", false, 1000),
      run("allreduce", true, 2000),
      run("ssp", false, 1500),
      run("ssp", true, 1800),
      run("auto", false, 1450, "ssp"),
      run("auto", true, 1700, "ssp")
    ])
    expect(checks).toHaveLength(2)
    const [equal, adaptive] = checks
    expect(equal).toMatchObject({ auto: "auto", adaptive: false, best: { strategy: "ssp", samplesPerS: 1500 }, atBest: true, endedOnBest: true })
    expect(equal!.ofBest).toBeCloseTo(1450 / 1500, 10)
    // The adaptive split's best is the all-reduce (2000): auto at 0.85x of it, on another strategy.
    expect(adaptive).toMatchObject({ adaptive: true, best: { strategy: "allreduce", samplesPerS: 2000 }, atBest: false, endedOnBest: false })
    expect(adaptive!.ofBest).toBeCloseTo(0.85, 10)
  })

  it("counts local SGD as a candidate only where auto was offered it, and never auto itself", () => {
    const runs = [run("allreduce", true, 1000), run("local-sgd", true, 3000), run("auto", true, 1100, "allreduce"), run("auto-local", true, 2900, "local-sgd")]
    const [plain, local] = autoAgainstBest(runs)
    expect(plain).toMatchObject({ auto: "auto", best: { strategy: "allreduce" }, atBest: true, endedOnBest: true })
    expect(local).toMatchObject({ auto: "auto-local", best: { strategy: "local-sgd" }, atBest: true, endedOnBest: true })
  })

  it("takes 1.1x as the edge of at the best, and leaves out an auto run with no candidate beside it", () => {
    const edge = autoAgainstBest([run("async", false, 1100), run("auto", false, 1000, "allreduce")])
    expect(edge[0]!.atBest).toBe(true)
    expect(autoAgainstBest([run("async", false, 1101), run("auto", false, 1000)])[0]!.atBest).toBe(false)
    expect(autoAgainstBest([run("local-sgd", false, 1000), run("auto", false, 900)])).toEqual([])
    expect(formatAutoCheck(edge[0]!)).toBe(
      "auto, equal split: 1000 samples/s, ended on allreduce; the fastest strategy it could run, measured here: async at 1100 samples/s; auto at 0.91x of it (within 1.1x), ending elsewhere"
    )
  })
})
