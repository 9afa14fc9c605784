// Algorithm choice per bucket and compression 'auto': the cheapest algorithm wins, compression
// escalates only as far as the predicted communication/compute gap calls for, and explain() shows
// every candidate's predicted time and the reason.
import { describe, expect, it } from "vitest"
import * as fc from "fast-check"
import { chooseAlgorithm, explain, planCommunication, type CommunicationRequest } from "../scheduler/algorithm-choice.ts"
import { defaultCostModel, predictAll, type CostModel, type Topology } from "../scheduler/cost-model.ts"
import { allReduceAlgorithms } from "../collectives/algorithms/index.ts"
import { askedProfile, autoCandidates } from "../collectives/compression/index.ts"
import { compressorProfiles } from "../actors/train/worker/auto-config.ts"

const KiB = 1024
const MiB = 1024 * 1024
const m = defaultCostModel()
// the cost model is handed the algorithm registry's entries (the scheduler does not import them)
const ALGOS = allReduceAlgorithms()
const NAMES = ALGOS.map((a) => a.name)
// and the codec registry's 'auto' candidates, for a model of four 2048 x 2048 matrices
const COMPRESSORS = autoCandidates(Array.from({ length: 4 }, () => ({ shape: [2048, 2048], size: 2048 * 2048 }))).profiles
const CODECS = COMPRESSORS.map((c) => c.name)
const flat = (p: number): Topology => Array.from({ length: p }, (_, i) => ({ nodeId: `n${i}`, server: "s" }))
const twoServers = (perNode: number): Topology => [
  ...Array.from({ length: perNode }, () => ({ nodeId: "a", server: "s1" })),
  ...Array.from({ length: perNode }, () => ({ nodeId: "b", server: "s2" }))
]

describe("chooseAlgorithm", () => {
  it("picks tree for small buckets and ring for large ones on a flat cluster", () => {
    const small = chooseAlgorithm(4 * KiB, flat(8), m, ALGOS)
    expect(small.algorithm).toBe("tree")
    expect(small.reason).toMatch(/^tree is [\d.]+x faster than the next best/)
    expect(chooseAlgorithm(64 * MiB, flat(8), m, ALGOS).algorithm).toBe("ring")
  })

  it("picks hierarchical when the link between servers is slow", () => {
    const slow: CostModel = { links: { ...m.links, "cross-server": { alphaMs: 2, betaMsPerByte: 20 / 550_000 } } }
    const c = chooseAlgorithm(16 * MiB, twoServers(4), slow, ALGOS)
    expect(c.algorithm).toBe("hierarchical")
    expect(c.predictions.map((p) => p.algorithm)).toEqual(NAMES)
  })

  it("respects the candidate list and explains ties and single ranks", () => {
    expect(chooseAlgorithm(4 * KiB, flat(8), m, ALGOS, ["ring"]).algorithm).toBe("ring")
    expect(chooseAlgorithm(4 * KiB, flat(8), m, ALGOS, ["ring"]).reason).toContain("only candidate")
    expect(chooseAlgorithm(MiB, flat(1), m, ALGOS).reason).toContain("single rank")
    // Two ranks on one node, one chunk: tree and hierarchical both send one message up and one
    // down, so they cost the same; tree comes first. (Ring no longer ties at p = 2: each of its
    // steps puts two messages through the hub at once.)
    const oneNode: Topology = [{ nodeId: "a", server: "s" }, { nodeId: "a", server: "s" }]
    const tie = chooseAlgorithm(KiB, oneNode, m, ALGOS, ["tree", "hierarchical"])
    expect(tie.algorithm).toBe("tree")
    expect(tie.reason).toContain("ties with hierarchical")
    expect(chooseAlgorithm(KiB, flat(2), m, ALGOS).algorithm).toBe("tree")
  })

  it("the winner is never slower than any candidate (property)", () => {
    const arbTopo = fc
      .array(fc.integer({ min: 0, max: 3 }), { minLength: 1, maxLength: 10 })
      .map((ns) => [...ns].sort().map((n) => ({ nodeId: `n${n}`, server: `s${n % 2}` })))
    fc.assert(
      fc.property(arbTopo, fc.integer({ min: 0, max: 256 * MiB }), (topo, bytes) => {
        const c = chooseAlgorithm(bytes, topo, m, ALGOS)
        for (const p of predictAll(bytes, topo, m, ALGOS)) expect(c.ms).toBeLessThanOrEqual(p.ms)
      }),
      { numRuns: 100 }
    )
  })
})

describe("compression 'auto'", () => {
  // One step sends 4 buckets of 16 MiB over 4 ranks on one server: ~ 740 ms uncompressed.
  const base: CommunicationRequest = { bucketBytes: [16 * MiB, 16 * MiB, 16 * MiB, 16 * MiB], topology: flat(4), model: m, algorithms: ALGOS, compressors: COMPRESSORS }
  const uncompressed = planCommunication(base).uncompressedMs

  it("does not compress when communication fits under compute", () => {
    const plan = planCommunication({ ...base, computeMs: uncompressed * 1.1 })
    expect(plan.compression.chosen).toBe("none")
    expect(plan.compression.reason).toContain("the network is not the bottleneck")
    expect(plan.predictedCommMs).toBe(uncompressed)
  })

  it("picks fp16 first when it closes most of the gap", () => {
    const plan = planCommunication({ ...base, computeMs: uncompressed / 1.5 })
    expect(plan.compression.chosen).toBe("fp16")
    expect(plan.compression.reason).toContain("within 2x compute")
    expect(plan.schedule.every((s) => s.wireBytes === 8 * MiB)).toBe(true)
    expect(plan.predictedCommMs).toBeLessThan(uncompressed)
  })

  it("escalates to an aggressive compressor when fp16 leaves communication far above compute", () => {
    const plan = planCommunication({ ...base, computeMs: uncompressed / 20 })
    expect(CODECS.slice(1)).toContain(plan.compression.chosen)
    const chosen = plan.compression.candidates.find((c) => c.name === plan.compression.chosen)!
    for (const c of plan.compression.candidates) expect(chosen.totalMs).toBeLessThanOrEqual(c.totalMs)
    expect(plan.compression.reason).toContain(`${CODECS[0]} would still leave`)
  })

  it("measured codec cost can make compression not pay", () => {
    const slowCodecs = COMPRESSORS.map((c) => ({ ...c, codecMsPerByte: 1e-3 }))
    const plan = planCommunication({ ...base, computeMs: 1, compressors: slowCodecs })
    expect(plan.compression.chosen).toBe("none")
    expect(plan.compression.reason).toContain("no compressor is predicted to beat sending uncompressed")
  })

  it("without a measured compute time, does not guess", () => {
    expect(planCommunication(base).compression.chosen).toBe("none")
    expect(planCommunication(base).compression.reason).toContain("warm-up")
  })

  it("'none', a forced compressor, and one the model has no price for", () => {
    expect(planCommunication({ ...base, computeMs: 1, compression: "none" }).compression.chosen).toBe("none")
    const topk = planCommunication({ ...base, computeMs: 1e9, compression: "topk" })
    expect(topk.compression.chosen).toBe("topk")
    expect(topk.schedule.every((s) => s.algorithm === "allgather")).toBe(true)
    // a codec without a price still runs (the reducer makes it): the plan says so, and prices it uncompressed
    const unpriced = planCommunication({ ...base, computeMs: 1, compression: "zstd" })
    expect(unpriced.compression.chosen).toBe("zstd")
    expect(unpriced.compression.reason).toContain(`compression 'zstd' was asked for, but the cost model has no price for it (priced: ${CODECS.join(", ")})`)
    expect(unpriced.predictedCommMs).toBe(unpriced.uncompressedMs)
  })

  it("prices a codec the run asked for with its own config: sign and int8, which 'auto' never picks, and a top-k of another density", () => {
    const layout = Array.from({ length: 4 }, () => ({ shape: [2048, 2048], size: 2048 * 2048 }))
    // sign: 1 bit an element and a 32-bit scale a chunk of 1024 (its default); int8: 8 bits and the same a chunk of 4096
    expect(askedProfile({ type: "sign" }, layout)).toMatchObject({ name: "sign", collective: "allgather" })
    expect(askedProfile({ type: "sign" }, layout)!.ratio).toBeGreaterThan(30)
    expect(askedProfile({ type: "int8" }, layout)!.ratio).toBeCloseTo(32 / (8 + 32 / 4096), 2)
    expect(askedProfile({ type: "topk", ratio: 0.1 }, layout)!.ratio).toBe(5)
    expect(askedProfile({ type: "powersgd", rank: 2 }, layout)).toMatchObject({ name: "powersgd", rounds: 2, ratio: 512 })
    expect(askedProfile("fp16", layout)!.ratio).toBe(2)
    expect(askedProfile("none", layout)).toBeUndefined()
    // the plan then says the codec that runs, priced (it had said "unknown compressor 'sign' ... sending uncompressed")
    const slots = layout.map((l, i) => ({ ...l, name: `w${i}`, offset: i * l.size }))
    for (const asked of [{ type: "sign" }, { type: "int8" }, { type: "topk", ratio: 0.1 }] as const) {
      const plan = planCommunication({ ...base, compression: asked.type, compressors: compressorProfiles(slots, asked).profiles })
      expect(plan.compression.chosen, asked.type).toBe(asked.type)
      expect(plan.compression.reason, asked.type).toMatch(new RegExp(`compression '${asked.type}' was asked for \\(predicted`))
      expect(plan.predictedCommMs, asked.type).toBeLessThan(plan.uncompressedMs)
    }
  })

  it("says when a codec asked for saves little of a measured step, and not before compute is measured or where it saves much", () => {
    const asked = { ...base, compression: "topk" }
    const u = planCommunication(base).uncompressedMs
    // compute 50x the communication: top-k saves about 2% of a step (1/51 of it at most)
    const little = planCommunication({ ...asked, computeMs: 50 * u })
    expect(little.compression.chosen).toBe("topk")
    expect(little.compression.note).toBe("saves ~2% of a step here")
    expect(little.compression.reason).toMatch(/the network is not what holds the step back.*'auto' would send uncompressed here/)
    // compute a tenth of the communication: it saves most of the step, and nothing is said
    expect(planCommunication({ ...asked, computeMs: u / 10 }).compression.note).toBeUndefined()
    expect(planCommunication(asked).compression.note).toBeUndefined()
  })

  it("a single rank never compresses", () => {
    expect(planCommunication({ ...base, topology: flat(1), computeMs: 0 }).compression.chosen).toBe("none")
  })

  it("re-picks the algorithm at the compressed size", () => {
    // 256 KiB buckets at p = 8: fp16 halves them; the per-bucket algorithm is chosen for 128 KiB.
    const plan = planCommunication({ bucketBytes: [256 * KiB], topology: flat(8), model: m, algorithms: ALGOS, compressors: COMPRESSORS, computeMs: 0.001, compression: "fp16" })
    expect(plan.schedule[0]!.algorithm).toBe(chooseAlgorithm(128 * KiB, flat(8), m, ALGOS).algorithm)
  })
})

describe("explain", () => {
  it("gives readable text and JSON with every candidate's predicted time and the reason", () => {
    const plan = planCommunication({ bucketBytes: [MiB, 25 * MiB], topology: flat(4), model: m, algorithms: ALGOS, compressors: COMPRESSORS, computeMs: 50 })
    const { text, json } = explain(plan)
    expect(text.split("\n").length).toBeGreaterThan(5)
    expect(text).toContain("all-reduce plan: 4 rank(s) on 4 node(s), 1 NATS server(s); 2 bucket(s), 26 MiB per step")
    expect(text).toMatch(new RegExp(`bucket 0 \\(1 MiB\\): [\\w-]+ \\[${NAMES.map((a) => `${a} [\\d.]+\\*?`).join(", ")} ms\\]`))
    expect(text).toContain("compression: ")
    const round = JSON.parse(JSON.stringify(json))
    expect(round).toEqual(json)
    for (const b of json.buckets) {
      expect(Object.keys(b.predictedMs)).toEqual(NAMES)
      expect(b.predictedMs[b.chosen]).toBe(Math.min(...Object.values(b.predictedMs)))
      expect(b.reason.length).toBeGreaterThan(10)
    }
    expect(json.compression.candidates.map((c) => c.name)).toEqual(CODECS)
  })

  it("notes link classes the model did not measure", () => {
    const plan = planCommunication({ bucketBytes: [MiB], topology: flat(2), model: { ...m, fits: {}, assumed: { "cross-server": "same-server" } }, algorithms: ALGOS, compressors: COMPRESSORS })
    expect(explain(plan).text).toContain("not measured, borrowed: cross-server <- same-server")
  })
})
