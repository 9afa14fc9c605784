// Collectives end to end: ranks in separate processes over a real nats-server, every operation (the
// shift to the next rank too) and algorithm for p = 1..8, random lengths (0, 1, < p, not divisible by p, many chunks) and values,
// checked against a float64 reference and for bitwise-identical results on every rank.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsServer, type NatsServerProcess } from "../core/nats-server.ts"
import { failuresOf, prng, type Case, type CaseResult } from "./support/collectives-cases.ts"
import { RankFleet } from "./support/collectives-fleet.ts"
import { allReduceAlgorithms } from "../collectives/algorithms/index.ts"

const MAX_P = 8
// Small chunks and windows so that modest buffers span many chunks and exercise pipelining and credits.
const CHUNK_BYTES = 1024
const WINDOW_BYTES = 4096

let server: NatsServerProcess
let fleet: RankFleet

beforeAll(async () => {
  server = await launchNatsServer({ jetstream: false })
  fleet = await RankFleet.start({ size: MAX_P, server: () => server.url })
})

afterAll(async () => {
  await fleet?.stop()
  await server?.stop()
})

/** Lengths worth testing for p ranks: empty, one, fewer than p, not divisible by p, many chunks. */
const lengthsFor = (p: number, rnd: () => number): number[] => {
  const chunk = CHUNK_BYTES / 4
  const out = new Set([0, 1, Math.max(0, p - 1), p * 37 + 1, 1 + Math.floor(rnd() * 3 * chunk * p)])
  return [...out]
}

const casesFor = (p: number): Case[] => {
  const rnd = prng(1000 + p)
  const seed = (): number => Math.floor(rnd() * 1e6)
  const cases: Case[] = []
  // every registered all-reduce algorithm (the rank processes register the same built-ins)
  for (const { name: algorithm } of allReduceAlgorithms()) {
    for (const reduce of ["sum", "mean", "max", "weightedMean"] as const) {
      for (const length of lengthsFor(p, rnd)) cases.push({ op: "allReduce", algorithm, reduce, length, seed: seed() })
    }
    for (const reduce of ["sum", "weightedMean"] as const) {
      cases.push({ op: "allReduce", algorithm, reduce, wire: "f16", length: 1 + Math.floor(rnd() * 2000), seed: seed() })
    }
    cases.push({ op: "allReduce", algorithm, reduce: "sum", length: 500 + Math.floor(rnd() * 500), seed: seed(), concurrent: 3 })
  }
  cases.push({ op: "allReduce", algorithm: "tree", reduce: "mean", length: 2000, seed: seed(), fanout: false })
  for (const length of [0, p - 1, 2001]) cases.push({ op: "allReduce", algorithm: "ring", reduce: "weightedMean", length, seed: seed(), fanout: false })
  cases.push({ op: "allReduce", algorithm: "ring", reduce: "sum", wire: "f16", length: 999, seed: seed(), fanout: false })
  cases.push({ op: "allReduce", algorithm: "hierarchical", reduce: "sum", length: 2000, seed: seed(), hierarchy: "server" })
  // fp16 sums whose input comes as binary16 bits (fp16 error feedback's own output), several chunks
  for (const a of allReduceAlgorithms()) {
    for (const fanout of a.usesFanout ? [true, false] : [true]) {
      cases.push({ op: "allReduce", algorithm: a.name, reduce: "sum", wire: "f16", length: 1 + Math.floor(rnd() * 6 * CHUNK_BYTES), seed: seed(), fanout, halfInput: true })
    }
  }
  for (const reduce of ["sum", "mean", "max", "weightedMean"] as const) {
    for (const length of [0, 1, p * 3 + 2, 1500]) cases.push({ op: "reduceScatter", reduce, length, seed: seed() })
  }
  cases.push({ op: "reduceScatter", reduce: "sum", wire: "f16", length: 1000, seed: seed() })
  for (const algorithm of ["fanout", "tree"]) {
    for (const length of [0, 1, 1700]) cases.push({ op: "broadcast", algorithm, length, seed: seed(), root: Math.floor(rnd() * p) })
    cases.push({ op: "broadcast", algorithm, wire: "f16", length: 700, seed: seed(), root: p - 1 })
  }
  for (const algorithm of ["fanout", "ring"]) {
    for (const length of [0, 1, 600]) cases.push({ op: "allGather", algorithm, length, seed: seed() })
    cases.push({ op: "allGather", algorithm, wire: "f16", length: 300, seed: seed() })
  }
  for (const length of [0, 1, 1700]) cases.push({ op: "shift", length, seed: seed() })
  cases.push({ op: "barrier", length: 0, seed: 0 })
  cases.push({ op: "barrier", length: 0, seed: 0 })
  // Bucketing: mixed sizes, one variable larger than a bucket (reduced in place), tiny first bucket.
  const sizes = [3, 0, 700, 1, 5000, 40, 260, 2]
  cases.push({ op: "buckets", algorithm: "ring", reduce: "sum", length: 0, seed: seed(), sizes, bucketBytes: 4096, firstBucketBytes: 512 })
  cases.push({ op: "buckets", algorithm: "tree", reduce: "weightedMean", length: 0, seed: seed(), sizes, bucketBytes: 2048, firstBucketBytes: 64 })
  return cases
}

/** Results that every rank must hold bit for bit (reduce-scatter segments differ per rank by design). */
describe("collectives over one nats-server, one process per rank", () => {
  for (let p = 1; p <= MAX_P; p++) {
    it(`p = ${p}: every operation and algorithm matches the reference, bitwise identical on all ranks`, async () => {
      const group = `main-p${p}`
      const nodeOf = (r: number): string => `node${r % 3}` // interleaved nodes: leaders are not rank-contiguous
      await fleet.all(p, (rank) => ({ cmd: "create", group, rank, worldSize: p, node: nodeOf(rank), timeoutMs: 20_000, chunkBytes: CHUNK_BYTES, windowBytes: WINDOW_BYTES }))
      const cases = casesFor(p)
      const results = await fleet.all<Array<CaseResult & { index: number }>>(p, () => ({ cmd: "run", group, cases }))
      await fleet.all(p, () => ({ cmd: "close", group }))
      expect(failuresOf(cases, results)).toEqual([])
    })
  }
})

describe("large chunks through the pooled NATS buffers (core/nats-internals/)", () => {
  it("p = 4: repeated collectives of 128 KiB chunks reuse received buffers and still match the reference, bitwise identical on all ranks", async () => {
    const p = 4
    const group = "pooled-p4"
    // chunks above the pools' 64 KiB threshold; a window of a few chunks so relays hold messages
    // nodes of two ranks each, so the hierarchical all-reduce has members and leaders
    await fleet.all(p, (rank) => ({ cmd: "create", group, rank, worldSize: p, node: `node${rank >> 1}`, timeoutMs: 20_000, chunkBytes: 128 * 1024, windowBytes: 512 * 1024 }))
    const before = await fleet.all<{ receive: { taken: number; reused: number; returned: number } }>(p, () => ({ cmd: "poolStats" }))
    const rnd = prng(77)
    const cases: Case[] = []
    for (let round = 0; round < 3; round++) {
      for (const fanout of [true, false]) {
        const length = 200_000 + Math.floor(rnd() * 100_000)
        cases.push({ op: "allReduce", algorithm: "ring", reduce: "sum", length, seed: Math.floor(rnd() * 1e6), fanout })
        cases.push({ op: "allReduce", algorithm: "ring", reduce: "weightedMean", length, seed: Math.floor(rnd() * 1e6), fanout })
        cases.push({ op: "allReduce", algorithm: "ring", reduce: "sum", wire: "f16", length: 2 * length, seed: Math.floor(rnd() * 1e6), fanout })
        cases.push({ op: "allReduce", algorithm: "ring", reduce: "sum", wire: "f16", length: 2 * length, seed: Math.floor(rnd() * 1e6), fanout, halfInput: true })
      }
      // the other collectives that give received messages back
      const length = 150_000 + Math.floor(rnd() * 50_000)
      cases.push({ op: "allReduce", algorithm: "tree", reduce: "sum", length, seed: Math.floor(rnd() * 1e6) })
      cases.push({ op: "allReduce", algorithm: "hierarchical", reduce: "mean", length, seed: Math.floor(rnd() * 1e6) })
      for (const algorithm of ["fanout", "tree"]) cases.push({ op: "broadcast", algorithm, length, seed: Math.floor(rnd() * 1e6), root: round % p })
      for (const algorithm of ["fanout", "ring"]) cases.push({ op: "allGather", algorithm, length: length >> 1, seed: Math.floor(rnd() * 1e6) })
    }
    const results = await fleet.all<Array<CaseResult & { index: number }>>(p, () => ({ cmd: "run", group, cases }))
    const after = await fleet.all<{ receive: { taken: number; reused: number; returned: number } }>(p, () => ({ cmd: "poolStats" }))
    await fleet.all(p, () => ({ cmd: "close", group }))
    expect(failuresOf(cases, results)).toEqual([])
    after.forEach((a, rank) => {
      // every rank received into pooled buffers, gave them back and received into them again
      expect(a.receive.taken - before[rank].receive.taken, `rank ${rank}`).toBeGreaterThan(0)
      expect(a.receive.returned - before[rank].receive.returned, `rank ${rank}`).toBeGreaterThan(0)
      expect(a.receive.reused - before[rank].receive.reused, `rank ${rank}`).toBeGreaterThan(0)
    })
  })
})
