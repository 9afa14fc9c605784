// Transport "auto" decided on training's own calls: the threshold a group measures at its start
// (Communicator.measureTransport) runs on cold processes, and on a loaded machine it can put a
// 19 KiB bucket on NATS although the direct links carry it two to four times faster once warm. With
// transport "auto" and a direct link between every two ranks, algorithm "auto"'s tuner times every
// algorithm over both paths (below PATH_TUNE_MAX_BYTES, 4 MiB), and the calls then take the measured
// fastest route. Two ranks of AutoGradientReducer over one real nats-server and real direct links
// in this process; the calls' timings are fed from the test (noteCall), so the faster path is the
// one the test says, and the assertions read which path the later calls really took (the direct
// links' byte counters).
import * as crypto from "node:crypto"
import { describe, expect, it } from "vitest"
import { AutoGradientReducer, TUNE_ROUNDS } from "../actors/train/worker/auto-config.ts"
import { AlgorithmTuner } from "../scheduler/algorithm-tuner.ts"
import type { Explanation } from "../scheduler/algorithm-choice.ts"
import { natsFixtures } from "./support/nats.ts"
import { autoOptions, reducerCalls, twoRankGroups } from "./support/reducer-calls.ts"

const nats = natsFixtures()
const MiB = 1024 * 1024

/** The reducer with each call's time set by the test from its route's name ("tree/nats", ...). */
class Timed extends AutoGradientReducer {
  msOf: (route: string) => number = () => 1
  readonly routes: string[] = []
  protected override noteCall(bytes: number, route: string, _ms: number): void {
    this.routes.push(route)
    super.noteCall(bytes, route, this.msOf(route))
  }
}

describe("AlgorithmTuner with candidates per size", () => {
  it("times a size only with the candidates timedOn gives it, lays the table out by them, and picks among them", () => {
    const names = ["ring/direct", "ring/nats", "tree/direct", "tree/nats"]
    const t = new AlgorithmTuner(names, 2, 1.1, (bytes) => (bytes < MiB ? names : names.filter((n) => n.endsWith("/direct"))))
    expect(Array.from({ length: 4 }, () => t.next(4096))).toEqual(names)
    // a large size cycles through its two candidates
    expect(Array.from({ length: 4 }, () => t.next(8 * MiB))).toEqual(["ring/direct", "tree/direct", "ring/direct", "tree/direct"])
    const ms: Record<string, number> = { "ring/direct": 3, "ring/nats": 2, "tree/direct": 1, "tree/nats": 5 }
    for (let k = 0; k < 2; k++) for (const n of names) t.record(4096, n, ms[n]!)
    expect(t.sizes).toEqual([4096]) // 8 MiB not timed yet
    for (let k = 0; k < 2; k++) {
      t.record(8 * MiB, "ring/direct", 10)
      t.record(8 * MiB, "tree/direct", 20)
    }
    // a call of a candidate the size is not timed with does not count
    t.record(8 * MiB, "ring/nats", 0.1)
    expect(t.sizes).toEqual([4096, 8 * MiB])
    const table = t.table()
    expect(table.length).toBe(4 * 2 + 2 * 2)
    const d = t.decide(table, (b) => (b < MiB ? "ring/direct" : "tree/direct"))
    expect(d.map((x) => [x.bytes, x.candidates, x.picked])).toEqual([
      [4096, names, "tree/direct"],
      [8 * MiB, ["ring/direct", "tree/direct"], "ring/direct"]
    ])
    expect(d[1]!.ms).toEqual([10, 20])
    expect(() => t.decide(new Float32Array(16), () => "ring/direct")).toThrow(/expected 12/)
  })
})

describe("AutoGradientReducer with transport auto", () => {
  const group = async (job: string, transport: "auto" | "direct", algorithm = "auto") => {
    const secret = crypto.randomBytes(32)
    const comms = await (await twoRankGroups(nats))(job, "g", (rank) => ({ node: `n${rank}`, direct: { transport, secret } }))
    const explained: string[] = []
    const reducers = comms.map(
      (comm, rank) =>
        new Timed(comm, {
          ...autoOptions(["n0", "n1"]),
          algorithm,
          ...(rank === 0 ? { onExplain: (e: Explanation) => void explained.push(e.text) } : {})
        })
    )
    const calls = reducerCalls(reducers)
    const directBytes = (): number => comms.reduce((s, c) => s + c.transport.bytesSent, 0)
    return { comms, reducers, explained, calls, directBytes, close: () => Promise.all(comms.map((c) => c.close())) }
  }

  for (const faster of ["nats", "direct"] as const) {
    it(`times every algorithm over both paths and sends the later calls over the faster one (${faster})`, async () => {
      const g = await group(`paths-${faster}`, "auto")
      try {
        expect(g.comms.every((c) => c.wholeDirect)).toBe(true)
        expect(g.reducers.every((r) => r.tunesPaths)).toBe(true)
        for (const r of g.reducers) r.msOf = (route) => (route.endsWith(`/${faster}`) ? 1 : 4)
        // warm-up call, then 3 algorithms x 2 paths x TUNE_ROUNDS tuning calls, then the decision
        await g.calls(2 + 6 * TUNE_ROUNDS)
        const tuned = g.reducers[0]!.routes.slice(1, 1 + 6 * TUNE_ROUNDS)
        expect(new Set(tuned)).toEqual(new Set(["ring", "tree", "hierarchical"].flatMap((a) => [`${a}/direct`, `${a}/nats`])))
        const last = g.explained.at(-1)!
        expect(last).toMatch(/measured pick \(each algorithm timed 5 times per bucket size, over the direct links and, below 4\.0 MiB, over NATS/)
        const picked = /4\.0 KiB: .* -> (\S+)/.exec(last)?.[1]
        expect(picked).toMatch(new RegExp(`/${faster}$`))
        // Every later call takes the picked route, and really goes that way.
        const before = g.directBytes()
        const seen = g.reducers[0]!.routes.length
        await g.calls(10)
        expect(new Set(g.reducers[0]!.routes.slice(seen))).toEqual(new Set([picked]))
        if (faster === "nats") expect(g.directBytes()).toBe(before)
        else expect(g.directBytes()).toBeGreaterThan(before + 2 * 10 * 4096 * 0.5)
      } finally {
        await g.close()
      }
    }, 60_000)
  }

  it("with a configured algorithm, times only its two paths", async () => {
    const g = await group("paths-ring", "auto", "ring")
    try {
      for (const r of g.reducers) r.msOf = (route) => (route === "ring/nats" ? 1 : 4)
      await g.calls(2 + 2 * TUNE_ROUNDS)
      // the group's first call takes the communicator's path for its size; then both paths are timed
      expect(new Set(g.reducers[0]!.routes.slice(1))).toEqual(new Set(["ring/direct", "ring/nats"]))
      expect(g.explained.at(-1)).toMatch(/the configured algorithm taken over the direct links/)
      expect(g.explained.at(-1)).toMatch(/-> ring\/nats \(the start-up pick was ring\/direct: 4\.00x the fastest\)/)
    } finally {
      await g.close()
    }
  }, 60_000)

  it("times only the algorithms when the transport is fixed", async () => {
    const g = await group("paths-fixed", "direct")
    try {
      expect(g.reducers.every((r) => !r.tunesPaths)).toBe(true)
      await g.calls(2 + 3 * TUNE_ROUNDS)
      expect(new Set(g.reducers[0]!.routes)).toEqual(new Set(["ring", "tree", "hierarchical"]))
      expect(g.explained.at(-1)).toMatch(/measured pick \(each algorithm timed 5 times per bucket size on training's own calls/)
    } finally {
      await g.close()
    }
  }, 60_000)
})
