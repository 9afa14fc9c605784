// The cost model's direct links (calls priced on the path they take) and the tuner that picks
// each size's algorithm from timed calls. Pure logic: no processes.
import { describe, expect, it } from "vitest"
import * as fc from "fast-check"
import * as Result from "effect/Result"
import {
  defaultCostModel,
  fitDirectLinks,
  fitDirectPairs,
  pathOf,
  predictAllGather,
  predictAllReduce,
  stageCost,
  type CostModel,
  type Topology
} from "../scheduler/cost-model.ts"
import { AlgorithmTuner } from "../scheduler/algorithm-tuner.ts"
import { chooseAlgorithm, type Explanation } from "../scheduler/algorithm-choice.ts"
import { withTuned } from "../actors/train/worker/auto-config.ts"
import { allReduceAlgorithms, findAllReduceAlgorithm } from "../collectives/algorithms/index.ts"
import { pairProbeRounds } from "../collectives/communicator.ts"
import { describeObservation, type ObservedTopology } from "../scheduler/topology.ts"

const KiB = 1024
const MiB = 1024 * KiB
const algo = (name: string) => findAllReduceAlgorithm(name)!
const uniform = (p: number): Topology => Array.from({ length: p }, () => ({ nodeId: "n", server: "s" }))
const link = (alphaMs: number, betaMsPerByte: number) => ({ alphaMs, betaMsPerByte })
const withDirect = (alpha: number, beta: number, minBytes: number, base: CostModel = defaultCostModel()): CostModel => ({
  ...base,
  direct: { links: { "same-node": link(alpha, beta), "same-server": link(alpha, beta), "cross-server": link(alpha, beta) }, minBytes }
})

describe("the direct links in the cost model", () => {
  it("prices calls from minBytes on the direct links, smaller ones on NATS", () => {
    const base = defaultCostModel()
    const m = withDirect(0.05, 1 / 2_000_000, 64 * KiB, base)
    expect(pathOf(4 * KiB, m)).toBe("nats")
    expect(pathOf(64 * KiB, m)).toBe("direct")
    expect(pathOf(64 * KiB, base)).toBe("nats")
    const small = predictAllReduce(algo("ring"), 4 * KiB, uniform(4), m)
    expect(small.path).toBe("nats")
    expect(small.ms).toBeCloseTo(predictAllReduce(algo("ring"), 4 * KiB, uniform(4), base).ms, 9)
    const big = predictAllReduce(algo("ring"), 8 * MiB, uniform(4), m)
    expect(big.path).toBe("direct")
    expect(big.ms).toBeLessThan(predictAllReduce(algo("ring"), 8 * MiB, uniform(4), base).ms)
  })

  it("has no hub: concurrent flows do not queue, a fan-out costs its sender once per receiver", () => {
    const m = withDirect(0.1, 1e-6, 0)
    const topo = uniform(4)
    const one = stageCost([{ src: 0, dsts: [1], bytes: MiB }], topo, m, "direct")
    const ring = stageCost([0, 1, 2, 3].map((r) => ({ src: r, dsts: [(r + 1) % 4], bytes: MiB })), topo, m, "direct")
    expect(one.ms).toBeCloseTo(0.1 + MiB * 1e-6, 9)
    expect(ring.ms).toBeCloseTo(one.ms, 9)
    expect(ring.serverMs).toBe(0)
    const fan = stageCost([{ src: 0, dsts: [1, 2, 3], bytes: MiB }], topo, m, "direct")
    expect(fan.ms).toBeCloseTo(0.1 + 3 * MiB * 1e-6, 9)
    // over NATS the same fan-out is one publish the server copies
    expect(stageCost([{ src: 0, dsts: [1, 2, 3], bytes: MiB }], topo, m).linkMs).toBeLessThan(fan.linkMs)
  })

  it("gives the textbook ring over direct links: p alpha + 2 (p-1)/p n beta with a fan-out all-gather costing (p-1)/p n beta", () => {
    const a = 0.07
    const b = 1 / 1_500_000
    for (const p of [2, 3, 4, 8]) {
      const n = 8 * MiB
      const m: CostModel = { ...withDirect(a, b, 0), chunkBytes: 1e15 }
      expect(predictAllReduce(algo("ring"), n, uniform(p), m).ms).toBeCloseTo(p * a + ((2 * (p - 1)) / p) * n * b, 6)
    }
  })

  it("prices an all-gather on the path its total takes", () => {
    const m = withDirect(0.01, 1e-7, MiB)
    const topo = uniform(4)
    expect(predictAllGather(64 * KiB, topo, m)).toBeCloseTo(predictAllGather(64 * KiB, topo, defaultCostModel()), 9)
    expect(predictAllGather(MiB, topo, m)).toBeCloseTo(0.01 + 3 * MiB * 1e-7, 9)
  })
})

describe("fitting the direct links from timed calls", () => {
  it("recovers alpha and beta from the ring's own times, whatever p and noise-free times", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 2, max: 8 }),
        fc.double({ min: 0.005, max: 2, noNaN: true }),
        fc.double({ min: 1e-8, max: 1e-5, noNaN: true }),
        (p, alpha, beta) => {
          const topo = uniform(p)
          const truth: CostModel = { ...withDirect(alpha, beta, 0), chunkBytes: 4 * MiB }
          const timings = [4 * KiB, 64 * KiB, MiB, 4 * MiB].flatMap((bytes) => [1, 1.3, 1.1].map((f) => ({ bytes, ms: predictAllReduce(algo("ring"), bytes, topo, truth).ms * f })))
          const fit = fitDirectLinks(algo("ring"), timings, topo, { chunkBytes: 4 * MiB, minBytes: 64 * KiB })
          expect(Result.isSuccess(fit)).toBe(true)
          const d = Result.getOrThrow(fit)
          // the lower quartile of (1, 1.1, 1.3) x is 1.05 x: both parameters come out 5% high
          expect(d.links["same-node"].alphaMs / alpha).toBeCloseTo(1.05, 2)
          expect(d.links["same-node"].betaMsPerByte / beta).toBeCloseTo(1.05, 2)
          expect(d.minBytes).toBe(64 * KiB)
          expect(d.rmsRelativeError).toBeLessThan(1e-6)
        }
      ),
      { numRuns: 40 }
    )
  })

  it("fails with a typed error below two sizes, and clamps a negative intercept to zero", () => {
    const one = fitDirectLinks(algo("ring"), [{ bytes: MiB, ms: 3 }, { bytes: MiB, ms: 4 }], uniform(2))
    expect(Result.isFailure(one)).toBe(true)
    if (Result.isFailure(one)) expect(one.failure.message).toMatch(/direct.*1 distinct size/)
    const steep = fitDirectLinks(algo("ring"), [{ bytes: KiB, ms: 0.001 }, { bytes: 8 * MiB, ms: 40 }], uniform(2))
    const d = Result.getOrThrow(steep)
    expect(d.links["same-node"].alphaMs).toBeGreaterThanOrEqual(0)
    expect(d.links["same-node"].betaMsPerByte).toBeGreaterThan(0)
  })

  it("changes the pick: a model fitted on NATS prices big calls through the hub, the direct links do not", () => {
    const topo = uniform(4)
    const nats = defaultCostModel()
    const direct = withDirect(0.2, 1 / 1_000_000, 64 * KiB, nats)
    const picks = (m: CostModel) => [64 * KiB, MiB, 16 * MiB].map((b) => chooseAlgorithm(b, topo, m, allReduceAlgorithms()))
    const over = picks(direct)
    for (const c of over) for (const p of c.predictions) expect(p.path).toBe("direct")
    // every prediction differs from the NATS model's (the hub is gone), so the two fits are not the same table
    const under = picks(nats)
    expect(over.map((c) => c.ms)).not.toEqual(under.map((c) => c.ms))
  })
})

describe("the tuner", () => {
  it("runs every candidate rounds times per size, interleaved", () => {
    const t = new AlgorithmTuner(["ring", "tree", "hierarchical"], 2)
    expect(t.steps).toBe(6)
    const seq = Array.from({ length: 6 }, () => t.next(MiB))
    expect(seq).toEqual(["ring", "tree", "hierarchical", "ring", "tree", "hierarchical"])
    // each size keeps its own count
    expect(t.next(4 * KiB)).toBe("ring")
  })

  it("agrees on each call's slowest rank, takes the median of each candidate's calls, and picks the fastest per size", () => {
    const names = ["ring", "tree", "hierarchical"]
    const ranks = [new AlgorithmTuner(names, 3), new AlgorithmTuner(names, 3)]
    // a call costs the group its slowest rank: rank 1 finishes tree late at 1 MiB, so hierarchical wins there
    const perRank: Record<string, Record<number, number>>[] = [
      { ring: { [MiB]: 10, [4 * KiB]: 0.5 }, tree: { [MiB]: 5, [4 * KiB]: 0.3 }, hierarchical: { [MiB]: 6, [4 * KiB]: 0.4 } },
      { ring: { [MiB]: 10, [4 * KiB]: 0.5 }, tree: { [MiB]: 12, [4 * KiB]: 0.3 }, hierarchical: { [MiB]: 7, [4 * KiB]: 0.4 } }
    ]
    ranks.forEach((t, r) => {
      for (const bytes of [MiB, 4 * KiB]) {
        for (let i = 0; i < t.steps; i++) {
          const a = t.next(bytes)
          // the first round is slowed (a burst of load): the median of each candidate's calls leaves it out
          t.record(bytes, a, perRank[r]![a]![bytes]! * (i < 3 ? 1.5 : 1))
        }
      }
    })
    const tables = ranks.map((t) => t.table())
    expect(tables[0]!.length).toBe(2 * 3 * 3)
    const agreed = tables[0]!.map((v, i) => Math.max(v, tables[1]![i]!))
    const decided = ranks.map((t) => t.decide(Float32Array.from(agreed), () => "ring"))
    expect(decided[0]).toEqual(decided[1])
    expect(decided[0]!.map((d) => [d.bytes, d.picked])).toEqual([
      [4 * KiB, "tree"],
      [MiB, "hierarchical"]
    ])
    expect(decided[0]![1]!.ms).toEqual([10, 12, 7])
    expect(decided[0]![1]!.modelPick).toBe("ring")
    expect(ranks[0]!.pick(MiB)).toBe("hierarchical")
    expect(ranks[0]!.pick(64 * KiB)).toBeUndefined()
  })

  it("keeps the cost model's pick while it measured within 1.1x of the fastest, and overrides it beyond", () => {
    const t = new AlgorithmTuner(["ring", "tree", "hierarchical"], 1)
    for (const [a, ms] of [["ring", 10.5], ["tree", 10], ["hierarchical", 30]] as const) t.record(MiB, a, ms)
    for (const [a, ms] of [["ring", 12], ["tree", 10], ["hierarchical", 30]] as const) t.record(8 * MiB, a, ms)
    const d = t.decide(t.table(), () => "ring")
    expect(d.map((x) => x.picked)).toEqual(["ring", "tree"])
    expect(d.map((x) => x.modelPick)).toEqual(["ring", "ring"])
    // with keepWithin 1 the fastest always wins
    const strict = new AlgorithmTuner(["ring", "tree"], 1, 1)
    strict.record(MiB, "ring", 10.5)
    strict.record(MiB, "tree", 10)
    expect(strict.decide(strict.table(), () => "ring")[0]!.picked).toBe("tree")
  })

  it("keeps the model's pick when it was slower in too few rounds: one burst of load does not decide", () => {
    const t = new AlgorithmTuner(["ring", "tree"], 4)
    // rounds 0-3: ring 10, 10, 30, 30 (median 20) against tree 12, 12, 12, 12: slower in only 2 of 4 rounds
    for (const ms of [10, 10, 30, 30]) t.record(MiB, "ring", ms)
    for (let k = 0; k < 4; k++) t.record(MiB, "tree", 12)
    // at 8 MiB ring is slower in 3 of 4 rounds and by its median: overridden
    for (const ms of [10, 30, 30, 30]) t.record(8 * MiB, "ring", ms)
    for (let k = 0; k < 4; k++) t.record(8 * MiB, "tree", 12)
    const decided = t.decide(t.table(), () => "ring")
    expect(decided.map((d) => d.picked)).toEqual(["ring", "tree"])
    // the rounds it was decided on go with the decision (explain.json), and explain.txt says why the pick was kept
    expect(decided[0]!.rounds).toEqual([
      [10, 10, 30, 30],
      [12, 12, 12, 12]
    ])
    const e = withTuned({ text: "", json: {} } as unknown as Explanation, decided)
    expect(e.text).toContain("1.0 MiB: ring 20.00, tree 12.00 ms -> ring (the cost model picked ring, kept: not clearly slower than the fastest, 1.67x, but slower in 2 of 4 rounds (3 needed): 10.00, 10.00, 30.00, 30.00 against 12.00, 12.00, 12.00, 12.00 ms)")
  })

  it("leaves out sizes not timed rounds times with every candidate, and refuses a table of another shape", () => {
    const t = new AlgorithmTuner(["ring", "tree"], 1)
    t.record(MiB, "ring", 3)
    t.record(MiB, "tree", 2)
    t.record(8 * MiB, "ring", 9)
    t.record(8 * MiB, "nonsense", 1)
    t.record(8 * MiB, "tree", Number.NaN)
    expect(t.sizes).toEqual([MiB])
    expect(Array.from(t.table())).toEqual([3, 2])
    expect(() => t.decide(new Float32Array(4), () => "ring")).toThrow(/expected 2/)
    expect(t.decide(t.table(), () => "ring")[0]!.picked).toBe("tree")
    expect(t.pick(8 * MiB)).toBeUndefined()
  })
})

describe("each pair of nodes' direct links", () => {
  // Two nodes: their ranks talk over Unix sockets at 2 GB/s inside a node, over a 100 Mbit/s link across.
  const fast = link(0.05, 1 / 2_000_000)
  const slow = link(0.2, 1 / 12_500)
  const nodesOf = (perNode: number, nodes = 2): Topology =>
    Array.from({ length: perNode * nodes }, (_, r) => ({ nodeId: `n${Math.floor(r / perNode)}`, server: "s" }))
  const truthPairs = { n0: { n0: fast, n1: slow }, n1: { n0: slow, n1: fast } }
  const truth = (topo: Topology): CostModel => ({
    ...defaultCostModel(),
    chunkBytes: 4 * MiB,
    direct: { links: { "same-node": fast, "same-server": slow, "cross-server": slow }, pairs: truthPairs, minBytes: 0 }
  })
  /** What the exchanges of pairProbeRounds would take on `truth`'s links: alpha + bytes * beta, x (1, 1.3, 1.1). */
  const exchanges = (topo: Topology) =>
    pairProbeRounds(topo.map((t) => t.nodeId)).flatMap((round) =>
      round.flatMap(([a, b]) =>
        [4 * KiB, 256 * KiB].flatMap((bytes) => {
          const l = truthPairs[topo[a]!.nodeId as "n0"][topo[b]!.nodeId as "n0"]
          return [1, 1.3, 1.1].map((f) => ({ a, b, bytes, ms: (l.alphaMs + bytes * l.betaMsPerByte) * f }))
        })
      )
    )
  const ringTimings = (topo: Topology, slowdown = 1) =>
    [4 * KiB, 64 * KiB, MiB].map((bytes) => ({ bytes, ms: predictAllReduce(algo("ring"), bytes, topo, truth(topo)).ms * slowdown }))

  it("times every pair of nodes once, a node in at most one pair a round, with ranks of those nodes", () => {
    expect(pairProbeRounds(["a", "a", "a"])).toEqual([])
    expect(pairProbeRounds(["a", "a", "b", "b"])).toEqual([
      [
        [0, 1],
        [2, 3]
      ],
      [[0, 2]]
    ])
    fc.assert(
      fc.property(fc.array(fc.integer({ min: 0, max: 5 }), { minLength: 2, maxLength: 12 }), (ids) => {
        const nodes = ids.map((i) => `n${i}`)
        const rounds = pairProbeRounds(nodes)
        const distinct = [...new Set(nodes)]
        if (distinct.length === 1) {
          expect(rounds).toEqual([])
          return
        }
        const seen = new Map<string, number>()
        for (const round of rounds) {
          const used = round.flatMap(([a, b]) => (nodes[a] === nodes[b] ? [nodes[a]!] : [nodes[a]!, nodes[b]!]))
          expect(new Set(used).size).toBe(used.length) // no node twice in a round
          for (const [a, b] of round) {
            expect(a).not.toBe(b)
            const key = [nodes[a], nodes[b]].sort().join("|")
            seen.set(key, (seen.get(key) ?? 0) + 1)
          }
        }
        const wanted = new Set<string>()
        for (let a = 0; a < nodes.length; a++) for (let b = a + 1; b < nodes.length; b++) wanted.add([nodes[a], nodes[b]].sort().join("|"))
        expect([...seen.keys()].sort()).toEqual([...wanted].sort())
        expect([...seen.values()].every((n) => n === 1)).toBe(true)
      }),
      { numRuns: 200 }
    )
  })

  it("fits each pair of nodes from its exchanges, and fails with a typed error on one size", () => {
    const topo = nodesOf(2)
    const pairs = Result.getOrThrow(fitDirectPairs(topo, exchanges(topo)))
    // the lower quartile of (1, 1.1, 1.3) x is 1.05 x
    expect(pairs.n0!.n1!.betaMsPerByte / slow.betaMsPerByte).toBeCloseTo(1.05, 2)
    expect(pairs.n1!.n0!.betaMsPerByte / slow.betaMsPerByte).toBeCloseTo(1.05, 2)
    expect(pairs.n0!.n0!.betaMsPerByte / fast.betaMsPerByte).toBeCloseTo(1.05, 2)
    expect(pairs.n1!.n1!.alphaMs / fast.alphaMs).toBeCloseTo(1.05, 2)
    // a link too fast for the sizes to show its bandwidth (256 KiB in 1.1x the time of 4 KiB): bounded by what they show, not a free link
    const blurred = exchanges(topo).map((t) => (t.a === 0 && t.b === 1 ? { ...t, ms: t.bytes === 4 * KiB ? 0.2 : 0.22 } : t))
    const bound = Result.getOrThrow(fitDirectPairs(topo, blurred))
    expect(bound.n0!.n0!.alphaMs).toBeCloseTo(0.2, 9)
    expect(bound.n0!.n0!.betaMsPerByte).toBeCloseTo(0.22 / (256 * KiB), 12)
    expect(bound.n0!.n1!.betaMsPerByte / slow.betaMsPerByte).toBeCloseTo(1.05, 2)
    const one = fitDirectPairs(topo, exchanges(topo).filter((t) => t.bytes === 4 * KiB))
    expect(Result.isFailure(one)).toBe(true)
    if (Result.isFailure(one)) expect(one.failure.message).toMatch(/direct pairs.*distinct size/)
  })

  for (const perNode of [2, 3]) {
    it(`picks hierarchical for a big call across a slow link with ${perNode} ranks a node, where one alpha and beta for every link picked the ring`, () => {
      const topo = nodesOf(perNode)
      const pairs = Result.getOrThrow(fitDirectPairs(topo, exchanges(topo)))
      // the collectives took 1.5x what the exchanges say (lockstep, arithmetic): the fit scales every pair by it
      const perPair = Result.getOrThrow(fitDirectLinks(algo("ring"), ringTimings(topo, 1.5), topo, { chunkBytes: 4 * MiB, pairs }))
      const flat = Result.getOrThrow(fitDirectLinks(algo("ring"), ringTimings(topo, 1.5), topo, { chunkBytes: 4 * MiB }))
      expect(perPair.pairs).toBeDefined()
      expect(perPair.pairs!.n0!.n1!.betaMsPerByte / slow.betaMsPerByte).toBeCloseTo(1.5, 1)
      expect(perPair.pairs!.n0!.n0!.betaMsPerByte / fast.betaMsPerByte).toBeCloseTo(1.5, 1)
      expect(perPair.links["same-node"].betaMsPerByte).toBeLessThan(perPair.links["same-server"].betaMsPerByte)
      const model = (direct: NonNullable<CostModel["direct"]>): CostModel => ({ ...defaultCostModel(), chunkBytes: 4 * MiB, direct })
      const bytes = 16 * MiB
      expect(chooseAlgorithm(bytes, topo, truth(topo), allReduceAlgorithms()).algorithm).toBe("hierarchical")
      expect(chooseAlgorithm(bytes, topo, model(perPair), allReduceAlgorithms()).algorithm).toBe("hierarchical")
      expect(chooseAlgorithm(bytes, topo, model(flat), allReduceAlgorithms()).algorithm).toBe("ring")
      // and the per-pair model's times are the truth's, 1.5x
      for (const a of ["ring", "hierarchical", "tree"]) {
        expect(predictAllReduce(algo(a), bytes, topo, model(perPair)).ms / predictAllReduce(algo(a), bytes, topo, truth(topo)).ms).toBeCloseTo(1.5, 1)
      }
    })
  }

  it("keeps one alpha and beta for every link when a pair of nodes was not timed, and says which pairs it fitted", () => {
    const topo = nodesOf(2)
    const partial = Result.getOrThrow(fitDirectPairs(topo, exchanges(topo).filter((t) => !(t.a === 0 && t.b === 1))))
    expect(partial.n0?.n0).toBeUndefined()
    const d = Result.getOrThrow(fitDirectLinks(algo("ring"), ringTimings(topo), topo, { chunkBytes: 4 * MiB, pairs: partial }))
    expect(d.pairs).toBeUndefined()
    expect(d.links["same-node"]).toEqual(d.links["cross-server"])
    const full = Result.getOrThrow(fitDirectLinks(algo("ring"), ringTimings(topo), topo, { chunkBytes: 4 * MiB, pairs: Result.getOrThrow(fitDirectPairs(topo, exchanges(topo))) }))
    const observed = { topology: topo, model: { ...defaultCostModel(), fits: {}, assumed: {}, direct: full }, pairs: [], samples: {}, probeMs: 1 } as ObservedTopology
    expect(describeObservation(observed)).toMatch(/direct links n0 <-> n0 \d+us \d+MB\/s, n0 <-> n1 \d+us \d+MB\/s, n1 <-> n1 .*each pair of nodes in proportion/)
  })
})
