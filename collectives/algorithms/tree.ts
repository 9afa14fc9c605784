// Tree all-reduce: reduce up a binary tree to the root, then send the result down, pipelined in
// chunks (a node forwards chunk c up as soon as its children's chunk c arrived).
//
// Depth is log2(p), so a small buffer needs about 2 log2(p) message latencies instead of the
// ring's 2(p-1): the tree wins small messages. The way down is, by default, one NATS fan-out
// publish per chunk from the root to every rank: the server takes the bytes in once instead of
// p-1 times and there is one hop instead of log2(p). With `fanout: false` each node forwards to
// its children instead. Children are always added in the same order (own + left + right), and
// the root finishes each element once; the down phase copies the root's bits everywhere.
import { accumulate, assign } from "../kernels.ts"
import { Flag, type Frame } from "../frames.ts"
import type { Operation } from "../operation.ts"
import { accumulateOp, finish, type Reduction } from "../reduction.ts"
import { chunkCount, chunkLength } from "../segments.ts"
import { releaseReceived } from "../../core/nats-internals/index.ts"
import { chunking, type CostStage, type Flow } from "../../core/collective-cost.ts"
import { defineAllReduceAlgorithm } from "./registry.ts"

export interface TreeSpec {
  /** Group ranks in tree order: members[0] is the root, the children of position k are 2k+1 and 2k+2. */
  readonly members: ReadonlyArray<number>
  readonly index: number
  readonly chunkElems: number
  readonly stepBase: number
  readonly reduce: Reduction
  /** Fan-out subject token ("all") for the way down, or undefined to forward along the tree. */
  readonly fanoutTarget: string | undefined
}

export const treeReduce = async (op: Operation, buf: Float32Array, spec: TreeSpec): Promise<void> => {
  const { members, index: i, chunkElems: C, stepBase, reduce, fanoutTarget } = spec
  const m = members.length
  const N = buf.length
  if (m === 1) {
    finish(buf, 0, N, reduce, reduce.weight)
    return
  }
  const chunks = chunkCount(N, C)
  const half = reduce.half
  const accOp = accumulateOp(reduce.op)
  const elemBytes = half ? 2 : 4
  const root = members[0]
  const parent = i === 0 ? -1 : members[(i - 1) >> 1]
  const children = [2 * i + 1, 2 * i + 2].filter((k) => k < m).map((k) => members[k])
  const upDone = children.map(() => 0)
  const childWeight = children.map(() => 0)
  let downDone = 0
  const downFrom = fanoutTarget !== undefined ? root : parent

  const region = (f: Frame): number => {
    const n = chunkLength(N, C, f.chunk)
    if (f.chunk >= chunks || f.offset !== f.chunk * C || f.payload.length !== n * elemBytes) {
      throw op.protocolError(f, `chunk ${f.chunk}: expected ${n} elements at ${f.chunk * C}, got ${f.payload.length / elemBytes} at ${f.offset}`)
    }
    return n
  }

  op.handler = (f: Frame): boolean => {
    const t = f.step - stepBase
    if (t === 0) {
      const k = children.indexOf(f.src)
      if (k < 0) throw op.protocolError(f, `rank ${members[i]} is not the parent of ${f.src} in the reduction tree`)
      if (f.chunk !== upDone[k]) throw op.protocolError(f, `expected chunk ${upDone[k]} from child ${f.src}, got ${f.chunk}`)
      // Keep the summation order fixed (own, then left, then right) so results do not depend on timing.
      if (k > 0 && upDone[k - 1] <= f.chunk) return false
      const n = region(f)
      accumulate(buf, f.offset, f.payload, n, half, accOp)
      releaseReceived(f.payload)
      if (f.chunk === 0) childWeight[k] = f.value
      upDone[k]++
      return true
    }
    if (t === 1) {
      if (f.src !== downFrom || (fanoutTarget !== undefined) !== ((f.flags & Flag.fanout) !== 0)) {
        throw op.protocolError(f, `result chunks come from rank ${downFrom} only`)
      }
      if (f.chunk !== downDone) throw op.protocolError(f, `expected result chunk ${downDone}, got ${f.chunk}`)
      const n = region(f)
      assign(buf, f.offset, f.payload, n, half)
      releaseReceived(f.payload)
      downDone++
      return true
    }
    throw op.protocolError(f, `unexpected step ${t}`)
  }

  // An inner node is fed by up to two children and the way down at once.
  op.setFanIn(3, 3)
  const childrenHave = (c: number): boolean => {
    for (let k = 0; k < upDone.length; k++) if (upDone[k] <= c) return false
    return true
  }
  const lagging = (c: number) => (): number[] => children.filter((_, k) => upDone[k] <= c)
  const subtreeWeight = (): number => {
    let w = reduce.weight
    for (const cw of childWeight) w += cw
    return w
  }

  const up = async (): Promise<void> => {
    for (let c = 0; c < chunks; c++) {
      if (!childrenHave(c)) await op.until(() => childrenHave(c), lagging(c))
      const off = c * C
      const n = chunkLength(N, C, c)
      if (i === 0) {
        finish(buf, off, n, reduce, subtreeWeight())
        if (fanoutTarget !== undefined) {
          await op.sendFanout(fanoutTarget, members.slice(1), stepBase + 1, c, off, buf.subarray(off, off + n))
        } else {
          for (const child of children) await op.send(child, stepBase + 1, c, off, buf.subarray(off, off + n))
        }
      } else {
        await op.send(parent, stepBase, c, off, buf.subarray(off, off + n), subtreeWeight())
      }
    }
  }

  const down = async (): Promise<void> => {
    const waitDown = (): number[] => [downFrom]
    if (fanoutTarget !== undefined || children.length === 0) {
      await op.until(() => downDone === chunks, waitDown)
      return
    }
    for (let c = 0; c < chunks; c++) {
      if (downDone <= c) await op.until(() => downDone > c, waitDown)
      const off = c * C
      const n = chunkLength(N, C, c)
      for (const child of children) await op.send(child, stepBase + 1, c, off, buf.subarray(off, off + n))
    }
  }

  if (i === 0) await up()
  else await Promise.all([up(), down()])
}

/** Heap-ordered binary tree over `members` (global ranks); depth of member j is floor(log2(j+1)). */
const depthOf = (j: number): number => Math.floor(Math.log2(j + 1))

/**
 * The tree's stages for the cost model, as treeReduce runs it: chunk q leaves a node at depth l
 * (towards its parent) at stage q + (H - l) and reaches the root at the end of stage q + H - 1.
 * With `fanout` the root publishes it once, fanned out by the server to every other rank, at stage
 * q + H, so the whole all-reduce is H + k stages; without, it goes down a level per stage (a node
 * at depth d - 1 sends it to its children at stage q + H + d - 1): 2H + k - 1 stages. The way down
 * overlaps the way up (while chunk q goes down, later chunks are still coming up). The steady
 * state (every level busy) is one stage repeated, so a stream of millions of chunks is a few stages.
 */
export const treeStages = (members: readonly number[], k: number, chunk: number, fanout = true): CostStage[] => {
  const g = members
  if (g.length <= 1) return []
  const H = depthOf(g.length - 1)
  const downStages = fanout ? 1 : H
  const total = H + k + downStages - 1
  // first stage with every level of both ways busy
  const steady = H + downStages - 1
  const others = g.slice(1)
  const out: CostStage[] = []
  for (let j = 0; j < total; j++) {
    const repeat = j === steady && k - 1 >= steady ? k - steady : 1
    const flows: Flow[] = []
    for (let l = H; l >= 1; l--) {
      const q = j - (H - l)
      if (q < 0 || q >= k) continue
      for (let m = 1; m < g.length; m++) if (depthOf(m) === l) flows.push({ src: g[m]!, dsts: [g[(m - 1) >> 1]!], bytes: chunk })
    }
    if (fanout) {
      const down = j - H
      if (down >= 0 && down < k) flows.push({ src: g[0]!, dsts: others, bytes: chunk })
    } else {
      for (let d = 1; d <= H; d++) {
        const q = j - H - (d - 1)
        if (q < 0 || q >= k) continue
        for (let m = 1; m < g.length; m++) if (depthOf(m) === d) flows.push({ src: g[(m - 1) >> 1]!, dsts: [g[m]!], bytes: chunk })
      }
    }
    out.push({ flows, times: repeat })
    j += repeat - 1
  }
  return out
}

export const tree = defineAllReduceAlgorithm({
  name: "tree",
  code: 1,
  hint: "reduce up a binary tree, pipelined in chunks; the root fans the result out: about log2(p) latencies; wins small buffers",
  usesFanout: true,
  run: (c) =>
    treeReduce(c.op, c.data, {
      members: c.ranks,
      index: c.rank,
      chunkElems: c.chunkElems,
      stepBase: 0,
      reduce: c.reduce,
      fanoutTarget: c.fanout ? "all" : undefined
    }),
  stages: ({ bytes, topology, chunkBytes, fanout }) => {
    const { k, chunk } = chunking(bytes, chunkBytes)
    return [{ name: fanout ? "tree reduce + root fan-out" : "tree reduce + broadcast down", stages: treeStages(topology.map((_, r) => r), k, chunk, fanout) }]
  }
})
