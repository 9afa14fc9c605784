// Algorithm "auto" times every candidate again when the calls move away from what they took after
// tuning (a link slowed, the cores got busier): two ranks of AutoGradientReducer over one real
// nats-server in this process, whose call timings are fed from the test (the reducer's noteCall)
// so the drift is exactly the one the test makes; the collectives themselves run for real.
import { describe, expect, it } from "vitest"
import { measurementsCover, measurementsHandedOn, measurementsServe, observedNodes } from "../actors/train/common/train-protocol.ts"
import { AutoGradientReducer, CONFIRM_AT_CALL, DRIFT_CHECK_EVERY, DRIFT_WINDOW, REUSED_DRIFT_SKIP, picksFor, rememberShape, type KnownPicks } from "../actors/train/worker/auto-config.ts"
import { DriftMonitor } from "../scheduler/algorithm-tuner.ts"
import type { Explanation } from "../scheduler/algorithm-choice.ts"
import { natsFixtures } from "./support/nats.ts"
import { autoOptions, reducerCalls, twoRankGroups } from "./support/reducer-calls.ts"

const nats = natsFixtures()

/** The reducer with its calls' times set by the test instead of measured. */
class Timed extends AutoGradientReducer {
  callMs = 1
  protected override noteCall(bytes: number, algorithm: string, _ms: number): void {
    super.noteCall(bytes, algorithm, this.callMs)
  }
}

/** The reducer with each call's time set from its algorithm (hierarchical the fastest), its routes recorded. */
class Recorded extends AutoGradientReducer {
  readonly routes: string[] = []
  /** Every call's time is multiplied by this (a cold process's first calls). */
  slow = 1
  /** The route that takes 0.5 ms (the others 2 ms). */
  fast = "hierarchical"
  protected override noteCall(bytes: number, route: string, _ms: number): void {
    this.routes.push(route)
    super.noteCall(bytes, route, (route === this.fast ? 0.5 : 2) * this.slow)
  }
}

/** A group of two Recorded reducers (hierarchical the fastest), `known` what it is handed; rank 0's decisions and explanations kept. */
const recordedGroup = async (groups: Awaited<ReturnType<typeof twoRankGroups>>, job: string, name: string, known?: KnownPicks) => {
  const comms = await groups(job, name)
  const tuned: KnownPicks[] = []
  const summaries: string[] = []
  const texts: string[] = []
  const reducers = comms.map(
    (comm, rank) =>
      new Recorded(comm, {
        ...autoOptions(["n0", "n0"]),
        ...(known ? { known } : {}),
        ...(rank === 0
          ? {
              onTuned: (k: KnownPicks) => void tuned.push(k),
              onExplain: (e: Explanation, summary: string) => {
                texts.push(e.text)
                summaries.push(summary)
              }
            }
          : {})
      })
  )
  return { comms, reducers, tuned, summaries, texts, calls: reducerCalls(reducers) }
}

describe("DriftMonitor", () => {
  it("says a size moved only after `confirm` windows in a row off its first window's median, either way", () => {
    const m = new DriftMonitor(4, 2, 2)
    const feed = (bytes: number, ms: number, n: number) => {
      for (let i = 0; i < n; i++) m.record(bytes, ms)
    }
    feed(4096, 1, 4) // baseline 1 ms
    feed(4096, 1.9, 8) // within 2x: no strike
    expect(m.drifted()).toEqual([])
    feed(4096, 3, 4) // one window off
    expect(m.drifted()).toEqual([])
    feed(4096, 1, 4) // back: the strikes start again
    feed(4096, 3, 4)
    expect(m.drifted()).toEqual([])
    feed(4096, 3, 4)
    expect(m.drifted()).toEqual(["4.0 KiB 1.00 -> 3.00 ms"])
    m.reset()
    feed(1 << 20, 4, 4)
    feed(1 << 20, 1, 8) // faster counts too
    expect(m.drifted()).toEqual(["1.0 MiB 4.00 -> 1.00 ms"])
    // reset(skip): each size's next `skip` calls are left out before its first window
    m.reset(4)
    feed(4096, 10, 4) // left out
    feed(4096, 1, 4) // the baseline
    feed(4096, 1, 8)
    expect(m.drifted()).toEqual([])
    expect(() => new DriftMonitor(0)).toThrow(/window/)
    expect(() => new DriftMonitor(4, 1)).toThrow(/factor/)
  })
})

describe("AutoGradientReducer", () => {
  it("times every algorithm again once a rank's calls moved for two windows, agreed by every rank, and not again while they hold", async () => {
    const comms = await (await twoRankGroups(nats))("retune", "g")
    const explained: string[][] = [[], []]
    const reducers = comms.map(
      (comm, rank) =>
        new Timed(comm, {
          ...autoOptions(["n0", "n0"]),
          onExplain: (e: Explanation) => void explained[rank]!.push(e.text)
        })
    )
    // every call checks both ranks got the mean of their buffers
    const calls = reducerCalls(reducers)
    try {
      // Tuning (every algorithm 5 times), once more from call CONFIRM_AT_CALL on (warm processes),
      // and then checks with steady calls: no tuning for moved calls.
      await calls(40 + 3 * DRIFT_CHECK_EVERY)
      expect(reducers.map((r) => r.retuned.times)).toEqual([0, 0])
      const firstTuned = explained[0]!.filter((t) => t.includes("measured pick")).length
      expect(firstTuned).toBe(2)
      expect(explained[0]!.at(-1)).toMatch(/measured from the group's call 200 on, once its processes were warm/)
      // Rank 1's calls take 10x as long from now on: two windows, then the next check.
      reducers[1]!.callMs = 10
      await calls(2 * DRIFT_WINDOW + DRIFT_CHECK_EVERY + 40)
      expect(reducers.map((r) => r.retuned.times)).toEqual([1, 1])
      expect(reducers[1]!.retuned.why).toMatch(/^rank 1's calls moved: 4\.0 KiB 1\.00 -> 10\.00 ms$/)
      expect(reducers[0]!.retuned.why).toBe("another rank's calls moved")
      // The new tuning is explained, saying why it was made.
      expect(explained[0]!.filter((t) => t.includes("measured pick")).length).toBe(3)
      expect(explained[0]!.at(-1)).toMatch(/timed again \(1 time since the first; the last because another rank's calls moved/)
      // Steady at the new level: measured once, not again.
      await calls(3 * DRIFT_CHECK_EVERY)
      expect(reducers.map((r) => r.retuned.times)).toEqual([1, 1])
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  }, 120_000)
})

describe("AutoGradientReducer, a regroup into a shape measured before", () => {
  it("takes the earlier group's picks without timing anything, unless its candidates differ", async () => {
    const groups = await twoRankGroups(nats)
    const group = (name: string, known?: KnownPicks) => recordedGroup(groups, "reuse", name, known)
    const first = await group("g1")
    try {
      // hierarchical measured fastest (the cost model picks tree or ring here): the first group times every algorithm
      await first.calls(1 + 3 * 5 + 1)
      expect(first.tuned).toHaveLength(1)
      expect(first.tuned[0]!.sizes.map((s) => s.picked)).toEqual(["hierarchical"])
      expect(first.summaries.at(-1)).toMatch(/hierarchical \(measured\)/)
    } finally {
      await Promise.all(first.comms.map((c) => c.close()))
    }
    expect(first.tuned[0]!.confirmed).toBe(false)
    // The regroup hands the same picks to every member: no call is timed, the pick runs from the
    // first call (picks measured on warm processes: not measured again at CONFIRM_AT_CALL either).
    const second = await group("g2", { ...first.tuned[0]!, confirmed: true })
    try {
      // The first 100 calls 3x slower (a replacement that just joined is cold), then steady: the
      // cold calls are not the baseline, so the steady ones are not taken for a move (a window of
      // 50 calls 2x off, twice in a row, would be measured again at the check of call 200).
      for (const r of second.reducers) r.slow = 3
      await second.calls(REUSED_DRIFT_SKIP)
      for (const r of second.reducers) r.slow = 1
      await second.calls(3 * DRIFT_CHECK_EVERY)
      expect(new Set(second.reducers[0]!.routes)).toEqual(new Set(["hierarchical"]))
      expect(second.tuned).toHaveLength(0)
      expect(second.reducers.map((r) => r.retuned.times)).toEqual([0, 0])
      expect(second.summaries[0]).toMatch(/hierarchical \(measured by an earlier group of this shape\)/)
      expect(second.texts[0]).toMatch(/measured by an earlier group of the same shape, each rank on the same node, from its call 200 on, once its processes were warm, and reused at this regroup/)
    } finally {
      await Promise.all(second.comms.map((c) => c.close()))
    }
    // Picks made among other candidates are not taken: every algorithm is timed again.
    const third = await group("g3", { ...first.tuned[0]!, candidates: ["ring", "tree"] })
    try {
      await third.calls(1 + 3 * 5 + 1)
      expect(new Set(third.reducers[0]!.routes)).toEqual(new Set(["ring", "tree", "hierarchical"]))
      expect(third.tuned).toHaveLength(1)
    } finally {
      await Promise.all(third.comms.map((c) => c.close()))
    }
    // Picks measured on a group's first calls are taken, then measured once more at CONFIRM_AT_CALL.
    const fourth = await group("g4", first.tuned[0]!)
    try {
      await fourth.calls(CONFIRM_AT_CALL + 1)
      expect(new Set(fourth.reducers[0]!.routes)).toEqual(new Set(["hierarchical"]))
      expect(fourth.texts[0]).toMatch(/on its first calls \(measured once more from this group's call 200 on\), and reused at this regroup/)
      await fourth.calls(3 * 5 + 1)
      expect(new Set(fourth.reducers[0]!.routes.slice(CONFIRM_AT_CALL + 1))).toEqual(new Set(["ring", "tree", "hierarchical"]))
      expect(fourth.tuned.map((k) => k.confirmed)).toEqual([true])
    } finally {
      await Promise.all(fourth.comms.map((c) => c.close()))
    }
  }, 120_000)

  it("measures once more from call CONFIRM_AT_CALL on, and that decision stands: the first calls ran on processes still warming up", async () => {
    const { comms, reducers, tuned, summaries, calls } = await recordedGroup(await twoRankGroups(nats), "confirm", "g")
    try {
      // cold: ring measures fastest
      for (const r of reducers) r.fast = "ring"
      await calls(1 + 3 * 5 + 1)
      expect(tuned.map((k) => [k.sizes[0]!.picked, k.confirmed])).toEqual([["ring", false]])
      // warm: hierarchical is the fastest; the measurement from call 200 on finds it
      for (const r of reducers) r.fast = "hierarchical"
      await calls(CONFIRM_AT_CALL - 17)
      expect(reducers[0]!.routes.at(-1)).toBe("ring")
      await calls(1 + 3 * 5 + 1)
      expect(tuned.map((k) => [k.sizes[0]!.picked, k.confirmed])).toEqual([
        ["ring", false],
        ["hierarchical", true]
      ])
      expect(reducers[0]!.routes.at(-1)).toBe("hierarchical")
      expect(summaries.at(-1)).toMatch(/hierarchical \(measured\)/)
      // not measured again after that while the calls hold
      await calls(2 * CONFIRM_AT_CALL)
      expect(tuned).toHaveLength(2)
      expect(reducers.map((r) => r.retuned.times)).toEqual([0, 0])
    } finally {
      await Promise.all(comms.map((c) => c.close()))
    }
  }, 120_000)
})

describe("rememberShape and picksFor", () => {
  it("keeps one entry per node layout, the newest first, at most four", () => {
    const shape = (nodes: string[], picked: string) => ({ nodes, candidates: ["ring", "tree"], confirmed: true, sizes: [{ bytes: 4096, candidates: ["ring", "tree"], ms: [1, 2], picked, modelPick: "ring" }] })
    let kept = rememberShape(undefined, shape(["a", "a"], "ring"))
    kept = rememberShape(kept, shape(["a", "a", "a"], "tree"))
    kept = rememberShape(kept, shape(["a", "a"], "tree"))
    expect(kept.map((k) => [k.nodes.length, k.sizes[0]!.picked])).toEqual([
      [2, "tree"],
      [3, "tree"]
    ])
    for (const nodes of [["b"], ["c"], ["d"], ["e"]]) kept = rememberShape(kept, shape(nodes, "ring"))
    expect(kept.map((k) => k.nodes.join(","))).toEqual(["e", "d", "c", "b"])
    // a regroup looks its shape up among them
    expect(picksFor(kept, ["d"])?.nodes).toEqual(["d"])
    expect(picksFor(kept, ["a", "a"])).toBeUndefined()
    expect(picksFor(undefined, ["d"])).toBeUndefined()
  })

  it("takes a shape of the same nodes with its ranks renumbered as unconfirmed picks, measured again at CONFIRM_AT_CALL", () => {
    const shape = (nodes: string[], picked: string) => ({ nodes, candidates: ["ring", "tree"], confirmed: true, sizes: [{ bytes: 4096, candidates: ["ring", "tree"], ms: [1, 2], picked, modelPick: "ring" }] })
    const kept = rememberShape(rememberShape(undefined, shape(["n0", "n1", "n2"], "tree")), shape(["n0", "n2"], "ring"))
    // a group that lost rank 1 and grew back: the replacement on n1 comes after the survivors
    const renumbered = picksFor(kept, ["n0", "n2", "n1"])
    expect(renumbered).toMatchObject({ nodes: ["n0", "n2", "n1"], confirmed: false, sizes: [{ picked: "tree" }] })
    // the exact order is taken as it was measured, confirmed
    expect(picksFor(kept, ["n0", "n1", "n2"])).toMatchObject({ nodes: ["n0", "n1", "n2"], confirmed: true })
    expect(picksFor(kept, ["n2", "n0"])).toMatchObject({ confirmed: false, sizes: [{ picked: "ring" }] })
    // as many ranks on them in other numbers are another shape
    expect(picksFor(kept, ["n0", "n0", "n2"])).toBeUndefined()
    expect(picksFor(kept, ["n0", "n1", "n2", "n2"])).toBeUndefined()
    // what was kept is not changed
    expect(kept.map((k) => k.confirmed)).toEqual([true, true])
  })

  it("takes a shape laid out alike on other nodes (a spare on a node no group ran on) as unconfirmed picks", () => {
    const shape = (nodes: string[], picked: string) => ({ nodes, candidates: ["ring", "tree"], confirmed: true, sizes: [{ bytes: 4096, candidates: ["ring", "tree"], ms: [1, 2], picked, modelPick: "ring" }] })
    const kept = rememberShape(rememberShape(undefined, shape(["n0", "n1", "n2"], "tree")), shape(["a", "a", "b", "b"], "ring"))
    // rank 1's node lost, a spare on n3 in its place
    expect(picksFor(kept, ["n0", "n2", "n3"])).toMatchObject({ nodes: ["n0", "n2", "n3"], confirmed: false, sizes: [{ picked: "tree" }] })
    // two ranks on each of two nodes, on other nodes
    expect(picksFor(kept, ["c", "c", "d", "d"])).toMatchObject({ nodes: ["c", "c", "d", "d"], confirmed: false, sizes: [{ picked: "ring" }] })
    // the same nodes renumbered come first: an exact or renumbered shape is preferred to a relabelled one
    expect(picksFor(kept, ["n2", "n1", "n0"])).toMatchObject({ confirmed: false, sizes: [{ picked: "tree" }] })
    // four ranks laid out otherwise (ranks 0 and 2 sharing a node) are another shape
    expect(picksFor(kept, ["c", "d", "c", "d"])).toBeUndefined()
    expect(picksFor(kept, ["c", "c", "c", "d"])).toBeUndefined()
    expect(picksFor(kept, ["n0", "n1"])).toBeUndefined()
    expect(kept.map((k) => k.confirmed)).toEqual([true, true])
  })
})

describe("link measurements handed on at regroups", () => {
  const observed = { topology: [], note: "probed by the group of a, b, c" }
  it("a group that reused them keeps every node they cover, so the group that grows back reuses them too", () => {
    // the first group measured its links for itself
    const first = measurementsHandedOn(undefined, ["a", "b", "c"], 4096, undefined)
    const full = { ...first, observed }
    expect(full.nodes).toEqual(["a", "b", "c"])
    // b is lost: the survivors on a and c reuse them, and still cover b
    expect(measurementsCover(full, ["a", "c"])).toBe(true)
    const short = measurementsHandedOn(full, ["a", "c"], 4096, undefined)
    expect(short).toMatchObject({ nodes: ["a", "b", "c"], minBytes: 4096, observed })
    // the replacement on b joins after the survivors
    expect(measurementsCover(short, ["a", "c", "b"])).toBe(true)
    // down to one rank, which measures nothing: handed on as given
    const one = measurementsHandedOn(short, ["c"], 4096, undefined)
    expect(one).toMatchObject({ nodes: ["a", "b", "c"], observed })
    expect(measurementsCover(one, ["c", "a", "b"])).toBe(true)
    // a node none of them measured is not covered
    expect(measurementsCover(one, ["a", "d"])).toBe(false)
    expect(measurementsCover(undefined, ["a"])).toBe(false)
  })

  it("a regroup onto a node no group measured reuses them when they were taken across nodes and cover most of the group", () => {
    const across = { topology: [{ nodeId: "a", server: 0 }, { nodeId: "b", server: 0 }, { nodeId: "c", server: 0 }] }
    const m = { nodes: ["a", "b", "c"], minBytes: 4096, observed: across }
    expect(observedNodes(across)).toEqual(new Set(["a", "b", "c"]))
    // a spare on d takes b's place: a and c measured, d priced by its link class
    expect(measurementsCover(m, ["a", "c", "d"])).toBe(false)
    expect(measurementsServe(m, ["a", "c", "d"])).toBe(true)
    // handed on, they serve d from then on
    expect(measurementsServe(measurementsHandedOn(m, ["a", "c", "d"], 4096, undefined), ["c", "d", "b"])).toBe(true)
    // as many new nodes as measured ones: measured again
    expect(measurementsServe(m, ["a", "d", "e", "e"])).toBe(false)
    expect(measurementsServe(m, ["d", "e"])).toBe(false)
    // an observation taken on one node measured no link between nodes: a new node is measured
    const oneNode = { nodes: ["a"], minBytes: 4096, observed: { topology: [{ nodeId: "a", server: 0 }, { nodeId: "a", server: 0 }] } }
    expect(measurementsServe(oneNode, ["a", "a", "b"])).toBe(false)
    // without an observation (a group that had not probed yet) only full cover serves
    expect(measurementsServe({ nodes: ["a", "b", "c"], minBytes: 4096 }, ["a", "b", "d"])).toBe(false)
    expect(measurementsServe({ nodes: ["a", "b", "c"], minBytes: 4096 }, ["a", "b"])).toBe(true)
    expect(measurementsServe(undefined, ["a"])).toBe(false)
    expect(observedNodes(undefined).size).toBe(0)
    expect(observedNodes({ topology: "x" }).size).toBe(0)
  })

  it("a group that measured for itself covers its own nodes only, and keeps the picks it was given", () => {
    const tuned = [{ nodes: ["a", "b"], candidates: ["ring", "tree"], confirmed: true, sizes: [] }]
    const own = measurementsHandedOn({ nodes: ["a", "b", "c"], minBytes: 4096 }, ["a", "b"], 8192, tuned)
    expect(own).toEqual({ nodes: ["a", "b"], minBytes: 8192, tuned })
    expect(measurementsCover(own, ["a", "b", "c"])).toBe(false)
    expect(measurementsHandedOn(undefined, ["a", "a"], undefined, undefined)).toEqual({ nodes: ["a"] })
  })
})

