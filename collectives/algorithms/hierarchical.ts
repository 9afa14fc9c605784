// Hierarchical all-reduce: reduce inside each node (or NATS server) to its leader, all-reduce
// among the leaders with the ring, and send the result back inside the node.
//
// Traffic between nodes is what a multi-machine cluster pays for; this moves the buffer across
// nodes only in the leaders' ring (2(L-1)/L per leader link for L nodes), and keeps the fan-in
// and fan-out local. The node broadcast streams: each region the leader's ring finishes is sent
// on at once, as one fan-out publish to the node's subject when the node has several members.
// Members are added at the leader in rank order (fixed summation order); the ring finishes each
// element once and every other rank copies those bits.
import { accumulate, assign } from "../kernels.ts"
import { Flag, type Frame } from "../frames.ts"
import { HANDED_OVER, type Operation } from "../operation.ts"
import { accumulateOp, type Reduction } from "../reduction.ts"
import { releasePayload, ringReduce, ringStages } from "./ring.ts"
import { chunkCount, chunkLength, segmentStart } from "../segments.ts"
import { releaseReceived } from "../../core/nats-internals/index.ts"
import { spaceSlots } from "../simd.ts"
import { chunking, nodeGroups } from "../../core/collective-cost.ts"
import { defineAllReduceAlgorithm, type NodeGroup } from "./registry.ts"

export type { NodeGroup } from "./registry.ts"


export interface HierarchySpec {
  /** Nodes ordered by leader rank; that is also the order of the leaders' ring. */
  readonly nodes: ReadonlyArray<NodeGroup>
  readonly chunkElems: number
  readonly reduce: Reduction
}

/** Steps on the wire: 0 members -> leader, 1 leader -> members, 2.. the leaders' ring. */
const UP = 0
const DOWN = 1
const RING = 2

/** How many result frames a member gets: the regions the leaders' ring finishes, split into chunks. */
const resultFrames = (n: number, leaders: number, C: number): number => {
  if (leaders === 1) return chunkCount(n, C)
  let frames = 0
  for (let k = 0; k < leaders; k++) frames += chunkCount(segmentStart(n, leaders, k + 1) - segmentStart(n, leaders, k), C)
  return frames
}

export const hierarchicalReduce = async (op: Operation, buf: Float32Array, spec: HierarchySpec): Promise<void> => {
  const { nodes, chunkElems: C, reduce } = spec
  const me = op.rank
  const N = buf.length
  const nodeIndex = nodes.findIndex((g) => g.ranks.includes(me))
  const node = nodes[nodeIndex]
  const leader = node.ranks[0]
  const others = node.ranks.slice(1)
  const half = reduce.half
  const elemBytes = half ? 2 : 4
  const accOp = accumulateOp(reduce.op)
  const chunks = chunkCount(N, C)
  const expectedResults = resultFrames(N, nodes.length, C)
  const useFanout = node.fanoutToken !== undefined && others.length > 1

  if (me !== leader) {
    // The leader takes in every member's buffer at once: each gets its share of the window.
    op.setFanIn(others.length)
    let results = 0
    // An fp32 result is read straight into its place in `buf` (on the direct links): the region's
    // old values went to the leader, which needed them before it could send its result.
    if (!half) {
      op.place = (head, bytes) =>
        head.step === DOWN && head.src === leader && useFanout === ((head.flags & Flag.fanout) !== 0) && bytes % 4 === 0 && bytes / 4 <= C && head.offset + bytes / 4 <= N
          ? new Uint8Array(buf.buffer, buf.byteOffset + head.offset * 4, bytes)
          : undefined
    }
    op.handler = (f: Frame): boolean => {
      if (f.step !== DOWN || f.src !== leader || useFanout !== ((f.flags & Flag.fanout) !== 0)) {
        throw op.protocolError(f, `rank ${me} only receives results from its node leader ${leader}`)
      }
      const n = f.payload.length / elemBytes
      if (!Number.isInteger(n) || n > C || f.offset + n > N) throw op.protocolError(f, `result region ${f.offset}+${n} outside 0..${N}`)
      assign(buf, f.offset, f.payload, n, half)
      releaseReceived(f.payload)
      results++
      return true
    }
    for (let c = 0; c < chunks; c++) {
      const off = c * C
      // handed over: the region is written again only by the leader's results, which need it first
      await op.send(leader, UP, c, off, buf.subarray(off, off + chunkLength(N, C, c)), reduce.weight, HANDED_OVER)
    }
    await op.until(() => results === expectedResults, () => [leader])
    return
  }

  // Leader: collect the node's contributions, in rank order per chunk. Its sends go to the next
  // leader (who may also hold early frames) and to members (one inbound link each). A member's
  // fp32 chunk goes into a slot of `buf`'s space when it has them (Communicator.allocate), so its
  // sum with `buf` runs in place; the leaders' ring then places its own frames.
  op.setFanIn(2, 1)
  const slots = half ? undefined : spaceSlots(buf)
  if (slots) op.place = (head, bytes) => (head.step === UP && others.includes(head.src) ? slots.take(bytes) : undefined)
  const upDone = others.map(() => 0)
  const memberWeight = others.map(() => 0)
  op.handler = (f: Frame): boolean => {
    // Ring frames may come early from a faster leader: they stay queued until our ring starts.
    if (f.step >= RING) return false
    const k = others.indexOf(f.src)
    if (f.step !== UP || k < 0) throw op.protocolError(f, `leader ${me} expected node contributions, got step ${f.step} from ${f.src}`)
    if (f.chunk !== upDone[k]) throw op.protocolError(f, `expected chunk ${upDone[k]} from ${f.src}, got ${f.chunk}`)
    if (k > 0 && upDone[k - 1] <= f.chunk) return false
    const n = chunkLength(N, C, f.chunk)
    if (f.offset !== f.chunk * C || f.payload.length !== n * elemBytes) throw op.protocolError(f, `chunk ${f.chunk} has the wrong size or offset`)
    accumulate(buf, f.offset, f.payload, n, half, accOp)
    releasePayload(f.payload)
    if (f.chunk === 0) memberWeight[k] = f.value
    upDone[k]++
    return true
  }
  await op.until(
    () => upDone.every((d) => d === chunks),
    () => others.filter((_, k) => upDone[k] < chunks)
  )
  let nodeWeight = reduce.weight
  for (const w of memberWeight) nodeWeight += w

  // Regions finished by the ring, waiting to be sent to the node's members.
  const pending: Array<[number, number]> = []
  let sent = 0
  const leaders = nodes.map((g) => g.ranks[0])
  const ringDone = ringReduce(op, buf, {
    members: leaders,
    index: nodeIndex,
    chunkElems: C,
    stepBase: RING,
    reduce: { ...reduce, weight: nodeWeight },
    onFinal: others.length === 0 ? undefined : (off, n) => {
      pending.push([off, n])
      op.notify()
    }
  })
  // ringReduce installed its handler synchronously; hand it the ring frames queued meanwhile.
  op.setHandler(op.handler)

  const broadcast = async (): Promise<void> => {
    if (others.length === 0) return
    let c = 0
    while (sent < expectedResults) {
      if (pending.length === 0) await op.until(() => pending.length > 0, () => [leaders[(nodeIndex - 1 + leaders.length) % leaders.length]])
      const [off, n] = pending[0]
      // A region (the whole buffer when there is one leader) goes out in chunks of at most C.
      const take = Math.min(n, C)
      const view = buf.subarray(off, off + take)
      // handed over: a finished region is not written again
      if (useFanout) await op.sendFanoutBody(node.fanoutToken as string, others, DOWN, c, off, view.length, view, 0, HANDED_OVER)
      else for (const r of others) await op.send(r, DOWN, c, off, view, 0, HANDED_OVER)
      if (take === n) pending.shift()
      else pending[0] = [off + take, n - take]
      c++
      sent++
    }
  }
  await Promise.all([ringDone, broadcast()])
}

export const hierarchical = defineAllReduceAlgorithm({
  name: "hierarchical",
  code: 2,
  hint: "members stream to their node's leader, the leaders run a ring, each leader fans the result out to its node: only leaders cross nodes; wins when links between nodes (or NATS servers) are slow",
  run: (c) => hierarchicalReduce(c.op, c.data, { nodes: c.nodeGroups(), chunkElems: c.chunkElems, reduce: c.reduce }),
  // Every member streams its chunks straight to its leader (all nodes at once, k alike stages), a
  // relay ring among the leaders over the cross links (2(N-1) stages of n/N: no fan-out
  // all-gather), then each leader publishes each chunk once to its node, fanned out to the
  // members (k stages). With one rank per node it is a relay ring.
  stages: ({ bytes, topology, chunkBytes, hierarchy }) => {
    const groups = nodeGroups(topology, hierarchy)
    const { k, chunk } = chunking(bytes, chunkBytes)
    const gather = groups.flatMap((g) => g.slice(1).map((r) => ({ src: r, dsts: [g[0]!], bytes: chunk })))
    const fan = groups.filter((g) => g.length > 1).map((g) => ({ src: g[0]!, dsts: g.slice(1), bytes: chunk }))
    return [
      { name: "intra-node reduce", stages: gather.length > 0 ? [{ flows: gather, times: k }] : [] },
      { name: "leaders ring", stages: ringStages(groups.map((g) => g[0]!), bytes, false) },
      { name: "intra-node broadcast", stages: fan.length > 0 ? [{ flows: fan, times: k }] : [] }
    ]
  }
})
