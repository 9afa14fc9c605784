// The automatic strategy's cost model (scheduler/strategy-choice.ts), pure: which of all-reduce,
// backup workers and SSP it predicts fastest for measured compute and communication times.
import { describe, expect, it } from "vitest"
import { chooseStrategy, predictStrategies } from "../scheduler/strategy-choice.ts"

const steps = (n: number, f: (t: number) => number): number[] => Array.from({ length: n }, (_, t) => f(t))

describe("strategy choice", () => {
  it("keeps the all-reduce for a balanced group on a fast link", () => {
    const c = [0, 1, 2, 3].map(() => steps(10, () => 20))
    const r = chooseStrategy({ computeMs: c, allReduceMs: 2, numServers: 1 }, "allreduce")
    expect(r.pick).toBe("allreduce")
    expect(r.changed).toBe(false)
    const ar = r.predictions.find((x) => x.name === "allreduce")!
    expect(ar.stepsPerSec).toBeCloseTo((4 * 1000) / 22, 6)
  })

  it("drops a persistent straggler with backup workers, and SSP does not help against it", () => {
    // Rank 1 is 3x slower every step.
    const c = [0, 1, 2, 3].map((r) => steps(10, () => (r === 1 ? 60 : 20)))
    const r = chooseStrategy({ computeMs: c, allReduceMs: 2, numServers: 1 }, "allreduce")
    expect(r.pick).toBe("backup")
    const p = Object.fromEntries(r.predictions.map((x) => [x.name, x.stepsPerSec]))
    expect(p.backup!).toBeGreaterThan(p.allreduce! * 1.2)
    // SSP runs at the straggler's pace: no better than the all-reduce.
    expect(p.ssp!).toBeLessThan(p.allreduce! * 1.05)
    expect(r.text).toMatch(/backup .*<- picked/)
  })

  it("absorbs jitter with SSP: different ranks slow in each step, two at a time", () => {
    const c = [0, 1, 2, 3].map((r) => steps(12, (t) => (t % 4 === r || (t + 1) % 4 === r ? 80 : 20)))
    const r = chooseStrategy({ computeMs: c, allReduceMs: 2, numServers: 2 }, "allreduce")
    expect(r.pick).toBe("ssp")
    const p = Object.fromEntries(r.predictions.map((x) => [x.name, x.stepsPerSec]))
    expect(p.ssp!).toBeGreaterThan(p.backup!)
  })

  it("prices the servers' link: a big model on one server stays on the all-reduce", () => {
    const c = [0, 1, 2, 3].map((r) => steps(10, () => (r === 1 ? 30 : 20)))
    const few = predictStrategies({ computeMs: c, allReduceMs: 200, numServers: 1 })
    const r = chooseStrategy({ computeMs: c, allReduceMs: 200, numServers: 1 }, "allreduce")
    expect(r.pick).toBe("allreduce")
    // More servers spread the traffic: the backup prediction rises.
    const many = predictStrategies({ computeMs: c, allReduceMs: 200, numServers: 4 })
    expect(many.find((x) => x.name === "backup")!.stepsPerSec).toBeGreaterThan(few.find((x) => x.name === "backup")!.stepsPerSec)
  })

  it("needs the hysteresis margin to change, and changes back when the straggler is gone", () => {
    // Backup workers predicted ~1.13x faster: not enough for the default 1.2x margin.
    const mild = [0, 1, 2, 3].map((r) => steps(10, () => (r === 1 ? 33 : 20)))
    expect(chooseStrategy({ computeMs: mild, allReduceMs: 1, numServers: 1 }, "allreduce").pick).toBe("allreduce")
    expect(chooseStrategy({ computeMs: mild, allReduceMs: 1, numServers: 1 }, "allreduce", 1).pick).toBe("backup")
    const even = [0, 1, 2].map(() => steps(10, () => 20))
    const back = chooseStrategy({ computeMs: even, allReduceMs: 1, numServers: 1 }, "backup")
    expect(back.pick).toBe("allreduce")
    expect(back.changed).toBe(true)
  })

  it("offers backup workers only from 3 ranks, and nothing but the all-reduce for one", () => {
    expect(predictStrategies({ computeMs: [[10], [30]], allReduceMs: 1, numServers: 1 }).map((x) => x.name)).toEqual(["allreduce", "ssp"])
    expect(predictStrategies({ computeMs: [[10]], allReduceMs: 1, numServers: 1 }).map((x) => x.name)).toEqual(["allreduce"])
  })
})

describe("strategy choice, calibrated", () => {
  it("prices the servers by their measured push-pull once it has one: a slow one sends training back", () => {
    const c = [0, 1, 2, 3].map((r) => steps(10, () => (r === 1 ? 60 : 20)))
    expect(chooseStrategy({ computeMs: c, allReduceMs: 2, numServers: 1 }, "backup").pick).toBe("backup")
    const slowServers = chooseStrategy({ computeMs: c, allReduceMs: 2, numServers: 1, pushPullMs: 80 }, "backup")
    expect(slowServers.pick).toBe("allreduce")
    expect(slowServers.predictions.find((x) => x.name === "backup")!.why).toMatch(/push-pull 80\.0 ms/)
  })
})
