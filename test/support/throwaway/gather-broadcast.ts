// A throwaway all-reduce algorithm, to show that one is a module and a registration line
// (register.ts) and nothing else: every rank sends its buffer to rank 0 in chunks, rank 0 adds
// them in rank order (the same order whatever the timing, so every rank ends with the same bits),
// finishes each chunk once and publishes it to every rank in one fan-out (or, without fan-out, to
// each rank in turn). Naive on purpose: rank 0 takes in p-1 buffers. test/registry-proof.test.ts
// runs it through the conformance suite and over NATS, like the built-ins.
import { defineAllReduceAlgorithm } from "../../../collectives/algorithms/registry.ts"
import { Flag, type Frame } from "../../../collectives/frames.ts"
import { accumulate, assign } from "../../../collectives/kernels.ts"
import { accumulateOp, finish } from "../../../collectives/reduction.ts"
import { chunkCount, chunkLength } from "../../../collectives/segments.ts"
import { chunking } from "../../../core/collective-cost.ts"
import { releaseReceived } from "../../../core/nats-internals/index.ts"

/** Steps on the wire: contributions to rank 0, results from it. */
const UP = 0
const DOWN = 1

export const gatherBroadcast = defineAllReduceAlgorithm({
  name: "gather-broadcast",
  code: 200,
  hint: "every rank sends its buffer to rank 0, which adds them and sends the result back: naive, a test of the registry",
  usesFanout: true,
  async run({ op, data: buf, rank, worldSize: p, ranks, chunkElems: C, reduce, fanout }) {
    const N = buf.length
    const chunks = chunkCount(N, C)
    const half = reduce.half
    const elemBytes = half ? 2 : 4
    const region = (f: Frame): number => {
      const n = chunkLength(N, C, f.chunk)
      if (f.chunk >= chunks || f.offset !== f.chunk * C || f.payload.length !== n * elemBytes) {
        throw op.protocolError(f, `chunk ${f.chunk}: expected ${n} elements at ${f.chunk * C}`)
      }
      return n
    }
    if (rank !== 0) {
      let got = 0
      op.handler = (f: Frame): boolean => {
        if (f.step !== DOWN || f.src !== 0 || fanout !== ((f.flags & Flag.fanout) !== 0)) throw op.protocolError(f, "results come from rank 0 only")
        if (f.chunk !== got) throw op.protocolError(f, `expected result chunk ${got}, got ${f.chunk}`)
        assign(buf, f.offset, f.payload, region(f), half)
        releaseReceived(f.payload)
        got++
        return true
      }
      // rank 0 takes in every other rank's buffer at once: each gets its share of the window
      op.setFanIn(p - 1)
      for (let c = 0; c < chunks; c++) {
        const off = c * C
        await op.send(0, UP, c, off, buf.subarray(off, off + chunkLength(N, C, c)), reduce.weight)
      }
      await op.until(() => got === chunks, () => [0])
      return
    }
    const done = new Array<number>(p).fill(0)
    const weights = new Array<number>(p).fill(0)
    const accOp = accumulateOp(reduce.op)
    op.handler = (f: Frame): boolean => {
      if (f.step !== UP || f.src <= 0 || f.src >= p) throw op.protocolError(f, `rank 0 expected contributions, got step ${f.step} from ${f.src}`)
      if (f.chunk !== done[f.src]) throw op.protocolError(f, `expected chunk ${done[f.src]} from ${f.src}, got ${f.chunk}`)
      // rank order: rank r's chunk c waits until rank r-1's is in
      if (f.src > 1 && done[f.src - 1] <= f.chunk) return false
      accumulate(buf, f.offset, f.payload, region(f), half, accOp)
      releaseReceived(f.payload)
      if (f.chunk === 0) weights[f.src] = f.value
      done[f.src]++
      return true
    }
    op.setFanIn(1, 1)
    const others = ranks.slice(1)
    const have = (c: number): boolean => others.every((r) => done[r]! > c)
    for (let c = 0; c < chunks; c++) {
      if (!have(c)) await op.until(() => have(c), () => others.filter((r) => done[r]! <= c))
      const off = c * C
      const n = chunkLength(N, C, c)
      finish(buf, off, n, reduce, weights.reduce((a, w) => a + w, reduce.weight))
      const view = buf.subarray(off, off + n)
      if (fanout) await op.sendFanout("all", others, DOWN, c, off, view)
      else for (const r of others) await op.send(r, DOWN, c, off, view)
    }
  },
  stages: ({ bytes, topology, chunkBytes, fanout }) => {
    const { k, chunk } = chunking(bytes, chunkBytes)
    const others = topology.slice(1).map((_, i) => i + 1)
    const down = fanout ? [{ src: 0, dsts: others, bytes: chunk }] : others.map((r) => ({ src: 0, dsts: [r], bytes: chunk }))
    return [
      { name: "gather to rank 0", stages: [{ flows: others.map((r) => ({ src: r, dsts: [0], bytes: chunk })), times: k }] },
      { name: "result from rank 0", stages: [{ flows: down, times: k }] }
    ]
  }
})
