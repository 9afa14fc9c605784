// Broadcast (root -> every rank), all-gather (every rank's block -> every rank) and the barrier.
//
// Broadcast and the fan-out all-gather use NATS fan-out: one publish per chunk to the group's
// "all" subject, copied by the server to every subscriber, so the server takes each byte in once
// instead of p-1 times. The alternatives (`tree` broadcast, `ring` all-gather) relay through the
// ranks instead; they exist for comparison and for servers far apart. The barrier is the
// dissemination barrier: ceil(log2 p) rounds of one empty frame each.
import { assign } from "./kernels.ts"
import { Flag, type Frame } from "./frames.ts"
import type { Operation } from "./operation.ts"
import { chunkCount, chunkLength, mod } from "./segments.ts"
import { releaseReceived } from "../core/nats-internals/index.ts"

const checkChunk = (op: Operation, f: Frame, len: number, C: number, half: boolean, expectedChunk: number, base: number): number => {
  const n = chunkLength(len, C, f.chunk)
  if (f.chunk !== expectedChunk || f.offset !== base + f.chunk * C || f.payload.length !== n * (half ? 2 : 4)) {
    throw op.protocolError(f, `expected chunk ${expectedChunk} (${n} elements at ${base + expectedChunk * C}), got chunk ${f.chunk} at ${f.offset}`)
  }
  return n
}

/** Root sends `buf` to every rank; `fanout`: one publish per chunk to "all", else a binary tree relay. */
export const broadcastChunks = async (op: Operation, buf: Float32Array, root: number, p: number, C: number, half: boolean, fanout: boolean): Promise<void> => {
  const me = op.rank
  const N = buf.length
  const chunks = chunkCount(N, C)
  // Tree positions relative to the root: position k is rank (root + k) mod p.
  const pos = mod(me - root, p)
  const parent = pos === 0 ? -1 : mod(root + ((pos - 1) >> 1), p)
  const children = [2 * pos + 1, 2 * pos + 2].filter((k) => k < p).map((k) => mod(root + k, p))
  const from = fanout ? root : parent
  let got = 0
  op.handler = (f: Frame): boolean => {
    if (f.src !== from || fanout !== ((f.flags & Flag.fanout) !== 0)) throw op.protocolError(f, `broadcast data comes from rank ${from} only (root ${root})`)
    const n = checkChunk(op, f, N, C, half, got, 0)
    assign(buf, f.offset, f.payload, n, half)
    releaseReceived(f.payload)
    got++
    return true
  }
  if (me === root) {
    const others: number[] = []
    for (let r = 0; r < p; r++) if (r !== root) others.push(r)
    for (let c = 0; c < chunks; c++) {
      const off = c * C
      const view = buf.subarray(off, off + chunkLength(N, C, c))
      if (fanout) await op.sendFanout("all", others, 0, c, off, view)
      else for (const child of children) await op.send(child, 0, c, off, view)
    }
    return
  }
  const waitFrom = (): number[] => [from]
  for (let c = 0; c < chunks; c++) {
    if (got <= c) await op.until(() => got > c, waitFrom)
    if (!fanout) {
      const off = c * C
      const view = buf.subarray(off, off + chunkLength(N, C, c))
      for (const child of children) await op.send(child, 0, c, off, view)
    }
  }
}

/**
 * All-gather into `out` (p blocks of n; this rank's block already in place).
 * `fanout`: each rank publishes its block once to "all"; else a ring passes blocks along in p-1 steps.
 */
export const allGatherBlocks = async (op: Operation, out: Float32Array, n: number, p: number, C: number, half: boolean, fanout: boolean): Promise<void> => {
  const me = op.rank
  const chunks = chunkCount(n, C)
  if (fanout) {
    // Every rank takes in p-1 blocks at once.
    op.setFanIn(1, p - 1)
    const got = new Array<number>(p).fill(0)
    got[me] = chunks
    op.handler = (f: Frame): boolean => {
      if (f.src === me || f.src >= p || (f.flags & Flag.fanout) === 0) throw op.protocolError(f, "all-gather blocks come as fan-out publishes")
      const len = checkChunk(op, f, n, C, half, got[f.src], f.src * n)
      assign(out, f.offset, f.payload, len, half)
      releaseReceived(f.payload)
      got[f.src]++
      return true
    }
    const others: number[] = []
    for (let r = 0; r < p; r++) if (r !== me) others.push(r)
    for (let c = 0; c < chunks; c++) {
      const off = me * n + c * C
      await op.sendFanout("all", others, 0, c, off, out.subarray(off, off + chunkLength(n, C, c)))
    }
    await op.until(() => got.every((g) => g === chunks), () => others.filter((r) => got[r] < chunks))
    return
  }
  // Ring: step t sends block me-t and receives block me-t-1 from the previous rank.
  const next = mod(me + 1, p)
  const prev = mod(me - 1, p)
  const steps = p - 1
  let recvStep = 0
  let recvChunk = 0
  op.handler = (f: Frame): boolean => {
    if (f.src !== prev || f.step !== recvStep) throw op.protocolError(f, `expected step ${recvStep} from rank ${prev}, got step ${f.step} from ${f.src}`)
    const base = mod(me - recvStep - 1, p) * n
    const len = checkChunk(op, f, n, C, half, recvChunk, base)
    assign(out, f.offset, f.payload, len, half)
    releaseReceived(f.payload)
    if (++recvChunk === chunks) {
      recvStep++
      recvChunk = 0
    }
    return true
  }
  const received = (t: number, c: number): boolean => recvStep > t || (recvStep === t && recvChunk > c)
  const waitPrev = (): number[] => [prev]
  for (let t = 0; t < steps; t++) {
    const base = mod(me - t, p) * n
    for (let c = 0; c < chunks; c++) {
      if (t > 0 && !received(t - 1, c)) await op.until(() => received(t - 1, c), waitPrev)
      const off = base + c * C
      await op.send(next, t, c, off, out.subarray(off, off + chunkLength(n, C, c)))
    }
  }
  await op.until(() => recvStep === steps, waitPrev)
}

/**
 * Each rank's `data` to rank + by mod p, rank - by's into `out` (as long as `data`): with by = 1 one
 * step of the ring all-gather, f32 on the wire (the receiver holds the sender's bits).
 */
export const shiftBlock = (op: Operation, data: Float32Array, out: Float32Array, p: number, C: number, by = 1): Promise<void> =>
  blockBetween(op, data, out, mod(op.rank + by, p), mod(op.rank - by, p), C)

/** Both ways with one peer: `data` to `partner` while the partner's block lands in `out` (n elements each). */
export const exchangeBlock = (op: Operation, data: Float32Array, out: Float32Array, partner: number, C: number): Promise<void> =>
  blockBetween(op, data, out, partner, partner, C)

/** `data` to rank `next` in chunks while rank `prev`'s block of as many elements lands in `out`. */
const blockBetween = async (op: Operation, data: Float32Array, out: Float32Array, next: number, prev: number, C: number): Promise<void> => {
  const n = data.length
  const chunks = chunkCount(n, C)
  let got = 0
  op.handler = (f: Frame): boolean => {
    if (f.src !== prev || f.step !== 0) throw op.protocolError(f, `expected a block from rank ${prev}, got step ${f.step} from ${f.src}`)
    const len = checkChunk(op, f, n, C, false, got, 0)
    assign(out, f.offset, f.payload, len, false)
    releaseReceived(f.payload)
    got++
    return true
  }
  for (let c = 0; c < chunks; c++) {
    const off = c * C
    await op.send(next, 0, c, off, data.subarray(off, off + chunkLength(n, C, c)))
  }
  await op.until(() => got === chunks, () => [prev])
}

const EMPTY = new Float32Array(0)

/** Dissemination barrier: in round k, signal rank me+2^k and wait for rank me-2^k. */
export const disseminationBarrier = async (op: Operation, p: number): Promise<void> => {
  const me = op.rank
  const rounds = Math.ceil(Math.log2(p))
  const arrived = new Array<boolean>(rounds).fill(false)
  op.handler = (f: Frame): boolean => {
    const k = f.step
    if (k >= rounds || f.src !== mod(me - (1 << k), p) || arrived[k]) throw op.protocolError(f, `unexpected barrier round ${k}`)
    arrived[k] = true
    return true
  }
  for (let k = 0; k < rounds; k++) {
    await op.send(mod(me + (1 << k), p), k, 0, 0, EMPTY)
    if (!arrived[k]) await op.until(() => arrived[k], () => [mod(me - (1 << k), p)])
  }
}
