// Collectives across a 3-server NATS cluster (routes on loopback): ranks connect to different
// servers, "nodes" are simulated by node ids, and hierarchical all-reduce groups ranks by node or
// by server. Results must match the reference and be bitwise identical on every rank.
import { afterAll, beforeAll, describe, expect, it } from "vitest"
import { launchNatsCluster, type NatsCluster } from "../core/nats-server.ts"
import type { Case, CaseResult } from "./support/collectives-cases.ts"
import { RankFleet } from "./support/collectives-fleet.ts"

const P = 6
let cluster: NatsCluster
let fleet: RankFleet

beforeAll(async () => {
  cluster = await launchNatsCluster(3, { jetstream: false })
  fleet = await RankFleet.start({ size: P, server: (rank) => cluster.urls[rank % 3] })
})

afterAll(async () => {
  await fleet?.stop()
  await cluster?.stop()
})

const cases = (seed: number): Case[] => {
  const out: Case[] = []
  for (const length of [0, 5, 1001, 700_000]) {
    out.push({ op: "allReduce", algorithm: "hierarchical", reduce: "sum", length, seed: seed++ })
    out.push({ op: "allReduce", algorithm: "hierarchical", reduce: "weightedMean", length, seed: seed++, hierarchy: "server" })
  }
  out.push({ op: "allReduce", algorithm: "hierarchical", reduce: "mean", wire: "f16", length: 3000, seed: seed++ })
  out.push({ op: "allReduce", algorithm: "hierarchical", reduce: "max", length: 3000, seed: seed++, concurrent: 3 })
  out.push({ op: "allReduce", algorithm: "ring", reduce: "mean", length: 700_000, seed: seed++ })
  out.push({ op: "allReduce", algorithm: "tree", reduce: "sum", length: 700_000, seed: seed++ })
  out.push({ op: "broadcast", algorithm: "fanout", length: 300_000, seed: seed++, root: 4 })
  out.push({ op: "allGather", algorithm: "fanout", length: 100_000, seed: seed++ })
  out.push({ op: "reduceScatter", reduce: "sum", length: 300_001, seed: seed++ })
  out.push({ op: "barrier", length: 0, seed: 0 })
  return out
}

const check = (list: Case[], results: Array<Array<CaseResult & { index: number }>>): string[] => {
  const failures: string[] = []
  list.forEach((c, i) => {
    const per = results.map((r) => r[i])
    per.forEach((r, rank) => {
      if (!r.ok) failures.push(`case ${i} ${JSON.stringify(c)} rank ${rank}: ${r.detail}`)
    })
    if (c.op !== "reduceScatter" && new Set(per.map((r) => r.hash)).size !== 1) failures.push(`case ${i} ${JSON.stringify(c)}: results differ across ranks`)
  })
  return failures
}

describe("collectives over a 3-server NATS cluster", () => {
  for (const [name, nodeOf] of [
    ["one node per server", (r: number) => `host${r % 3}`],
    ["nodes spanning servers", (r: number) => `host${Math.floor(r / 3)}`]
  ] as const) {
    it(`hierarchical, ring, tree and friends, ${name}: reference match, identical bits`, async () => {
      const group = `cluster-${name.replace(/ /g, "-")}`
      const created = await fleet.all<{ peers: Array<{ server: string; node: string }> }>(P, (rank) => ({ cmd: "create", group, rank, worldSize: P, node: nodeOf(rank), timeoutMs: 20_000 }))
      // The ranks really are spread over the three servers.
      expect(new Set(created[0].peers.map((p) => p.server)).size).toBe(3)
      const list = cases(name.length * 100)
      const results = await fleet.all<Array<CaseResult & { index: number }>>(P, () => ({ cmd: "run", group, cases: list }))
      await fleet.all(P, () => ({ cmd: "close", group }))
      expect(check(list, results)).toEqual([])
    })
  }
})
