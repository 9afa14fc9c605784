// GradientReducer with every compressor over a real nats-server, 4 ranks in separate processes:
// each step's reduced gradient equals the in-process simulation (simulateCompressedAllReduce fed
// the same scaled per-rank gradients, bucket by bucket, with one error-feedback store per rank),
// is bitwise identical on every rank, and the error-feedback state survives state() -> checkpoint
// encoding -> restore() into a fresh reducer, which then continues exactly like the original.
import { randomBytes } from "node:crypto"
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { decodeMessage, encodeMessage } from "../core/wire.ts"
import { codecs, createCompressor, formatConfig, ringSegment, type ResolvedCompressionConfig } from "../collectives/compression/index.ts"
import type { ReducerStats } from "../collectives/gradient-reducer.ts"
import { simdAvailable } from "../collectives/simd.ts"
import { CompressionFleet } from "./support/compression-fleet.ts"
import type { SlotSpec } from "./support/compression-cases.ts"
import { Simulation, groupShape, maxAbs, maxDiff, sameBits, tolerance } from "./support/compression-sim.ts"

const P = 4
const WEIGHTS = [3, 1, 2, 2] // samples per rank: the result is the weighted mean
const BUCKET_BYTES = 16 * 1024
const FIRST_BUCKET_BYTES = 2 * 1024
// Matrix-shaped kernels (PowerSGD compresses them) and 1-D biases (it does not); small first
// variables so the bucket plan has a small first bucket, a fused bucket and a direct one.
const SLOTS: SlotSpec[] = [
  { name: "out/bias", shape: [10] },
  { name: "out/kernel", shape: [40, 10] },
  { name: "hidden/bias", shape: [40] },
  { name: "hidden/kernel", shape: [96, 40] },
  { name: "embed/kernel", shape: [160, 128] } // > 16384 elements: several blocks of the fused fp16 loop
]
const GROUP = groupShape(SLOTS, WEIGHTS, BUCKET_BYTES, FIRST_BUCKET_BYTES)
const N = GROUP.n
const BUCKETS = GROUP.buckets

interface ReduceReply {
  readonly times: number[]
  readonly hash: string
  readonly stats: ReducerStats
  /** Whether the rank's gradient lived in the reducer's own space (gradientBuffer). */
  readonly inSpace: boolean
  /** Received frames read into that space's payload slots (Communicator.allocate), since it was made. */
  readonly slotsTaken: number
  /** Sizes in bytes the reducer chose an algorithm for (algorithm "by-size"). */
  readonly asked: number[]
  readonly data: Float32Array
}

type ReducerState = { residuals: Record<string, Float32Array>; powersgd?: { step: number; q: Record<string, Float32Array> } }

let server: NatsServerProcess
let fleet: CompressionFleet
let groups = 0

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  fleet = await CompressionFleet.start(P, server.url)
})

afterAll(async () => {
  await fleet?.stop()
  await server?.stop()
})

/**
 * A reducer group on every rank. `compression` may differ per rank (a mismatch test); `options`
 * override the defaults: a 20 s timeout and small chunks, so the buckets span several chunks and
 * pipelining is exercised too.
 */
const createGroup = async (
  compression: ResolvedCompressionConfig | ((rank: number) => ResolvedCompressionConfig),
  options: {
    readonly timeoutMs?: number
    readonly chunkBytes?: number
    readonly windowBytes?: number
    readonly algorithm?: string
    readonly direct?: { readonly secret: string; readonly transport: "direct" }
  } = { timeoutMs: 20_000, chunkBytes: 4096 }
): Promise<string> => {
  const name = `g${groups++}`
  await fleet.all((rank) => ({
    cmd: "create",
    name,
    rank,
    worldSize: P,
    compression: typeof compression === "function" ? compression(rank) : compression,
    algorithm: "ring",
    bucketBytes: BUCKET_BYTES,
    firstBucketBytes: FIRST_BUCKET_BYTES,
    ...options
  }))
  return name
}

const reduceStep = (name: string, seed: number, step: number): Promise<ReduceReply[]> =>
  fleet.all<ReduceReply>((rank) => ({ cmd: "reduce", name, slots: SLOTS, seed, step, weight: WEIGHTS[rank], returnData: true }))

const expectIdenticalOnAllRanks = (replies: ReduceReply[]): void => {
  expect(new Set(replies.map((r) => r.hash)).size).toBe(1)
  for (const r of replies) expect(sameBits(r.data, replies[0].data)).toBe(true)
}

// every registered codec with the config 'auto' would switch to (it compresses from the first
// step), else its entry's example; then settings worth pinning down
const CODECS: Array<[string, ResolvedCompressionConfig]> = [
  ...codecs().map((c): [string, ResolvedCompressionConfig] => {
    const config = (c.auto?.config ?? c.example) as ResolvedCompressionConfig
    return [formatConfig(config), config]
  }),
  ["int8, chunks of 512", { type: "int8", chunkSize: 512 }],
  ["topk 5%, no error feedback", { type: "topk", ratio: 0.05, errorFeedback: false }],
  ["powersgd rank 2, 1 warm-up step", { type: "powersgd", rank: 2, warmupSteps: 1 }]
]
const STEPS = 3

describe("GradientReducer over NATS (and the direct links where a case says so), 4 rank processes", () => {
  for (const [label, config] of CODECS) {
    it(`${label}: ${STEPS} steps equal the simulation, bitwise identical on every rank; residuals round-trip`, async () => {
      const name = await createGroup(config)
      const sim = new Simulation(config, GROUP)
      const tol = tolerance(config)
      const ef = typeof config === "object" && "errorFeedback" in config ? config.errorFeedback !== false : config !== "none"
      for (let step = 0; step < STEPS; step++) {
        const seed = 100 + step
        const replies = await reduceStep(name, seed, step)
        expectIdenticalOnAllRanks(replies)
        // codecs with error feedback work on the gradient in the reducer's own space
        for (const r of replies) expect(r.inSpace).toBe(ef && simdAvailable())
        const want = sim.step(seed, step)
        const got = replies[0].data
        const diff = maxDiff(got, want)
        if (tol === 0) expect(sameBits(got, want), `step ${step}: max |diff| ${diff}`).toBe(true)
        else expect(diff, `step ${step}`).toBeLessThanOrEqual(tol * maxAbs(want))
        // the weighted mean of unit-scale gradients: not all zeros, not blown up
        expect(maxAbs(got)).toBeGreaterThan(0.05)
        expect(maxAbs(got)).toBeLessThan(10)
        const stats = replies[0].stats
        expect(stats.denseBytes).toBe(N * 4)
        expect(stats.steps).toBe(step + 1)
      }

      // The residual state each rank reports is what the simulation's per-rank stores hold.
      const states = await fleet.all<ReducerState>(() => ({ cmd: "state", name }))
      for (let r = 0; r < P; r++) {
        const want = sim.residuals(r)
        const got = states[r].residuals
        if (!ef || sim.isCustom) {
          // PowerSGD keys its residuals by tensor; its state also carries the warm-start factors.
          expect(Object.keys(got).sort()).toEqual(Object.keys(want).sort())
        } else {
          expect(Object.keys(got)).toEqual(BUCKETS.map((_, k) => `bucket${k}`).filter((k) => k in want))
        }
        if (!ef) expect(Object.keys(got)).toEqual([])
        for (const [key, e] of Object.entries(want)) {
          if (tol === 0) expect(sameBits(got[key], e), `rank ${r} residual ${key}`).toBe(true)
          else expect(maxDiff(got[key], e)).toBeLessThanOrEqual(tol * Math.max(1e-3, maxAbs(e)) * 10)
        }
        if (sim.isCustom) expect(states[r].powersgd?.step).toBe(STEPS)
      }
      if (ef) expect(Object.values(states[0].residuals).some((e) => maxAbs(e) > 0)).toBe(true)

      // Round trip: through the checkpoint encoding into a fresh reducer, which then takes the
      // next step exactly like the original; a fresh reducer without the state does not.
      const restoredName = await createGroup(config)
      const freshName = await createGroup(config)
      await fleet.all((r) => ({ cmd: "restore", name: restoredName, state: decodeMessage(encodeMessage(states[r])) }))
      const seed = 100 + STEPS
      const original = await reduceStep(name, seed, STEPS)
      const restored = await reduceStep(restoredName, seed, STEPS)
      const fresh = await reduceStep(freshName, seed, STEPS)
      expectIdenticalOnAllRanks(restored)
      expect(sameBits(restored[0].data, original[0].data)).toBe(true)
      if (ef || sim.isCustom) expect(sameBits(fresh[0].data, original[0].data)).toBe(false)
      const after = await fleet.all<ReducerState>(() => ({ cmd: "state", name: restoredName }))
      const afterOriginal = await fleet.all<ReducerState>(() => ({ cmd: "state", name }))
      for (let r = 0; r < P; r++) {
        for (const [key, e] of Object.entries(afterOriginal[r].residuals)) expect(sameBits(after[r].residuals[key], e)).toBe(true)
      }
      for (const n of [name, restoredName, freshName]) await fleet.all(() => ({ cmd: "close", name: n }))
    }, 60_000)
  }

  for (const [label, windowBytes] of [
    ["", undefined],
    // a window of one chunk: a relay that cannot hold a message adds it through the buffer (HalfSource.load)
    [", window of one chunk", 4096]
  ] as const) it(`fp16${label}: residuals nonzero everywhere (restored from a checkpoint of another layout) are folded in where a rank relays and spent there; afterwards each rank's residual is nonzero only on the segment it casts`, async () => {
    const name = await createGroup("fp16", { timeoutMs: 20_000, chunkBytes: 4096, ...(windowBytes ? { windowBytes } : {}) })
    const sim = new Simulation("fp16", GROUP)
    let x = 12345
    const noise = (n: number): Float32Array =>
      Float32Array.from({ length: n }, () => {
        x = (Math.imul(x, 1103515245) + 12345) >>> 0
        return (x / 2 ** 32 - 0.5) * 1e-3
      })
    const states = Array.from({ length: P }, () => Object.fromEntries(BUCKETS.map((b, k) => [`bucket${k}`, noise(b.end - b.start)])))
    await fleet.all((r) => ({ cmd: "restore", name, state: decodeMessage(encodeMessage({ residuals: states[r] })) }))
    states.forEach((st, r) => sim.efs[r].restore(st))
    for (let step = 0; step < 2; step++) {
      const replies = await reduceStep(name, 300 + step, step)
      expectIdenticalOnAllRanks(replies)
      const want = sim.step(300 + step, step)
      expect(sameBits(replies[0].data, want), `step ${step}: max |diff| ${maxDiff(replies[0].data, want)}`).toBe(true)
      const got = await fleet.all<ReducerState>(() => ({ cmd: "state", name }))
      for (let r = 0; r < P; r++) {
        for (const [key, e] of Object.entries(sim.residuals(r))) {
          expect(sameBits(got[r].residuals[key], e), `step ${step}, rank ${r}, ${key}`).toBe(true)
          // rank r sends segment r - 1 of each bucket first (ring.ts): nonzero there only
          const [lo, hi] = ringSegment(e.length, P, (r + P - 1) % P)
          expect(e.every((v, i) => v === 0 || (i >= lo && i < hi))).toBe(true)
          expect(e.subarray(lo, hi).some((v) => v !== 0)).toBe(true)
        }
      }
    }
    await fleet.all(() => ({ cmd: "close", name }))
  }, 60_000)

  it("PowerSGD chooses each round's algorithm by that round's size, not the gradient's", async () => {
    const config: ResolvedCompressionConfig = { type: "powersgd", rank: 2 }
    const name = await createGroup(config, { timeoutMs: 20_000, chunkBytes: 4096, algorithm: "by-size" })
    const ring = await createGroup(config)
    const replies = await reduceStep(name, 7, 0)
    expectIdenticalOnAllRanks(replies)
    // round 1: the P factors of the matrices, then the raw biases; round 2: the Q factors
    const psgd = createCompressor(config) as unknown as { plan(shape: ReadonlyArray<number>): { compress: boolean; n: number; m: number; r: number } }
    const plans = SLOTS.map((s) => psgd.plan(s.shape))
    const round1 = plans.reduce((a, p) => a + (p.compress ? p.n * p.r : p.n * p.m), 0) * 4
    const round2 = plans.reduce((a, p) => a + (p.compress ? p.m * p.r : 0), 0) * 4
    for (const r of replies) expect(r.asked).toEqual([round1, round2])
    expect(round1 + round2).toBeLessThan(N * 4)
    // the same sums as ring alone, to fp32 rounding (tree adds in another order)
    const want = (await reduceStep(ring, 7, 0))[0].data
    expect(maxDiff(replies[0].data, want)).toBeLessThanOrEqual(tolerance(config) * maxAbs(want))
    for (const n of [name, ring]) await fleet.all(() => ({ cmd: "close", name: n }))
  })

  it("uncompressed over the direct links: the gradient buffer comes from Communicator.allocate, the ring's received frames land in its slots, and each step has the bits of the same ring over NATS", async () => {
    const name = await createGroup("none", { timeoutMs: 20_000, chunkBytes: 4096, direct: { secret: randomBytes(32).toString("hex"), transport: "direct" } })
    const overNats = await createGroup("none")
    for (let step = 0; step < 2; step++) {
      const seed = 300 + step
      const replies = await reduceStep(name, seed, step)
      expectIdenticalOnAllRanks(replies)
      const want = (await reduceStep(overNats, seed, step))[0]
      expect(want.inSpace).toBe(false)
      expect(sameBits(replies[0].data, want.data), `step ${step}`).toBe(true)
      for (const r of replies) {
        expect(r.inSpace).toBe(simdAvailable())
        if (simdAvailable()) expect(r.slotsTaken).toBeGreaterThan(0)
      }
    }
    for (const n of [name, overNats]) await fleet.all(() => ({ cmd: "close", name: n }))
  })

  it("a config the ranks disagree on is a typed error on every rank, not a hang", async () => {
    const name = await createGroup((rank) => (rank === 2 ? { type: "sign" } : { type: "topk", ratio: 0.01 }), { timeoutMs: 5_000 })
    const outcomes = await Promise.allSettled(
      Array.from({ length: P }, (_, rank) => fleet.call(rank, { cmd: "reduce", name, slots: SLOTS, seed: 1, step: 0, weight: 1, returnData: false }, 30_000))
    )
    // The rank that notices names the cause; the others are told the operation was aborted.
    const tags = outcomes.map((o) => (o.status === "rejected" ? ((o.reason as { error?: { tag: string } }).error?.tag ?? String(o.reason)) : "resolved"))
    for (const tag of tags) expect(["LengthMismatch", "WireDecodeError", "CollectiveAborted", "CollectiveTimeout"]).toContain(tag)
    expect(tags.some((t) => t === "LengthMismatch" || t === "WireDecodeError")).toBe(true)
    await fleet.all(() => ({ cmd: "close", name }))
  }, 60_000)
})
