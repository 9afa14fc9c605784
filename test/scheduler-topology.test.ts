// Topology observation: which pairs are probed, the JSON-in-floats encoding that shares rank 0's
// model, observeTopology over a simulated network (every rank ends with the same model, close to
// the links' true alpha and beta), the probe over real NATS, the automatic choice it feeds, and a
// regression: a collective started right after Communicator.create by a rank that finished the
// handshake first must not lose frames sent to a rank still in its handshake.
import { describe, expect, it } from "vitest"
import { connect } from "@nats-io/transport-node"
import { Communicator } from "../collectives/communicator.ts"
import { probeGroupTopology } from "../actors/train/worker/topology-probe.ts"
import { compressorProfiles } from "../actors/train/worker/auto-config.ts"
import { chooseAlgorithm } from "../scheduler/algorithm-choice.ts"
import { allReduceAlgorithms } from "../collectives/algorithms/index.ts"
import { decodeJson, describeObservation, encodeJson, observeTopology, probePairs, type TopologyProbeIO } from "../scheduler/topology.ts"
import { predictAllReduce, type LinkClass, type Topology } from "../scheduler/cost-model.ts"
import { natsFixtures } from "./support/nats.ts"

const loc = (nodeId: string, server: string) => ({ nodeId, server })

describe("probePairs", () => {
  it("picks one pair per link class present, preferring rank 0, then one per pair of nodes none of those stands for", () => {
    const topo: Topology = [loc("a", "s1"), loc("a", "s1"), loc("b", "s1"), loc("c", "s2")]
    expect(probePairs(topo)).toEqual([
      { from: 0, to: 1, linkClass: "same-node" },
      { from: 0, to: 2, linkClass: "same-server" },
      { from: 0, to: 3, linkClass: "cross-server" },
      { from: 2, to: 3, linkClass: "cross-server" }
    ])
    // one node: its classes only
    expect(probePairs([loc("a", "s1"), loc("a", "s1"), loc("a", "s1")])).toEqual([{ from: 0, to: 1, linkClass: "same-node" }])
    // two nodes of two: each node's own pair and the one across
    expect(probePairs([loc("a", "s1"), loc("a", "s1"), loc("b", "s2"), loc("b", "s2")])).toEqual([
      { from: 0, to: 1, linkClass: "same-node" },
      { from: 0, to: 2, linkClass: "cross-server" },
      { from: 2, to: 3, linkClass: "same-node" }
    ])
  })
  it("falls back to pairs without rank 0 when rank 0 has no such link", () => {
    const topo: Topology = [loc("a", "s1"), loc("b", "s2"), loc("b", "s2")]
    expect(probePairs(topo)).toEqual([
      { from: 1, to: 2, linkClass: "same-node" },
      { from: 0, to: 1, linkClass: "cross-server" }
    ])
  })
  it("has nothing to probe for one rank", () => expect(probePairs([loc("a", "s")])).toEqual([]))
})

describe("encodeJson / decodeJson", () => {
  it("round-trips any JSON bit for bit, numbers included", () => {
    const v = { alpha: 0.1 + 0.2, beta: 1 / 3, tiny: 5e-324, s: "ünïcødé", list: [1, -0.5, 1e300] }
    const enc = encodeJson(v, 1024)
    expect(enc.length).toBe(1024)
    expect(decodeJson(Float32Array.from(enc))).toEqual(v)
  })
})

/** A simulated network: one-way time alpha + bytes * beta per link class, no noise. */
const simulatedIO = (topo: Topology, rank: number, truth: Record<LinkClass, { a: number; b: number }>, shared: { buf?: Float32Array }): TopologyProbeIO => ({
  rank,
  worldSize: topo.length,
  topology: topo,
  pingPong: async (from, to, bytes, reps) => {
    const c: LinkClass = topo[from]!.server !== topo[to]!.server ? "cross-server" : topo[from]!.nodeId === topo[to]!.nodeId ? "same-node" : "same-server"
    return Array.from({ length: reps }, () => 2 * (truth[c].a + bytes * truth[c].b))
  },
  broadcast: async (buf) => {
    if (rank === 0) shared.buf = Float32Array.from(buf)
    while (!shared.buf) await new Promise((r) => setTimeout(r, 1))
    return Float32Array.from(shared.buf)
  }
})

describe("observeTopology", () => {
  it("fits every class present, borrows the rest, and gives every rank the same model", async () => {
    const topo: Topology = [loc("a", "s1"), loc("a", "s1"), loc("b", "s2"), loc("b", "s2")]
    const truth = { "same-node": { a: 0.1, b: 1 / 500_000 }, "same-server": { a: 0.2, b: 1 / 200_000 }, "cross-server": { a: 0.5, b: 1 / 10_000 } }
    const shared = {}
    const all = await Promise.all(topo.map((_, r) => observeTopology(simulatedIO(topo, r, truth, shared))))
    for (const o of all) expect(JSON.stringify(o.model)).toBe(JSON.stringify(all[0]!.model))
    const m = all[0]!.model
    expect(m.links["same-node"].alphaMs).toBeCloseTo(0.1, 6)
    expect(m.links["cross-server"].betaMsPerByte).toBeCloseTo(1 / 10_000, 9)
    expect(m.assumed).toEqual({ "same-server": "same-node" })
    // Fitted from what was observed, the choice for a large buffer avoids the slow route.
    expect(chooseAlgorithm(8 * 1024 * 1024, topo, m, allReduceAlgorithms()).algorithm).toBe("hierarchical")
  })

  it("pools several rounds per pair, so a burst of load during one round does not make a fast link look slow", async () => {
    // The failure this guards against: the same-node probe ran while other processes had the two
    // cores, measured ~20x the true time, and the cost model then chose a flat ring across a slow link.
    const topo: Topology = [loc("a", "s1"), loc("a", "s1"), loc("a", "s1"), loc("b", "s2"), loc("b", "s2"), loc("b", "s2")]
    const truth = { "same-node": { a: 0.1, b: 1 / 400_000 }, "same-server": { a: 0.1, b: 1 / 400_000 }, "cross-server": { a: 0.5, b: 1 / 2_500 } }
    const loaded = (io: TopologyProbeIO): TopologyProbeIO => {
      let calls = 0
      return {
        ...io,
        // Every same-node round trip of the first round (both nodes' pairs, both sizes) takes 20x as long.
        pingPong: async (from, to, bytes, reps) => {
          const rtts = await io.pingPong(from, to, bytes, reps)
          const sameNode = topo[from]!.nodeId === topo[to]!.nodeId
          return sameNode && calls++ < 4 ? rtts.map((t) => t * 20) : rtts
        }
      }
    }
    const run = async (rounds: number) => {
      const shared = {}
      const all = await Promise.all(topo.map((_, r) => observeTopology(loaded(simulatedIO(topo, r, truth, shared)), { rounds })))
      return all[0]!.model
    }
    const pooled = await run(3)
    expect(pooled.links["same-node"].betaMsPerByte).toBeCloseTo(1 / 400_000, 9)
    expect(chooseAlgorithm(4 * 1024 * 1024, topo, pooled, allReduceAlgorithms()).algorithm).toBe("hierarchical")
    // One round sees only the burst.
    const single = await run(1)
    expect(single.links["same-node"].betaMsPerByte).toBeGreaterThan(10 / 400_000)
  })

  it("says a failed repeat round was fitted from the rounds before it, and a failed first round was not", async () => {
    const topo: Topology = [loc("a", "s1"), loc("a", "s1"), loc("b", "s2")]
    const truth = { "same-node": { a: 0.1, b: 1 / 400_000 }, "same-server": { a: 0.1, b: 1 / 400_000 }, "cross-server": { a: 0.5, b: 1 / 2_500 } }
    // same-node fails from its second round on (two sizes per round); cross-server fails at once
    const flaky = (io: TopologyProbeIO): TopologyProbeIO => {
      let sameNodeCalls = 0
      return {
        ...io,
        pingPong: async (from, to, bytes, reps) => {
          if (topo[from]!.server !== topo[to]!.server) throw new Error("no route")
          if (sameNodeCalls++ >= 2) throw new Error("timed out")
          return io.pingPong(from, to, bytes, reps)
        }
      }
    }
    const shared = {}
    const all = await Promise.all(topo.map((_, r) => observeTopology(flaky(simulatedIO(topo, r, truth, shared)), { rounds: 3 })))
    const note = all[1]!.note ?? ""
    expect(note).toMatch(/same-node probe 0->1 failed in round 2 \(fitted from the earlier rounds\): Error: timed out/)
    expect(note).toMatch(/cross-server probe 0->2 failed: Error: no route/)
    expect(all[1]!.model.links["same-node"].betaMsPerByte).toBeCloseTo(1 / 400_000, 9)
  })

  it("keeps to its time budget and says what it could not measure", async () => {
    const topo: Topology = [loc("a", "s1"), loc("a", "s1"), loc("b", "s2")]
    const truth = { "same-node": { a: 0.1, b: 1e-6 }, "same-server": { a: 0.1, b: 1e-6 }, "cross-server": { a: 0.1, b: 1e-6 } }
    const shared = {}
    const slow = (io: TopologyProbeIO): TopologyProbeIO => ({
      ...io,
      pingPong: async (...a) => {
        await new Promise((r) => setTimeout(r, 30))
        return io.pingPong(...a)
      }
    })
    const all = await Promise.all(topo.map((_, r) => observeTopology(slow(simulatedIO(topo, r, truth, shared)), { budgetMs: 20 })))
    expect(all[2]!.note).toMatch(/cross-server not probed/)
    expect(all[2]!.model.assumed["cross-server"]).toBe("same-node")
  })

  it("fits each pair of nodes on several: a node behind a slow link is priced so, though its class's representative pair is fast", async () => {
    // three nodes on one server: every link across nodes is "same-server"; node c's is 20x slower
    const topo: Topology = [loc("a", "s"), loc("b", "s"), loc("c", "s")]
    const fast = { a: 0.1, b: 1 / 400_000 }
    const slowLink = { a: 0.3, b: 1 / 20_000 }
    const truth = { "same-node": fast, "same-server": fast, "cross-server": fast }
    const behindC = (io: TopologyProbeIO): TopologyProbeIO => ({
      ...io,
      pingPong: async (from, to, bytes, reps) =>
        topo[from]!.nodeId === "c" || topo[to]!.nodeId === "c" ? Array.from({ length: reps }, () => 2 * (slowLink.a + bytes * slowLink.b)) : io.pingPong(from, to, bytes, reps)
    })
    const shared = {}
    const all = await Promise.all(topo.map((_, r) => observeTopology(behindC(simulatedIO(topo, r, truth, shared)))))
    for (const o of all) expect(JSON.stringify(o.model)).toBe(JSON.stringify(all[0]!.model))
    const m = all[0]!.model
    expect(all[0]!.pairs.map((p) => `${p.from}-${p.to}`)).toEqual(["0-1", "0-2", "1-2"])
    // the class is fitted from all three pairs' samples; each pair from its own
    expect(m.pairs!.a!.b!.betaMsPerByte).toBeCloseTo(fast.b, 9)
    expect(m.pairs!.a!.c!.betaMsPerByte).toBeCloseTo(slowLink.b, 9)
    expect(m.pairs!.c!.b!.alphaMs).toBeCloseTo(slowLink.a, 6)
    // a ring over the three crosses c's link: priced on it, not on the class's fit
    const MiB = 1024 * 1024
    const ring = allReduceAlgorithms().find((a) => a.name === "ring")!
    const withPairs = predictAllReduce(ring, 4 * MiB, topo, m).ms
    const byClass = predictAllReduce(ring, 4 * MiB, topo, { ...m, pairs: undefined }).ms
    expect(withPairs).toBeGreaterThan(1.5 * byClass)
    expect(describeObservation(all[0]!)).toMatch(/through NATS by pair of nodes a <-> b \d+us 400MB\/s, a <-> c \d+us 20MB\/s, b <-> c \d+us 20MB\/s/)
    // many nodes: what does not fit the broadcast is left out, said so, the same on every rank
    const many: Topology = Array.from({ length: 40 }, (_, i) => loc(`node-${i}`, "s"))
    const sharedMany = {}
    const big = await Promise.all(many.map((_, r) => observeTopology(simulatedIO(many, r, truth, sharedMany), { rounds: 1 })))
    expect(big[39]!.model.pairs).toBeUndefined()
    expect(big[39]!.note).toMatch(/samples and the pairs of nodes' fits not shared \(too many nodes\): links priced by class/)
    expect(big[39]!.model.links["same-server"].betaMsPerByte).toBeCloseTo(fast.b, 9)
    const six: Topology = many.slice(0, 6)
    const sharedSix = {}
    const mid = await Promise.all(six.map((_, r) => observeTopology(simulatedIO(six, r, truth, sharedSix))))
    expect(Object.keys(mid[5]!.model.pairs!)).toHaveLength(6)
    expect(mid[5]!.note).toBeUndefined()
    // one node: no pairs of nodes
    const one: Topology = [loc("a", "s"), loc("a", "s")]
    const sharedOne = {}
    const solo = await Promise.all(one.map((_, r) => observeTopology(simulatedIO(one, r, truth, sharedOne))))
    expect(solo[0]!.model.pairs).toBeUndefined()
  })
})

describe("compressorProfiles", () => {
  it("computes PowerSGD's ratio from the shapes (1-D tensors uncompressed)", () => {
    const layout = [
      { name: "w", shape: [64, 64], offset: 0, size: 4096 },
      { name: "b", shape: [64], offset: 4096, size: 64 }
    ]
    const { profiles, configs } = compressorProfiles(layout)
    const psgd = profiles.find((p) => p.name === "powersgd")!
    expect(psgd.ratio).toBeCloseTo(4160 / (4 * 128 + 64), 2)
    expect(configs.topk).toEqual({ type: "topk", ratio: 0.01 })
  })
})

describe("over real NATS", () => {
  const nats = natsFixtures()

  it("probes a group's links and every rank gets the same fitted model", async () => {
    const server = await nats.server({ maxPayload: 8 * 1024 * 1024 })
    const p = 3
    const ncs = await Promise.all(Array.from({ length: p }, () => connect({ servers: server.url, noEcho: true })))
    try {
      const comms = await Promise.all(
        ncs.map((nc, rank) => Communicator.create({ nc, cluster: "t", job: "probe", group: "g", rank, worldSize: p, node: rank < 2 ? "n0" : "n1", timeoutMs: 10_000 }))
      )
      const obs = await Promise.all(comms.map((comm, rank) => probeGroupTopology({ nc: ncs[rank]!, comm, cluster: "t", job: "probe" })))
      for (const o of obs) expect(JSON.stringify(o.model)).toBe(JSON.stringify(obs[0]!.model))
      expect(Object.keys(obs[0]!.model.fits).sort()).toEqual(["same-node", "same-server"])
      expect(obs[0]!.model.links["same-node"].alphaMs).toBeGreaterThan(0)
      expect(obs[0]!.probeMs).toBeLessThan(5_000)
      await Promise.all(comms.map((c) => c.close()))
    } finally {
      await Promise.all(ncs.map((nc) => nc.close()))
    }
  }, 30_000)

  it("does not lose frames sent right after create to a rank still finishing its handshake", async () => {
    const server = await nats.server()
    const p = 3
    for (let round = 0; round < 8; round++) {
      const ncs = await Promise.all(Array.from({ length: p }, () => connect({ servers: server.url, noEcho: true })))
      try {
        const comms = await Promise.all(
          ncs.map(async (nc, rank) => {
            // Staggered joins: whoever sees everyone ready first starts the barrier at once.
            await new Promise((r) => setTimeout(r, (rank * 7 + round * 3) % 25))
            const c = await Communicator.create({ nc, cluster: "t", job: "early", group: `g${round}`, rank, worldSize: p, timeoutMs: 3_000 })
            await c.barrier()
            return c
          })
        )
        await Promise.all(comms.map((c) => c.close()))
      } finally {
        await Promise.all(ncs.map((nc) => nc.close()))
      }
    }
  }, 60_000)
})
