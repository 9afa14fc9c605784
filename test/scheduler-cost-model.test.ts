// The alpha-beta cost model: fitting on synthetic probe data (noise, outliers, too little data),
// the closed forms it must reduce to, and the qualitative facts it must reproduce (tree wins small
// messages, ring wins large ones, hierarchical wins over slow cross-server links, the hub term).
import { describe, expect, it } from "vitest"
import * as fc from "fast-check"
import * as Result from "effect/Result"
import {
  CostModelFitError,
  defaultCostModel,
  describePrediction,
  estimateServerBandwidth,
  fitAlphaBeta,
  fitCostModel,
  linkClassOf,
  predictAll,
  predictAllGather,
  predictAllReduce,
  stageCost,
  topologyOf,
  type CostModel,
  type ProbeSample,
  type Topology
} from "../scheduler/cost-model.ts"
import { allReduceAlgorithms, findAllReduceAlgorithm } from "../collectives/algorithms/index.ts"

// The cost model prices the stages each registered algorithm declares (collectives/algorithms/).
const ALGOS = allReduceAlgorithms()
const algo = (name: string) => {
  const a = findAllReduceAlgorithm(name)
  if (!a) throw new Error(`no all-reduce algorithm "${name}" is registered`)
  return a
}

const KiB = 1024
const MiB = 1024 * 1024

/** Deterministic pseudo-random numbers (mulberry32) so the synthetic data is the same every run. */
const rng = (seed: number) => () => {
  seed |= 0
  seed = (seed + 0x6d2b79f5) | 0
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed)
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296
}

const sizes = [16, 256, 4 * KiB, 64 * KiB, 256 * KiB, MiB, 4 * MiB]
const synth = (alpha: number, beta: number, reps: number, noise: number, outlierRate: number, seed = 1): ProbeSample[] => {
  const r = rng(seed)
  const out: ProbeSample[] = []
  for (const bytes of sizes) {
    for (let i = 0; i < reps; i++) {
      const clean = alpha + beta * bytes
      const jitter = 1 + noise * (2 * r() - 1)
      // Outliers are what real probes show: a GC pause or a scheduling hiccup, always slower.
      const outlier = r() < outlierRate ? 3 + 10 * r() : 1
      out.push({ bytes, ms: clean * jitter * outlier })
    }
  }
  return out
}

const uniform = (p: number, nodeId = "n", server = "s"): Topology => Array.from({ length: p }, () => ({ nodeId, server }))
const twoServers = (perNode: number): Topology => [
  ...Array.from({ length: perNode }, () => ({ nodeId: "a", server: "s1" })),
  ...Array.from({ length: perNode }, () => ({ nodeId: "b", server: "s2" }))
]
/** A model without the hub term (server bandwidth effectively infinite, no per-message cost): the textbook formulas. */
const noHub = (alpha: number, beta: number, extra: Partial<CostModel> = {}): CostModel => ({
  links: {
    "same-node": { alphaMs: alpha, betaMsPerByte: beta },
    "same-server": { alphaMs: alpha, betaMsPerByte: beta },
    "cross-server": { alphaMs: alpha, betaMsPerByte: beta }
  },
  defaultServerBytesPerMs: 1e18,
  defaultServerMsPerMessage: 0,
  chunkBytes: 1e15,
  ...extra
})

describe("fitting alpha and beta", () => {
  it("recovers exact parameters from noiseless samples", () => {
    const f = Result.getOrThrow(fitAlphaBeta(synth(0.2, 2e-6, 1, 0, 0)))
    expect(f.alphaMs).toBeCloseTo(0.2, 9)
    expect(f.betaMsPerByte).toBeCloseTo(2e-6, 14)
    expect(f.rmsRelativeError).toBeLessThan(1e-9)
    expect(f.sizes).toBe(sizes.length)
  })

  it("is robust to noise and slow outliers (lower quartiles per size, relative weights)", () => {
    for (let seed = 1; seed <= 20; seed++) {
      const f = Result.getOrThrow(fitAlphaBeta(synth(0.16, 1 / 550_000, 9, 0.15, 0.15, seed)))
      expect(Math.abs(f.alphaMs / 0.16 - 1)).toBeLessThan(0.15)
      expect(Math.abs(f.betaMsPerByte * 550_000 - 1)).toBeLessThan(0.15)
    }
  })

  it("pins alpha with the small probes even when the large ones dominate the times", () => {
    // Unweighted least squares would put alpha anywhere within the 64 MiB probe's noise (~ms).
    const s = [...synth(0.05, 1e-6, 5, 0.02, 0, 3), { bytes: 64 * MiB, ms: 64 * MiB * 1e-6 * 1.02 }]
    const f = Result.getOrThrow(fitAlphaBeta(s))
    expect(f.alphaMs).toBeGreaterThan(0.04)
    expect(f.alphaMs).toBeLessThan(0.06)
  })

  it("clamps to non-negative parameters", () => {
    const f = Result.getOrThrow(fitAlphaBeta([{ bytes: 10, ms: 0.001 }, { bytes: 1000, ms: 1 }, { bytes: 2000, ms: 2.1 }]))
    expect(f.alphaMs).toBeGreaterThanOrEqual(0)
    expect(f.betaMsPerByte).toBeGreaterThan(0)
    const flat = Result.getOrThrow(fitAlphaBeta([{ bytes: 10, ms: 1 }, { bytes: 1000, ms: 0.9 }]))
    expect(flat.betaMsPerByte).toBe(0)
    expect(flat.alphaMs).toBeGreaterThan(0.9)
  })

  it("fails with a typed, actionable error on too little data", () => {
    const r = fitAlphaBeta([{ bytes: 16, ms: 0.2 }, { bytes: 16, ms: 0.3 }, { bytes: 1024, ms: Number.NaN }], "cross-server")
    expect(Result.isFailure(r)).toBe(true)
    if (Result.isFailure(r)) {
      expect(r.failure).toBeInstanceOf(CostModelFitError)
      expect(r.failure.message).toContain("cross-server")
      expect(r.failure.message).toContain("at least two message sizes")
    }
  })

  it("fits a whole model and says which classes were borrowed", () => {
    const m = Result.getOrThrow(fitCostModel({ "same-server": synth(0.2, 2e-6, 3, 0.05, 0), "cross-server": synth(0.5, 8e-6, 3, 0.05, 0, 7) }))
    expect(m.assumed).toEqual({ "same-node": "same-server" })
    expect(m.links["same-node"]).toEqual(m.links["same-server"])
    expect(m.links["cross-server"].betaMsPerByte).toBeGreaterThan(m.links["same-server"].betaMsPerByte * 3)
    expect(Result.isFailure(fitCostModel({}))).toBe(true)
  })

  it("estimates a server's aggregate throughput as the median rate", () => {
    expect(estimateServerBandwidth([{ bytes: 1000, ms: 1 }, { bytes: 1000, ms: 2 }, { bytes: 1000, ms: 100 }])).toBe(500)
    expect(estimateServerBandwidth([])).toBeUndefined()
  })
})

describe("predictions reduce to the textbook formulas without the hub term", () => {
  const a = 0.1
  const b = 1e-6
  it("ring: p-1 relay steps, then one fan-out all-gather stage (p > 2)", () => {
    // The collective's all-gather is one fan-out publish per owner, not p-1 relay hops (the old
    // model charged 2(p-1) alphas): p alphas, and the same 2(p-1)/p n beta of bytes per rank.
    for (const p of [3, 4, 7, 8]) {
      const n = 8 * MiB
      expect(predictAllReduce(algo("ring"), n, uniform(p), noHub(a, b)).ms).toBeCloseTo(p * a + ((2 * (p - 1)) / p) * n * b, 9)
    }
    // p = 2 relays (a fan-out to one receiver is the same traffic): 2(alpha + n/2 beta).
    expect(predictAllReduce(algo("ring"), 8 * MiB, uniform(2), noHub(a, b)).ms).toBeCloseTo(2 * (a + 4 * MiB * b), 9)
  })

  it("tree without pipelining: h = floor(log2 p) levels up (a parent takes its children's chunks), one fan-out down", () => {
    // The root publishes the result once and the server delivers it to every rank: one stage
    // down, not h relay hops (the old model's h(alpha + n beta) down).
    const n = MiB
    expect(predictAllReduce(algo("tree"), n, uniform(2), noHub(a, b)).ms).toBeCloseTo(2 * (a + n * b), 9)
    // Complete trees: every parent has two children.
    for (const p of [3, 7, 15]) {
      const h = Math.floor(Math.log2(p))
      expect(predictAllReduce(algo("tree"), n, uniform(p), noHub(a, b)).ms).toBeCloseTo(h * (a + 2 * n * b) + (a + n * b), 9)
    }
    // p = 4: the deepest level has a single child (rank 3 -> 1).
    expect(predictAllReduce(algo("tree"), n, uniform(4), noHub(a, b)).ms).toBeCloseTo((a + n * b) + (a + 2 * n * b) + (a + n * b), 9)
  })

  it("tree with pipelining: h + k stages, the root's fan-out of chunk q overlapping later chunks' way up", () => {
    // p = 7, h = 2, k = 8. Stage 0: level 2 only (a level-1 parent takes 2c). Stage 1: levels 2
    // and 1 (2c). Stages 2..7: both levels and the fan-out of chunk j-2, so a level-1 node takes
    // 2c from its children plus c from the root: 3c. Stage 8: level 1 and a fan-out (root takes
    // 2c). Stage 9: the last fan-out (c). (The old model ran a separate hop-by-hop broadcast:
    // 2(h + k - 1) stages.)
    const n = 8 * MiB
    const k = 8
    const p = 7
    const c = n / k
    const t = predictAllReduce(algo("tree"), n, uniform(p), noHub(a, b, { chunkBytes: MiB })).ms
    expect(t).toBeCloseTo(2 * (a + 2 * c * b) + 6 * (a + 3 * c * b) + (a + 2 * c * b) + (a + c * b), 6)
  })

  it("many tiny chunks (64M stages) are costed in closed form (a loop over every stage would time out)", () => {
    const n = 64 * MiB
    const t = predictAllReduce(algo("tree"), n, uniform(7), noHub(a, b, { chunkBytes: 1 })).ms
    // As above with k = n chunks of 1 byte: (k + 2) alphas, (3k + 1) bytes' worth of beta.
    const expected = (n + 2) * a + (3 * n + 1) * b
    expect(Math.abs(t / expected - 1)).toBeLessThan(1e-9)
    const hier = predictAllReduce(algo("hierarchical"), n, twoServers(3), noHub(a, b, { chunkBytes: 1 })).ms
    expect(Number.isFinite(hier)).toBe(true)
  })

  it("hierarchical: members straight to the leader + leaders' ring + one fan-out per node", () => {
    const n = 4 * MiB
    const model = noHub(a, b)
    // 3 per node: the leader takes two members' buffers in one stage.
    const expected = (a + 2 * n * b) + 2 * (a + (n / 2) * b) + (a + n * b)
    const pred = predictAllReduce(algo("hierarchical"), n, twoServers(3), model)
    expect(pred.ms).toBeCloseTo(expected, 6)
    expect(pred.phases.map((p) => p.name)).toEqual(["intra-node reduce", "leaders ring", "intra-node broadcast"])
    // 4 per node: the collective has no tree inside the node (the old model assumed one): the
    // leader takes three members' buffers in one stage.
    expect(predictAllReduce(algo("hierarchical"), n, twoServers(4), model).ms).toBeCloseTo((a + 3 * n * b) + 2 * (a + (n / 2) * b) + (a + n * b), 6)
  })

  it("p = 1 and 0 bytes cost nothing", () => {
    for (const alg of ALGOS) {
      expect(predictAllReduce(alg, MiB, uniform(1), defaultCostModel()).ms).toBe(0)
      expect(predictAllReduce(alg, 0, uniform(4), defaultCostModel()).ms).toBe(0)
    }
  })
})

describe("NATS specifics: the server is a shared hub", () => {
  it("concurrent flows through one server share its throughput", () => {
    const model: CostModel = { ...noHub(0, 1e-6), defaultServerBytesPerMs: 1e6 }
    const topo = uniform(4)
    const one = stageCost([{ src: 0, dsts: [1], bytes: MiB }], topo, model)
    const four = stageCost([0, 1, 2, 3].map((r) => ({ src: r, dsts: [(r + 1) % 4], bytes: MiB })), topo, model)
    expect(one.ms).toBeCloseTo(MiB * 1e-6, 9)
    expect(four.ms).toBeCloseTo((4 * MiB) / 1e6, 9)
    expect(four.busiestServer).toBe("s")
  })

  it("a cross-server flow loads both servers; the default server rate is one flow's rate", () => {
    const topo: Topology = [{ nodeId: "a", server: "s1" }, { nodeId: "b", server: "s2" }]
    const model: CostModel = { links: defaultCostModel().links }
    const c = stageCost([{ src: 0, dsts: [1], bytes: MiB }], topo, model)
    // Each server handles the message once (s1 forwards it over the route, s2 delivers it), at a
    // default per-message cost of the same-server alpha.
    expect(c.serverMs).toBeCloseTo(0.16 + MiB / 550_000, 9)
    expect(linkClassOf(topo[0]!, topo[1]!)).toBe("cross-server")
    expect(linkClassOf({ nodeId: "a", server: "s" }, { nodeId: "a", server: "s" })).toBe("same-node")
    expect(linkClassOf({ nodeId: "a", server: "s" }, { nodeId: "b", server: "s" })).toBe("same-server")
  })

  it("concurrent messages overlap on the links but queue at the hub, one message at a time", () => {
    const model: CostModel = { ...noHub(0.1, 1e-9), defaultServerMsPerMessage: 0.1 }
    const topo = uniform(4)
    // A lone message: alpha either way (the probe's view).
    expect(stageCost([{ src: 0, dsts: [1], bytes: 16 }], topo, model).ms).toBeCloseTo(0.1, 6)
    // A ring step: 4 messages through one server.
    const ringStep = stageCost([0, 1, 2, 3].map((r) => ({ src: r, dsts: [(r + 1) % 4], bytes: 16 })), topo, model)
    expect(ringStep.ms).toBeCloseTo(0.4, 6)
    // A fan-out to 3: one publish, three deliveries.
    expect(stageCost([{ src: 0, dsts: [1, 2, 3], bytes: 16 }], topo, model).ms).toBeCloseTo(0.3, 6)
    // The default per-message cost is the same-server alpha; 0 switches it off.
    const d = defaultCostModel()
    expect(stageCost([0, 1, 2, 3].map((r) => ({ src: r, dsts: [(r + 1) % 4], bytes: 16 })), topo, d).serverMs).toBeCloseTo(4 * 0.16 + 64 / 550_000, 9)
    expect(stageCost([0, 1, 2, 3].map((r) => ({ src: r, dsts: [(r + 1) % 4], bytes: 16 })), topo, { ...d, defaultServerMsPerMessage: 0 }).serverMs).toBeCloseTo(64 / 550_000, 9)
  })

  it("on one server a large ring approaches 2(p-1) n / B: every byte is relayed by the hub", () => {
    const m = defaultCostModel()
    const n = 64 * MiB
    for (const p of [2, 4, 8]) {
      const t = predictAllReduce(algo("ring"), n, uniform(p), m).ms
      const hub = (2 * (p - 1) * n) / 550_000
      expect(t / hub).toBeGreaterThan(0.99)
      expect(t / hub).toBeLessThan(1.05)
    }
    expect(predictAllReduce(algo("ring"), n, uniform(4), m).bottleneck).toBe("server s")
  })

  it("per-server rates override the default", () => {
    const base = defaultCostModel()
    const fast: CostModel = { ...base, serverBytesPerMs: { s: 10 * 550_000 } }
    expect(predictAllReduce(algo("ring"), 64 * MiB, uniform(4), fast).ms).toBeLessThan(predictAllReduce(algo("ring"), 64 * MiB, uniform(4), base).ms / 2)
  })
})

describe("qualitative facts the choice relies on", () => {
  const m = defaultCostModel()
  const best = (n: number, topo: Topology, model: CostModel = m) => {
    const ps = predictAll(n, topo, model, ALGOS)
    return ps.reduce((x, y) => (y.ms < x.ms ? y : x)).algorithm
  }
  it("tree beats ring for small messages at p = 4 and 8, ring beats tree for large ones", () => {
    for (const p of [4, 8]) {
      const small = predictAll(4 * KiB, uniform(p, "n", "s").map((r, i) => ({ ...r, nodeId: `n${i}` })), m, ALGOS)
      const ms = (ps: typeof small, name: string) => ps.find((x) => x.algorithm === name)!.ms
      expect(ms(small, "tree")).toBeLessThan(ms(small, "ring"))
      const large = predictAll(64 * MiB, uniform(p).map((r, i) => ({ ...r, nodeId: `n${i}` })), m, ALGOS)
      expect(ms(large, "ring")).toBeLessThan(ms(large, "tree"))
    }
  })

  it("hierarchical wins large messages when the cross-server link is slow", () => {
    // 20x slower, not 10x as when the ring's all-gather was costed as relay hops: with the fan-out
    // all-gather a flat ring over 2 x 4 ranks crosses only 1.375x the bytes hierarchical does, and
    // at 10x the node-local gather and fan-out (3n each through the hub) eat that margin.
    const slow: CostModel = {
      links: { ...m.links, "cross-server": { alphaMs: 1, betaMsPerByte: 20 / 550_000 } }
    }
    expect(best(64 * MiB, twoServers(4), slow)).toBe("hierarchical")
    expect(best(4 * MiB, twoServers(4), slow)).toBe("hierarchical")
  })

  it("with one rank per node, hierarchical is the relay ring (the leaders' ring has no fan-out all-gather)", () => {
    const topo: Topology = [0, 1, 2, 3].map((i) => ({ nodeId: `n${i}`, server: i < 2 ? "s1" : "s2" }))
    for (const n of [KiB, MiB, 32 * MiB]) {
      const hier = predictAllReduce(algo("hierarchical"), n, topo, m)
      expect(hier.phases).toEqual([{ name: "leaders ring", stages: 6, ms: hier.ms }])
      // The ring all-reduce saves p-2 stages with its fan-out all-gather.
      expect(predictAllReduce(algo("ring"), n, topo, m).phases[0]!.stages).toBe(4)
    }
    // p = 2: both relay, exactly the same.
    const two = topo.slice(0, 2).map((r, i) => ({ ...r, server: `s${i}` }))
    expect(predictAllReduce(algo("hierarchical"), MiB, two, m).ms).toBeCloseTo(predictAllReduce(algo("ring"), MiB, two, m).ms, 9)
  })

  it("hierarchical can group by NATS server instead of node", () => {
    // Four nodes, two per server: by node every node is its own group (a ring); by server the
    // cross-server link carries only the two leaders' traffic.
    const topo: Topology = [0, 1, 2, 3].map((i) => ({ nodeId: `n${i}`, server: i < 2 ? "s1" : "s2" }))
    const slow: CostModel = { links: { ...m.links, "cross-server": { alphaMs: 1, betaMsPerByte: 10 / 550_000 } } }
    const byNode = predictAllReduce(algo("hierarchical"), 16 * MiB, topo, slow)
    const byServer = predictAllReduce(algo("hierarchical"), 16 * MiB, topo, { ...slow, hierarchicalGroups: "server" })
    expect(byNode.phases.map((ph) => ph.name)).toEqual(["leaders ring"])
    expect(byServer.ms).toBeLessThan(byNode.ms)
  })

  it("an all-gather with NATS fan-out is one stage", () => {
    const t = predictAllGather(MiB, uniform(4), noHub(0.1, 1e-6))
    expect(t).toBeCloseTo(0.1 + 3 * MiB * 1e-6, 9)
    expect(predictAllGather(MiB, uniform(1), m)).toBe(0)
  })

  it("topologyOf reads a placement plan's ranks; describePrediction is readable", () => {
    expect(topologyOf([{ nodeId: "a", natsServer: "s1" }])).toEqual([{ nodeId: "a", server: "s1" }])
    expect(describePrediction(predictAllReduce(algo("ring"), MiB, uniform(2), m))).toMatch(/^ring 1 MiB p=2: [\d.]+ ms/)
  })
})

const arbTopo = fc
  .array(fc.record({ node: fc.integer({ min: 0, max: 3 }), server: fc.integer({ min: 0, max: 1 }) }), { minLength: 1, maxLength: 12 })
  .map((rs) => [...rs].sort((x, y) => x.node - y.node).map((r) => ({ nodeId: `n${r.node}`, server: `s${(r.node + r.server) % 2}` })))
const arbModel = fc
  .record({
    alpha: fc.tuple(fc.double({ min: 0, max: 2, noNaN: true }), fc.double({ min: 0, max: 2, noNaN: true }), fc.double({ min: 0, max: 5, noNaN: true })),
    bw: fc.tuple(fc.integer({ min: 1e4, max: 1e7 }), fc.integer({ min: 1e4, max: 1e7 }), fc.integer({ min: 1e3, max: 1e7 })),
    server: fc.option(fc.integer({ min: 1e4, max: 1e8 }), { nil: undefined }),
    chunk: fc.constantFrom(64 * KiB, MiB, 8 * MiB)
  })
  .map(
    (r): CostModel => ({
      links: {
        "same-node": { alphaMs: r.alpha[0], betaMsPerByte: 1 / r.bw[0] },
        "same-server": { alphaMs: r.alpha[1], betaMsPerByte: 1 / r.bw[1] },
        "cross-server": { alphaMs: r.alpha[2], betaMsPerByte: 1 / r.bw[2] }
      },
      ...(r.server ? { defaultServerBytesPerMs: r.server } : {}),
      chunkBytes: r.chunk
    })
  )

describe("prediction properties", () => {
  it("predictions are finite, non-negative, and phases add up", () => {
    fc.assert(
      fc.property(arbTopo, arbModel, fc.integer({ min: 0, max: 128 * MiB }), (topo, model, n) => {
        for (const p of predictAll(n, topo, model, ALGOS)) {
          expect(Number.isFinite(p.ms)).toBe(true)
          expect(p.ms).toBeGreaterThanOrEqual(0)
          expect(p.phases.reduce((s, ph) => s + ph.ms, 0)).toBeCloseTo(p.ms, 6)
          if (topo.length === 1 || n === 0) expect(p.ms).toBe(0)
        }
      }),
      { numRuns: 150 }
    )
  })

  it("ring time never decreases with message size", () => {
    fc.assert(
      fc.property(arbTopo, arbModel, fc.integer({ min: 0, max: 64 * MiB }), fc.integer({ min: 0, max: 64 * MiB }), (topo, model, x, y) => {
        const [lo, hi] = x <= y ? [x, y] : [y, x]
        expect(predictAllReduce(algo("ring"), lo, topo, model).ms).toBeLessThanOrEqual(predictAllReduce(algo("ring"), hi, topo, model).ms + 1e-9)
      }),
      { numRuns: 150 }
    )
  })
})
