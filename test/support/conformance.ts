// The conformance suite every registered all-reduce algorithm and codec must pass, as vitest
// describe blocks over lists the caller takes from the registries: test/conformance.test.ts runs it
// on the built-ins, test/registry-proof.test.ts on an algorithm and a codec registered by a test
// alone. `preload`: modules the rank processes import first (the registrations they need).
//
// Algorithms: the entry (name, code, hint, cost stages that name real ranks, a finite prediction),
// then real all-reduces over a nats-server with one process per rank, p = 1, 2, 3, 5, every reduce
// op, fp16 on the wire, binary16 input, without fan-out, concurrent calls, lengths from 0 to many
// chunks: each matches the float64 reference and is bitwise identical on every rank; and ranks
// that run another algorithm fail with OpMismatch (the code on the wire tells them apart).
// Codecs: the config (example accepted, unknown options refused), the codec fits its entry, the
// message contract of its aggregation, error feedback's invariant (what was aggregated plus every
// residual equals every gradient, step after step) in the simulation, and GradientReducer steps
// over NATS that equal the simulation and are bitwise identical on every rank.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../../core/nats-server.ts"
import { ConfigError, WireDecodeError } from "../../core/errors.ts"
import { allowedAlgorithms, findAllReduceAlgorithm, parseAlgorithmChoice, type AllReduceAlgorithmEntry } from "../../collectives/algorithms/index.ts"
import { describeOp } from "../../collectives/communicator.ts"
import { Opcode, variantOf } from "../../collectives/frames.ts"
import {
  ErrorFeedback,
  allowedCodecTypes,
  codecOf,
  createCompressor,
  findCodec,
  inProcessAllReduce,
  parseCompressionConfig,
  simulateCompressedAllReduce,
  type Codec,
  type Compressor,
  type ResolvedCompressionConfig
} from "../../collectives/compression/index.ts"
import { Mulberry32 } from "../../collectives/compression/rng.ts"
import { defaultCostModel, predictAllReduce, type Topology } from "../../scheduler/cost-model.ts"
import type { Case, CaseResult } from "./collectives-cases.ts"
import { RankFleet } from "./collectives-fleet.ts"
import { CompressionFleet } from "./compression-fleet.ts"
import type { SlotSpec } from "./compression-cases.ts"
import { Simulation, groupShape, maxAbs, maxDiff, sameBits, tolerance } from "./compression-sim.ts"

export interface ConformanceOptions {
  /** Absolute paths of modules every rank process imports before the tests (registrations). */
  readonly preload?: ReadonlyArray<string>
}

// ---------------------------------------------------------------------------------------------
// algorithms

const WORLD_SIZES = [1, 2, 3, 5]
const MAX_P = Math.max(...WORLD_SIZES)
// Small chunks and windows, so modest buffers span many chunks and exercise pipelining and credits.
const CHUNK_BYTES = 1024
const WINDOW_BYTES = 4096

const topologies = (p: number): Record<string, Topology> => ({
  flat: Array.from({ length: p }, (_, r) => ({ nodeId: `n${r}`, server: "s" })),
  "two nodes": Array.from({ length: p }, (_, r) => ({ nodeId: `n${r % 2}`, server: "s" })),
  "two servers": Array.from({ length: p }, (_, r) => ({ nodeId: `n${r}`, server: `s${r < p / 2 ? 0 : 1}` }))
})

/** The entry's declared cost stages only name ranks of the group, move bytes, and repeat whole times. */
const stageProblems = (a: AllReduceAlgorithmEntry): string[] => {
  const problems: string[] = []
  for (let p = 2; p <= 9; p++) {
    for (const [label, topology] of Object.entries(topologies(p))) {
      for (const bytes of [4, 1000, 1 << 20, 64 << 20]) {
        for (const fanout of [true, false]) {
          const at = `p=${p} ${label} ${bytes} B fanout ${fanout}`
          const phases = a.stages({ bytes, topology, chunkBytes: 1 << 20, hierarchy: "node", fanout })
          if (phases.length === 0) problems.push(`${at}: no phases`)
          for (const ph of phases) {
            if (typeof ph.name !== "string" || ph.name.length === 0) problems.push(`${at}: a phase without a name`)
            for (const st of ph.stages) {
              if (!Number.isInteger(st.times) || st.times < 1) problems.push(`${at}: ${ph.name} repeats a stage ${st.times} times`)
              for (const f of st.flows) {
                const bad = !(f.src >= 0 && f.src < p) || f.dsts.length === 0 || f.dsts.some((d) => !(d >= 0 && d < p) || d === f.src)
                if (bad || !(f.bytes >= 0 && Number.isFinite(f.bytes))) problems.push(`${at}: ${ph.name} has flow ${JSON.stringify(f)}`)
              }
            }
          }
          if (!fanout) continue
          const pred = predictAllReduce(a, bytes, topology, defaultCostModel())
          if (!(pred.ms > 0 && Number.isFinite(pred.ms))) problems.push(`${at}: predicted ${pred.ms} ms`)
        }
      }
    }
  }
  return problems.slice(0, 10)
}

/** Lengths worth running for p ranks: empty, one, fewer than p, several chunks per rank, not divisible by p. */
const lengthsFor = (p: number): number[] => [...new Set([0, 1, Math.max(0, p - 1), 3 * (CHUNK_BYTES / 4) * p + 7, 5003])]

const casesFor = (a: AllReduceAlgorithmEntry, p: number): Case[] => {
  let seed = 1000 * p + a.code
  const next = (): number => (seed = (seed * 48271) % 2147483647)
  const algorithm = a.name
  const cases: Case[] = []
  for (const reduce of ["sum", "mean", "max", "weightedMean"] as const) {
    for (const length of lengthsFor(p)) cases.push({ op: "allReduce", algorithm, reduce, length, seed: next() })
  }
  for (const reduce of ["sum", "weightedMean"] as const) cases.push({ op: "allReduce", algorithm, reduce, wire: "f16", length: 2999, seed: next() })
  cases.push({ op: "allReduce", algorithm, reduce: "sum", wire: "f16", length: 4001, seed: next(), halfInput: true })
  if (a.usesFanout) {
    cases.push({ op: "allReduce", algorithm, reduce: "weightedMean", length: 3001, seed: next(), fanout: false })
    cases.push({ op: "allReduce", algorithm, reduce: "sum", wire: "f16", length: 1999, seed: next(), fanout: false, halfInput: true })
  }
  cases.push({ op: "allReduce", algorithm, reduce: "sum", length: 1500, seed: next(), hierarchy: "server" })
  cases.push({ op: "allReduce", algorithm, reduce: "sum", length: 700, seed: next(), concurrent: 3 })
  return cases
}

/** Each case's failures on any rank, and results that differ across ranks. */
const failuresOf = (cases: ReadonlyArray<Case>, results: ReadonlyArray<ReadonlyArray<CaseResult>>): string[] => {
  const failures: string[] = []
  cases.forEach((c, i) => {
    const per = results.map((r) => r[i]!)
    per.forEach((r, rank) => {
      if (!r.ok) failures.push(`case ${i} ${JSON.stringify(c)} rank ${rank}: ${r.detail}`)
    })
    if (new Set(per.map((r) => r.hash)).size !== 1) failures.push(`case ${i} ${JSON.stringify(c)}: results differ across ranks`)
  })
  return failures
}

export const algorithmConformance = (names: ReadonlyArray<string>, options: ConformanceOptions = {}): void => {
  describe(`all-reduce algorithm conformance: ${names.join(", ")}`, () => {
    let server: NatsServerProcess
    let fleet: RankFleet
    let groups = 0

    beforeAll(async () => {
      server = await launchNatsServer({ jetstream: false })
      fleet = await RankFleet.start({ size: MAX_P, server: () => server.url })
      for (const module of options.preload ?? []) await fleet.all(MAX_P, () => ({ cmd: "import", module }))
    })

    afterAll(async () => {
      await fleet?.stop()
      await server?.stop()
    })

    const create = async (p: number, timeoutMs = 20_000): Promise<string> => {
      const group = `conf${groups++}`
      // two interleaved nodes (ranks 0, 2, 4 and 1, 3): node groups whose leaders are not neighbours
      await fleet.all(p, (rank) => ({ cmd: "create", group, rank, worldSize: p, node: `node${rank % 2}`, timeoutMs, chunkBytes: CHUNK_BYTES, windowBytes: WINDOW_BYTES }))
      return group
    }

    for (const name of names) {
      it(`${name}: its entry, config name, frame code and cost stages`, () => {
        const a = findAllReduceAlgorithm(name)
        expect(a, `"${name}" is registered`).toBeDefined()
        if (!a) return
        expect(a.hint.length).toBeGreaterThan(10)
        expect(parseAlgorithmChoice(name, "collectiveConfig.algorithm")).toBe(name)
        expect(allowedAlgorithms()).toContain(`"${name}"`)
        expect(describeOp(Opcode.allReduce, variantOf(a.code, 0, false))).toBe(`allReduce(${name}, sum, f32)`)
        expect(stageProblems(a)).toEqual([])
        // one rank costs nothing
        expect(predictAllReduce(a, 1 << 20, topologies(1).flat!, defaultCostModel()).ms).toBe(0)
      })

      for (const p of WORLD_SIZES) {
        it(`${name}, p = ${p}: every reduce op, wire format and option matches the reference, bitwise identical on every rank`, async () => {
          const a = findAllReduceAlgorithm(name)!
          const group = await create(p)
          const cases = casesFor(a, p)
          const results = await fleet.all<Array<CaseResult & { index: number }>>(p, () => ({ cmd: "run", group, cases }))
          await fleet.all(p, () => ({ cmd: "close", group }))
          expect(failuresOf(cases, results)).toEqual([])
        }, 60_000)
      }

      it(`${name}: ranks running another algorithm fail with OpMismatch, not a hang`, async () => {
        const other = name === "ring" ? "tree" : "ring"
        const group = await create(3, 10_000)
        const replies = await Promise.all(
          [0, 1, 2].map((rank) =>
            fleet.request<CaseResult[]>(rank, { cmd: "run", group, cases: [{ op: "allReduce", algorithm: rank === 1 ? other : name, reduce: "sum", length: 3000, seed: 5 }] })
          )
        )
        const tags = replies.map((r) => (r.ok ? "ok" : r.error.tag))
        for (const tag of tags) expect(["OpMismatch", "CollectiveAborted", "CollectiveProtocolError"]).toContain(tag)
        expect(tags).toContain("OpMismatch")
        await fleet.all(3, () => ({ cmd: "close", group }))
      }, 60_000)
    }
  })
}

// ---------------------------------------------------------------------------------------------
// codecs

const randn = (n: number, rng: Mulberry32, scale = 1): Float32Array => Float32Array.from({ length: n }, () => rng.normal() * scale)

/** The config the suite runs a codec with: the one 'auto' would switch to, else its example. */
const configOf = (name: string): ResolvedCompressionConfig => {
  const e = findCodec(name)!
  return (e.auto?.config ?? e.example) as ResolvedCompressionConfig
}

const hasMessages = (c: Codec): c is Codec & Compressor => typeof (c as Partial<Compressor>).encode === "function"

/** The byte-message contract (compressor.ts), for a codec that has messages. */
const messageProblems = (name: string, c: Compressor): string[] => {
  const problems: string[] = []
  const rng = new Mulberry32(3)
  for (const n of [1, 7, 1000, 5000]) {
    const x = randn(n, rng)
    const before = x.slice()
    const msg = c.encode(x, { key: "t", step: 1, rank: 0 })
    if (!sameBits(x, before)) problems.push(`n=${n}: encode modified its input`)
    if (msg.bytes.byteLength !== c.wireBytes(n)) problems.push(`n=${n}: ${msg.bytes.byteLength} bytes, wireBytes says ${c.wireBytes(n)}`)
    if (findCodec(name)?.wireId !== undefined && codecOf(msg) !== name) problems.push(`n=${n}: the header names ${codecOf(msg)}`)
    const d = c.decode(msg)
    if (d.length !== n || !d.every(Number.isFinite)) problems.push(`n=${n}: decode gave ${d.length} values, some not finite`)
    // accumulate = into + weight · decode
    const into = randn(n, rng)
    const want = Float32Array.from(into, (v, i) => v + 0.5 * d[i]!)
    c.accumulate(msg, into, 0.5)
    if (maxDiff(into, want) > 1e-6 * Math.max(1, maxAbs(want))) problems.push(`n=${n}: accumulate differs from decode by ${maxDiff(into, want)}`)
    if (c.sumInto) {
      const other = c.encode(randn(n, rng), { key: "t", step: 2, rank: 1 })
      const a = new Float32Array(n).fill(7)
      c.sumInto([msg, other], a)
      const b = new Float32Array(n)
      c.accumulate(msg, b, 1)
      c.accumulate(other, b, 1)
      if (!sameBits(a, b)) problems.push(`n=${n}: sumInto differs from accumulating the messages`)
    }
    if (c.encodeFeedback) {
      const g = randn(n, rng)
      const e1 = randn(n, rng, 0.1)
      const e2 = e1.slice()
      const fused = c.encodeFeedback(g, 0.25, e1, { key: "t", step: 3, rank: 0 })
      for (let i = 0; i < n; i++) e2[i] = Math.fround(e2[i]! + Math.fround(g[i]! * 0.25))
      const plain = c.encode(e2, { key: "t", step: 3, rank: 0 })
      c.accumulate(plain, e2, -1)
      if (Buffer.compare(Buffer.from(fused.bytes), Buffer.from(plain.bytes)) !== 0 || !sameBits(e1, e2)) problems.push(`n=${n}: encodeFeedback differs from its three steps`)
    }
    let threw: unknown
    try {
      c.decode(msg.bytes.subarray(0, msg.bytes.byteLength - 1))
    } catch (e) {
      threw = e
    }
    if (n > 1 && !(threw instanceof WireDecodeError)) problems.push(`n=${n}: a truncated message did not fail with WireDecodeError`)
  }
  return problems
}

/**
 * Error feedback through the simulated group (p = 4, 25 steps): Σ aggregates + Σ every residual
 * == Σ every gradient, to the rounding of what the aggregation adds up (fp16's ring rounds its
 * partial sums to binary16 without compensation: a bound of its own).
 */
const feedbackProblems = async (name: string, config: ResolvedCompressionConfig): Promise<string[]> => {
  const p = 4
  const shape = [40, 25]
  const n = 1000
  const probe = createCompressor(config)
  const comps = Array.from({ length: p }, () => createCompressor(config))
  const efs = Array.from({ length: p }, () => new ErrorFeedback())
  const rng = new Mulberry32(21)
  const sumA = new Float64Array(n)
  const sumG = new Float64Array(n)
  let gMax = 0
  for (let t = 0; t < 25; t++) {
    const grads = Array.from({ length: p }, () => randn(n, rng))
    for (const g of grads) {
      gMax += maxAbs(g)
      for (let i = 0; i < n; i++) sumG[i] += g[i]!
    }
    let agg: Float32Array
    if (probe.aggregation === "custom") {
      // the codec's own rounds, through p in-process sum all-reduces
      const sums = inProcessAllReduce(p)
      const outs = grads.map(() => new Float32Array(n))
      await Promise.all(
        comps.map((c, r) => (c.aggregation === "custom" ? c.reduce([{ key: "W", shape, grad: grads[r]!, out: outs[r] }], sums[r]!, c.errorFeedback ? efs[r] : undefined, 1) : undefined))
      )
      if (outs.some((o) => !sameBits(o, outs[0]!))) return [`step ${t}: ranks got different aggregates`]
      agg = outs[0]!
    } else agg = simulateCompressedAllReduce(grads, comps, efs, { key: "W", step: t, shape })
    for (let i = 0; i < n; i++) sumA[i] += agg[i]!
    const res = new Float64Array(n)
    for (const ef of efs) for (const k of ef.keys()) ef.get(k)!.forEach((v, i) => (res[i] += v))
    const resMax = res.reduce((m, v) => Math.max(m, Math.abs(v)), 0)
    const tol = probe.aggregation === "linear" && probe.castsToWire ? (t + 1) * p * 2 ** -11 * 16 : 2 ** -16 * (gMax + (t + 1) * resMax)
    for (let i = 0; i < n; i++) {
      const err = Math.abs(sumA[i]! + res[i]! - sumG[i]!)
      if (!(err <= tol)) return [`${name} step ${t}, element ${i}: |Σ aggregates + Σ residuals - Σ gradients| = ${err} > ${tol}`]
    }
  }
  return []
}

// A small model: matrix kernels (PowerSGD compresses them) and 1-D biases, several buckets.
const SLOTS: SlotSpec[] = [
  { name: "out/bias", shape: [10] },
  { name: "out/kernel", shape: [40, 10] },
  { name: "hidden/bias", shape: [40] },
  { name: "hidden/kernel", shape: [96, 40] }
]
const GROUP = groupShape(SLOTS, [3, 1, 2], 8 * 1024, 1024)

export const codecConformance = (names: ReadonlyArray<string>, options: ConformanceOptions = {}): void => {
  describe(`codec conformance: ${names.join(", ")}`, () => {
    let server: NatsServerProcess
    let fleet: CompressionFleet
    let groups = 0

    beforeAll(async () => {
      server = await launchNatsServer({ jetstream: false })
      fleet = await CompressionFleet.start(GROUP.p, server.url)
      for (const module of options.preload ?? []) await fleet.all(() => ({ cmd: "import", module }))
    })

    afterAll(async () => {
      await fleet?.stop()
      await server?.stop()
    })

    for (const name of names) {
      it(`${name}: its config (example accepted, unknown options refused) and a codec that fits its entry`, () => {
        const entry = findCodec(name)
        expect(entry, `"${name}" is registered`).toBeDefined()
        if (!entry) return
        expect(allowedCodecTypes()).toContain(`"${name}"`)
        const example = (typeof entry.example === "string" ? { type: entry.example } : entry.example) as { readonly type: string }
        expect(parseCompressionConfig(example)).toEqual(example)
        if (entry.shorthand) expect(parseCompressionConfig(name)).toBe(name)
        let refused: unknown
        try {
          parseCompressionConfig({ ...example, notAnOption: 1 }, "collectiveConfig.compression")
        } catch (e) {
          refused = e
        }
        expect(refused).toBeInstanceOf(ConfigError)
        expect((refused as ConfigError).field).toBe("collectiveConfig.compression.notAnOption")
        const codec = createCompressor(configOf(name))
        expect(codec.name).toBe(name)
        expect(codec.aggregation).toBe(entry.aggregation)
        if (hasMessages(codec)) expect(messageProblems(name, codec)).toEqual([])
        if (codec.aggregation === "linear") {
          const x = randn(101, new Mulberry32(5))
          const y = new Float32Array(codec.domainLength(101))
          const back = new Float32Array(101)
          codec.toDomain(x, y)
          codec.fromDomain(y, back)
          expect(back.every(Number.isFinite)).toBe(true)
        }
      })

      it(`${name}: error feedback loses nothing through the simulated group, step after step`, async () => {
        expect(await feedbackProblems(name, configOf(name))).toEqual([])
      })

      it(`${name}: GradientReducer steps over NATS (${GROUP.p} rank processes) equal the simulation, bitwise identical on every rank`, async () => {
        const config = configOf(name)
        const group = `codec${groups++}`
        await fleet.all((rank) => ({
          cmd: "create",
          name: group,
          rank,
          worldSize: GROUP.p,
          compression: config,
          algorithm: "ring",
          bucketBytes: GROUP.bucketBytes,
          firstBucketBytes: GROUP.firstBucketBytes,
          timeoutMs: 20_000,
          chunkBytes: 4096
        }))
        const codec = createCompressor(config)
        // a custom codec without a lock-step form has no simulation: identical results are checked
        const simulated = codec.aggregation !== "custom" || typeof (codec as { begin?: unknown }).begin === "function"
        const sim = new Simulation(config, GROUP)
        for (let step = 0; step < 2; step++) {
          const replies = await fleet.all<{ hash: string; data: Float32Array; stats: { wireBytes: number } }>((rank) => ({
            cmd: "reduce",
            name: group,
            slots: SLOTS,
            seed: 40 + step,
            step,
            weight: GROUP.weights[rank],
            returnData: true
          }))
          expect(new Set(replies.map((r) => r.hash)).size).toBe(1)
          const got = replies[0]!.data
          expect(got.every(Number.isFinite)).toBe(true)
          expect(replies[0]!.stats.wireBytes).toBeGreaterThan(0)
          if (!simulated) continue
          const want = sim.step(40 + step, step)
          const tol = tolerance(config)
          if (tol === 0) expect(sameBits(got, want), `step ${step}: max |diff| ${maxDiff(got, want)}`).toBe(true)
          else expect(maxDiff(got, want), `step ${step}`).toBeLessThanOrEqual(tol * maxAbs(want))
        }
        await fleet.all(() => ({ cmd: "close", name: group }))
      }, 60_000)
    }
  })
}
