// The chaos bench's per-fault cost (bench/chaos-cost.ts): a synthetic pair of runs whose chaos run
// is 5% slower throughout (the machine's drift) and stalls at two faults; the costs come out as the
// stalls, the drift as its rate, and goodput without the drift from the stalls alone.
import { describe, expect, it } from "vitest"
import { faultCosts, faultPhases, growStalls, joinCpu, ownPaceCosts } from "../bench/chaos-cost.ts"

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

describe("ownPaceCosts", () => {
  it("gives each fault's stall against the chaos run's own pace, whatever its fault-free partner did", () => {
    // 50 ms epochs, 80 ms in the run's first 2 s (a fresh process), stalls of 0.8 s and 1.2 s.
    const chaos = run(600, 50, [
      [5_000, 800],
      [15_000, 1_200]
    ]).map((t, e) => t + 30 * Math.min(e + 1, 25))
    const r = ownPaceCosts(chaos, [5_000, 15_000])
    expect(r.costs[0]).toBeCloseTo(0.8, 2)
    expect(r.costs[1]).toBeCloseTo(1.2, 2)
    expect(r.goodput).toBeCloseTo((chaos.at(-1)! - 2_000) / chaos.at(-1)!, 3)
    // A faster stretch after a fault (a short-handed group on shared cores) is a negative cost, and
    // goodput counts it as none.
    const faster = run(600, 50).map((t, e) => (e >= 100 && e < 140 ? t - 10 * (e - 99) : e >= 140 ? t - 400 : t))
    const f = ownPaceCosts(faster, [5_000])
    expect(f.costs[0]).toBeLessThan(-0.3)
    expect(f.goodput).toBe(1)
    // A fault past the last epoch, or with no clear epoch near it, has no cost to tell.
    expect(ownPaceCosts(chaos, [5_000, 60_000]).costs[1]).toBeUndefined()
    expect(ownPaceCosts(run(100, 50), [1_000], 5_000).costs[0]).toBeUndefined()
  })
})

describe("faultPhases", () => {
  it("splits a fault's cost at the resume, the group being whole again and half a second after", () => {
    // Every epoch 50 ms; the chaos run stalls 600 ms at 10 s (resumes at 10.6 s), runs short-handed
    // at 80% speed to 11.5 s, at 50% for the half second after the join, at 90% for the next 2 s.
    const free = Array.from({ length: 800 }, (_, e) => 50 * (e + 1))
    const speedAt = (t: number): number => (t < 10_000 ? 1 : t < 10_600 ? 0 : t < 11_500 ? 0.8 : t < 12_000 ? 0.5 : t < 14_000 ? 0.9 : 1)
    const chaos: number[] = []
    let t = 0
    let work = 0
    for (let e = 0; e < 800; e++) {
      while (work < 50 * (e + 1)) {
        work += speedAt(t)
        t += 1
      }
      chaos.push(t)
    }
    const drift = faultCosts(free, chaos, [10_000]).drift
    expect(Math.abs(drift)).toBeLessThan(1e-3)
    const [p] = faultPhases(free, chaos, [{ at: 10_000, resumeAt: 10_600, wholeAt: 11_500 }], drift)
    expect(p).toBeDefined()
    // lag gained: 0.6 s stalled; 0.9 s at 80%: 0.18 s; 0.5 s at 50%: 0.25 s; 2 s at 90%: 0.2 s (to 5 s after the fault)
    expect(p!.stall).toBeCloseTo(0.6, 1)
    expect(p!.shortHanded).toBeCloseTo(0.18, 1)
    expect(p!.join).toBeCloseTo(0.25, 1)
    expect(p!.after).toBeCloseTo(0.2, 1)
    // the phases add up to the fault's cost
    const cost = faultCosts(free, chaos, [10_000]).costs[0]!
    expect(p!.stall + p!.shortHanded + p!.join + p!.after).toBeCloseTo(cost, 2)
    // never short-handed (a nats-server restart): nothing between the resume and the join
    const [q] = faultPhases(free, chaos, [{ at: 10_000, resumeAt: 10_600 }], drift)
    expect(q!.shortHanded).toBe(0)
    // no resume: nothing to split
    expect(faultPhases(free, chaos, [{ at: 10_000 }], drift)[0]).toBeUndefined()
  })
})

describe("growStalls", () => {
  it("gives the epoch a grow came in its time past the median epoch", () => {
    // 50 ms epochs; a 600 ms stall at the first epoch at or past 2 s, 300 ms at 4 s
    const chaos = run(200, 50, [
      [2_000, 600],
      [4_000, 300]
    ])
    const stalls = growStalls(chaos, [1_990, 4_030, 60_000])
    expect(stalls[0]).toBeCloseTo(0.6, 3)
    expect(stalls[1]).toBeCloseTo(0.3, 3)
    // past the last report: no epoch to say
    expect(stalls[2]).toBeUndefined()
    // a grow in a steady stretch costs nothing
    expect(growStalls(chaos, [7_000])[0]).toBeCloseTo(0, 3)
    expect(growStalls([], [100])).toEqual([undefined])
  })
})

describe("joinCpu", () => {
  /** Cumulative CPU samples every 250 ms from `from` to `to` (ms) of a process using `cores(t)`. */
  const samples = (from: number, to: number, cores: (t: number) => number): Array<readonly [number, number]> => {
    const out: Array<readonly [number, number]> = []
    let used = 0
    for (let t = from; t <= to; t += 250) {
      out.push([t, used])
      used += 250 * cores(t)
    }
    return out
  }

  it("compares a joiner's CPU over its first seconds with the survivors', leaving out the dead and the attempts nobody joined", () => {
    // Attempt 0 from t=0: pids 1, 2, 3. Pid 3 dies at 10 s; attempt 1 (pid 4 joined) steps from
    // 10.5 s; attempt 2 (a regroup nobody joined) from 30 s.
    const cpu = new Map([
      [1, samples(0, 40_000, () => 0.3)],
      [2, samples(0, 40_000, (t) => (t < 12_000 ? 0.3 : 0.2))],
      [3, samples(0, 10_000, () => 0.3)],
      [4, samples(9_000, 40_000, (t) => (t < 15_500 ? 0.45 : 0.3))]
    ])
    const first = new Map([
      [1, 0],
      [2, 0],
      [3, 0],
      [4, 1]
    ])
    const starts = new Map([
      [0, 0],
      [1, 10_500],
      [2, 30_000]
    ])
    const r = joinCpu(cpu, first, starts)
    expect(r.map((j) => j.attempt)).toEqual([1])
    expect(r[0]!.seconds).toBe(5)
    expect(r[0]!.joiner).toBeCloseTo(0.45, 2)
    // Pid 2 used 0.3 for 1.5 s and 0.2 for 3.5 s of the window; pid 1 0.3 throughout.
    expect(r[0]!.survivors).toBeCloseTo((0.3 + (0.3 * 1.5 + 0.2 * 3.5) / 5) / 2, 2)
  })

  it("cuts the window at the next attempt and skips a join whose samples do not span it", () => {
    const cpu = new Map([
      [1, samples(0, 20_000, () => 0.3)],
      [2, samples(4_000, 20_000, () => 0.4)],
      [3, samples(10_000, 11_000, () => 0.4)]
    ])
    const first = new Map([
      [1, 0],
      [2, 1],
      [3, 2]
    ])
    // Attempt 1 (pid 2 joined) from 5 s, attempt 2 (pid 3, gone at 11 s) from 7 s.
    const r = joinCpu(cpu, first, new Map([[0, 0], [1, 5_000], [2, 7_000]]))
    expect(r).toHaveLength(1)
    expect(r[0]!.attempt).toBe(1)
    expect(r[0]!.seconds).toBe(2)
    expect(r[0]!.joiner).toBeCloseTo(0.4, 2)
    expect(r[0]!.survivors).toBeCloseTo(0.3, 2)
    expect(r[0]!.joinerMain).toBeUndefined()
  })

  it("splits off the main threads' share where their samples span the window, and not where one's are missing", () => {
    // The joiner (pid 3) uses 0.45 of a core, 0.25 of it on its main thread (the rest its compiler); the survivors 0.3, 0.25 of it main.
    const cpu = new Map([
      [1, samples(0, 20_000, () => 0.3)],
      [2, samples(0, 20_000, () => 0.3)],
      [3, samples(4_000, 20_000, () => 0.45)]
    ])
    const main = new Map([
      [1, samples(0, 20_000, () => 0.25)],
      [2, samples(0, 20_000, () => 0.25)],
      [3, samples(4_000, 20_000, () => 0.25)]
    ])
    const first = new Map([
      [1, 0],
      [2, 0],
      [3, 1]
    ])
    const starts = new Map([
      [0, 0],
      [1, 5_000]
    ])
    const [j] = joinCpu(cpu, first, starts, 5_000, main)
    expect(j!.joiner).toBeCloseTo(0.45, 2)
    expect(j!.joinerMain).toBeCloseTo(0.25, 2)
    expect(j!.survivorsMain).toBeCloseTo(0.25, 2)
    expect(j!.joiner - j!.joinerMain!).toBeCloseTo(0.2, 2)
    // A survivor without main-thread samples: no split (the two means would cover different processes).
    main.delete(2)
    const [k] = joinCpu(cpu, first, starts, 5_000, main)
    expect(k!.joiner).toBeCloseTo(0.45, 2)
    expect(k!.joinerMain).toBeUndefined()
    expect(k!.survivorsMain).toBeUndefined()
  })
})
