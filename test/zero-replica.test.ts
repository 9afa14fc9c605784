// ZeRO's replicas (optim/zero.ts): each rank keeps its predecessor's shard, updated from the same
// reduced gradient (stage 1: the all-reduced whole; stage 2: the predecessor's segment); a regroup merges the survivors' shards and replicas into one
// complete set and re-shards it for the new group. Pure logic, no group: p ranks' shards stepped
// on the same gradients as one unsharded optimizer must hand over, after a rank is lost, exactly
// (bit for bit) that optimizer's state and parameters; what cannot make a complete set says why.
import { describe, expect, it } from "vitest"
import { ZeroShard, mergePeerShards, replicaOffset } from "../actors/train/common/optim/zero.ts"
import { seededRng } from "../core/random.ts"

const N = 1000
const ADAM = { kind: "adam" as const, learningRate: 0.01, beta1: 0.9, beta2: 0.999, epsilon: 1e-7 }
const rng = seededRng(7)
const random = (n: number): Float32Array => Float32Array.from({ length: n }, () => rng() * 2 - 1)

/** p ranks with replicas and one unsharded reference, all from the same parameters, after `steps` common steps. */
const trained = (p: number, steps: number) => {
  const init = random(N)
  const ranks = Array.from({ length: p }, (_, r) => new ZeroShard(1, ADAM, N, r, p, { replica: true }))
  const reference = new ZeroShard(1, ADAM, N, 0, 1)
  for (const z of [...ranks, reference]) z.loadParams(init)
  const step = (g: Float32Array, only?: ReadonlyArray<ZeroShard>): void => {
    for (const z of only ?? [...ranks, reference]) {
      z.update(g.subarray(z.layout.start, z.layout.end), undefined, 0.01)
      z.updateReplica(g, undefined, 0.01)
    }
  }
  for (let s = 0; s < steps; s++) step(random(N))
  return { ranks, reference, step }
}

/** Bit for bit the same bytes. */
const same = (a: Float32Array, b: Float32Array): boolean => Buffer.from(a.slice().buffer).equals(Buffer.from(b.slice().buffer))

/** A group of 2 re-sharded from `files` holds the reference's parameters, moments and step on each rank. */
const expectTwoRanksHold = (files: Record<string, Uint8Array>, reference: ZeroShard): void => {
  const whole = reference.optimizer.state()
  for (const rank of [0, 1]) {
    const z = new ZeroShard(1, ADAM, N, rank, 2, { replica: true })
    expect(same(z.loadPeerShards(files), reference.params)).toBe(true)
    const st = z.optimizer.state()
    for (const slot of ["m", "v"]) expect(same(st.slots[slot]!, whole.slots[slot]!.subarray(z.layout.start, z.layout.end)), `rank ${rank} slot ${slot}`).toBe(true)
    expect(st.scalars.step).toBe(whole.scalars.step)
  }
}

describe("ZeRO replicas", () => {
  it("hand a lost rank's shard over from its successor: the re-sharded group holds the unsharded optimizer's state and parameters bit for bit", () => {
    const { ranks, reference } = trained(3, 5)
    expect(ranks.every((z) => z.replicated)).toBe(true)
    // Rank 1 is lost: rank 2 holds its replica.
    const merged = mergePeerShards([ranks[0]!.peerFiles(), ranks[2]!.peerFiles()])
    if (!("files" in merged)) throw new Error(merged.reason)
    expect(Object.keys(merged.files).sort()).toEqual(["optimizer.shard-0-of-3.msgpack", "optimizer.shard-1-of-3.msgpack", "optimizer.shard-2-of-3.msgpack"])
    expectTwoRanksHold(merged.files, reference)
  })

  it("the re-sharded group goes on like the unsharded optimizer, its replicas included", () => {
    const { ranks, reference, step } = trained(3, 3)
    const merged = mergePeerShards([ranks[1]!.peerFiles(), ranks[2]!.peerFiles()])
    if (!("files" in merged)) throw new Error(merged.reason)
    const next = [0, 1].map((rank) => new ZeroShard(1, ADAM, N, rank, 2, { replica: true }))
    for (const z of next) z.loadPeerShards(merged.files)
    for (let s = 0; s < 3; s++) step(random(N), [...next, reference])
    // Each new rank's replica is its predecessor's shard: lose new rank 0, and rank 1 hands it over.
    const again = mergePeerShards([next[1]!.peerFiles()])
    if (!("files" in again)) throw new Error(again.reason)
    const solo = new ZeroShard(1, ADAM, N, 0, 1, { replica: true })
    expect(solo.replicated).toBe(false)
    const full = solo.loadPeerShards(again.files)
    expect(Buffer.from(full.buffer).equals(Buffer.from(reference.params.slice().buffer))).toBe(true)
    expect(Buffer.from(solo.optimizer.state().slots.v!.slice().buffer).equals(Buffer.from(reference.optimizer.state().slots.v!.slice().buffer))).toBe(true)
  })

  it("brings survivors a step behind level with the gradient of the step a survivor had made (a group broken in the step's all-gather)", () => {
    const { ranks, reference, step } = trained(3, 4)
    // Step 5: ranks 0 and 2 finished its all-reduce and updated their shards and replicas; rank 1
    // did not; then rank 2 died. Rank 0 holds rank 2's shard in its replica.
    const g = random(N)
    step(g, [ranks[0]!, ranks[2]!, reference])
    const merged = mergePeerShards([ranks[0]!.peerFiles({ gradient: g, weightDecay: 0.01 }), ranks[1]!.peerFiles()])
    if (!("files" in merged)) throw new Error(merged.reason)
    expect(reference.optimizer.state().scalars.step).toBe(5)
    expectTwoRanksHold(merged.files, reference)
  })

  it("on several nodes a replica is kept on another node: a lost node's ranks leave a complete set, where replicas on the next rank would not", () => {
    // Two nodes of two ranks each (ranks 0, 1 on A): the replica distance is a node's ranks.
    expect(replicaOffset(["A", "A", "B", "B"])).toBe(2)
    expect(replicaOffset(["A", "A", "A", "B", "B", "B"])).toBe(3)
    expect(replicaOffset(["A", "B", "A", "B"])).toBe(1)
    expect(replicaOffset(["A", "A", "A"])).toBe(1)
    expect(replicaOffset(["A"])).toBe(1)
    // Uneven: as many replicas across nodes as any distance gives (2 of 3), the smallest distance.
    expect(replicaOffset(["A", "A", "B"])).toBe(1)
    const lose = (d: number) => {
      const init = random(N)
      const ranks = Array.from({ length: 4 }, (_, r) => new ZeroShard(1, ADAM, N, r, 4, { replica: true, replicaOffset: d }))
      const reference = new ZeroShard(1, ADAM, N, 0, 1)
      for (const z of [...ranks, reference]) z.loadParams(init)
      for (let s = 0; s < 4; s++) {
        const g = random(N)
        for (const z of [...ranks, reference]) {
          z.update(g.subarray(z.layout.start, z.layout.end), undefined, 0.01)
          z.updateReplica(g, undefined, 0.01)
        }
      }
      // Node A (ranks 0 and 1) is lost.
      return { merged: mergePeerShards([ranks[2]!.peerFiles(), ranks[3]!.peerFiles()]), reference }
    }
    const across = lose(2)
    if (!("files" in across.merged)) throw new Error(across.merged.reason)
    expectTwoRanksHold(across.merged.files, across.reference)
    const next = lose(1).merged
    expect("reason" in next && next.reason).toMatch(/rank\(s\) 0 of 4 was lost with it and the rank that kept its replica/)
    expect(() => new ZeroShard(1, ADAM, N, 0, 4, { replica: true, replicaOffset: 4 })).toThrow(/replicaOffset.*\[1, 3\]/)
  })

  it("says why no complete set can be made: neighbours lost together, shards of different steps, a survivor without shards", () => {
    const { ranks, step } = trained(3, 2)
    // Ranks 1 and 2 lost: rank 0 holds its own shard and rank 2's, rank 1's went with rank 2.
    const lost = mergePeerShards([ranks[0]!.peerFiles()])
    expect("reason" in lost && lost.reason).toMatch(/rank\(s\) 1 of 3 was lost with it and the rank that kept its replica/)
    step(random(N), [ranks[0]!])
    const uneven = mergePeerShards([ranks[0]!.peerFiles(), ranks[2]!.peerFiles()])
    expect("reason" in uneven && uneven.reason).toMatch(/different optimizer steps \(2, 3\) and none holds the gradient/)
    expect("reason" in mergePeerShards([ranks[1]!.peerFiles(), undefined])).toBe(true)
  })

  it("at stage 2 a replica is stepped from the predecessor's reduced segment (sent after the reduce-scatter), bit for bit its owner's", () => {
    const p = 3
    const init = random(N)
    const ranks = Array.from({ length: p }, (_, r) => new ZeroShard(2, ADAM, N, r, p, { replica: true }))
    const reference = new ZeroShard(1, ADAM, N, 0, 1)
    for (const z of [...ranks, reference]) z.loadParams(init)
    expect(ranks.every((z) => z.replicated)).toBe(true)
    const S = ranks[0]!.layout.shardSize
    for (let s = 0; s < 4; s++) {
      // The reduced gradient, padded to p segments of S: rank r holds segment r, and receives segment r - 1.
      const g = new Float32Array(S * p)
      g.set(random(N))
      for (const z of ranks) {
        const r = z.layout.rank
        z.update(g.subarray(r * S, (r + 1) * S), undefined, 0.01)
        const pred = z.predecessorGradient
        pred.set(g.subarray(((r + p - 1) % p) * S, (((r + p - 1) % p) + 1) * S))
        z.updateReplicaSegment(pred, undefined, 0.01)
      }
      reference.update(g.subarray(0, N), undefined, 0.01)
    }
    // Rank 1 is lost: rank 2 holds its replica; the group of 2 (at stage 2 or 1 alike) holds the unsharded state.
    const merged = mergePeerShards([ranks[0]!.peerFiles(), ranks[2]!.peerFiles()])
    if (!("files" in merged)) throw new Error(merged.reason)
    expectTwoRanksHold(merged.files, reference)
    // One rank has no predecessor to keep.
    expect(new ZeroShard(2, ADAM, N, 0, 1, { replica: true }).replicated).toBe(false)

    // Step 5 in flight: rank 1 got through the barrier after the shift and updated its shard and
    // replica; ranks 0 and 2 had both segments (their own and their predecessor's) but not yet
    // updated; then rank 2 died. Shard 2 survives only as rank 0's replica, a step behind: the
    // predecessor segment rank 0 holds brings it level (and shard 0's newer copy is rank 1's replica).
    const g = new Float32Array(S * p)
    g.set(random(N))
    const seg = (r: number) => g.subarray(r * S, (r + 1) * S)
    const z1 = ranks[1]!
    z1.update(seg(1), undefined, 0.01)
    z1.predecessorGradient.set(seg(0))
    z1.updateReplicaSegment(z1.predecessorGradient, undefined, 0.01)
    reference.update(g.subarray(0, N), undefined, 0.01)
    const held = { segment: seg(0), predecessor: seg(2), learningRate: undefined, weightDecay: 0.01 }
    const behind = mergePeerShards([ranks[0]!.peerFiles(undefined, held), z1.peerFiles({ weightDecay: 0.01 })])
    if (!("files" in behind)) throw new Error(behind.reason)
    expect(reference.optimizer.state().scalars.step).toBe(5)
    expectTwoRanksHold(behind.files, reference)
    // Without rank 0's segments nothing brings shard 2 level.
    const stuck = mergePeerShards([ranks[0]!.peerFiles(), z1.peerFiles({ weightDecay: 0.01 })])
    expect("reason" in stuck && stuck.reason).toMatch(/different optimizer steps \(4, 5\)/)
  })
})
