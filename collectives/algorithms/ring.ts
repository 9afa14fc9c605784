// Ring reduce-scatter and all-reduce (reduce-scatter, then all-gather), chunked and pipelined.
//
// The m members form a ring; each sends only to the next and receives only from the previous, so
// every link carries 2(m-1)/m of the buffer and no rank is a hot spot. With the segment numbering
// used here, member i ends the reduce-scatter owning segment i:
//   reduce-scatter step t (0..m-2): send segment i-t-1, receive segment i-t-2 and add it in;
//   all-gather step t (0..m-2):     send segment i-t,   receive segment i-t-1 and copy it in.
// Each step forwards what the previous step received, chunk by chunk: chunk c of step t+1 leaves
// as soon as chunk c of step t has arrived, so a large buffer streams through the ring instead of
// moving one whole segment per step. The owner finishes its segment (mean, weighted mean, fp16
// rounding) once, and the all-gather copies those bits everywhere.
//
// A relay step of the reduce-scatter (a partial sum that only passes through this rank) is added
// into the received message itself, which is then sent on as is: the buffer is only read. With
// fp16 on the wire the sum is re-encoded into the message in the same pass (sums only; max keeps
// the decode-into-buffer path), so a relay costs one pass and no encode on sending.
//
// The owner of a segment, for fp16 sums, does the same with the last message it receives: it adds
// its own values into that message, decodes the message into its buffer, and all-gathers the
// message itself (no rounding pass, no encode). With a `halfSource` (fp16 sums) this rank's values
// are made as the ring needs them: binary16 bits for the first send, an addition into a message
// for a relay or the owner, fp32 values in `buf` for the rare fallback. fp16 error feedback uses it
// to compensate and cast only the segment this rank sends first (see gradient-reducer.ts);
// all of this rank's values as binary16 bits (allReduce's `halfInput`) are the simplest source.
//
// With `gatherFanout`, the all-gather is one NATS fan-out publish per chunk from each owner to
// every member instead of m-1 relays: each rank sends (m-1)/m less, the server takes each final
// byte in once, and no rank waits on a chain of forwards. The reduce-scatter stays a ring.
import { addHalfIntoHalf, decodeHalf } from "../float16.ts"
import { accumulate, accumulateIntoHalfPayload, accumulateIntoPayload, assign } from "../kernels.ts"
import { Flag, type Frame } from "../frames.ts"
import { HANDED_OVER, type Handover, type Operation } from "../operation.ts"
import { accumulateAndFinish, accumulateOp, finish, type Reduction } from "../reduction.ts"
import { chunkCount, chunkLength, mod, segmentStart } from "../segments.ts"
import { releaseReceived } from "../../core/nats-internals/index.ts"
import { spaceSlots } from "../simd.ts"
import type { CostStage } from "../../core/collective-cost.ts"
import { defineAllReduceAlgorithm, type HalfSource } from "./registry.ts"

export type { HalfSource } from "./registry.ts"

export interface RingSpec {
  /** Group ranks in ring order. */
  readonly members: ReadonlyArray<number>
  /** This rank's position in `members`. */
  readonly index: number
  readonly chunkElems: number
  /** Added to the step numbers on the wire, so phases of one operation stay apart. */
  readonly stepBase: number
  readonly reduce: Reduction
  /** Stop after the reduce-scatter (each member then holds its own segment, finished). */
  readonly scatterOnly?: boolean
  /** All-gather by fan-out to this subject token ("all"; every member must subscribe to it and nobody else). */
  readonly gatherFanout?: string
  /**
   * This rank's values, made on demand (op "sum" with fp16 on the wire only; the communicator
   * checks this): `buf` holds whatever the source reads its values from and ends with the result.
   */
  readonly halfSource?: HalfSource
  /** Called when the region [off, off+n) holds its final value on this rank. */
  readonly onFinal?: (off: number, n: number) => void
}

/** The source for values given as binary16 bits (allReduce's `halfInput`): `buf` is only written. */
export const halfBitsSource = (bits: Uint16Array, buf: Float32Array): HalfSource => ({
  bits: (off, n) => new Uint8Array(bits.buffer, bits.byteOffset + off * 2, n * 2),
  addInto: (h, off, n, final) => {
    addHalfIntoHalf(bits.subarray(off, off + n), h)
    if (final) decodeHalf(h, buf.subarray(off, off + n))
  },
  load: (off, n) => decodeHalf(bits.subarray(off, off + n), buf.subarray(off, off + n))
})

/** dst = the values of all of a source's bits (`bits(0, dst.length)`), for a rank that does not ring them. */
export const decodeSourceBits = (src: HalfSource, dst: Float32Array): void => {
  const b = src.bits(0, dst.length)
  // a view when the bytes are 2-aligned (every source here), else a copy
  const h = b.byteOffset & 1 ? new Uint16Array(b.slice().buffer) : new Uint16Array(b.buffer, b.byteOffset, dst.length)
  decodeHalf(h, dst)
}

/**
 * Every send hands its body over to the transport (Handover), so the direct path writes it without
 * a copy. Safe for views of `buf`: a region this rank has sent is written again only when a frame
 * that needed it comes back round (the all-gather's copy of a segment whose reduce-scatter part
 * this rank sent), by which time the peer has read it; and the call resolves only once every send
 * is written. A received message sent on goes back to its pool when written.
 */
const released = (body: Uint8Array): Handover => ({ release: () => releasePayload(body) })

/** Gives a received payload back: to the slots of the space it was read into, or to the receive pool. */
export const releasePayload = (payload: Uint8Array): void => {
  if (spaceSlots(payload)?.give(payload) !== true) releaseReceived(payload)
}

/** Runs a ring over `spec.members` on `buf` (in place). Resolves when this rank's part is done. */
export const ringReduce = async (op: Operation, buf: Float32Array, spec: RingSpec): Promise<void> => {
  const { members, index: i, chunkElems: C, stepBase, reduce, onFinal, gatherFanout, halfSource } = spec
  const m = members.length
  const N = buf.length
  if (m === 1) {
    if (halfSource) decodeSourceBits(halfSource, buf)
    finish(buf, 0, N, reduce, reduce.weight)
    onFinal?.(0, N)
    return
  }
  const next = members[(i + 1) % m]
  const prev = members[(i - 1 + m) % m]
  const rsSteps = m - 1
  const fanout = gatherFanout !== undefined && !spec.scatterOnly
  // Steps this rank receives from `prev` (and, without fan-out, sends to `next`).
  const ringSteps = spec.scatterOnly || fanout ? rsSteps : 2 * (m - 1)
  // Steps this rank sends on: with fan-out, the reduce-scatter's and one all-gather publish.
  const sendSteps = fanout ? rsSteps + 1 : ringSteps
  const sendSeg = (t: number): number => (t < rsSteps ? mod(i - t - 1, m) : mod(i - (t - rsSteps), m))
  const recvSeg = (t: number): number => (t < rsSteps ? mod(i - t - 2, m) : mod(i - (t - rsSteps) - 1, m))
  const segStart = (k: number): number => segmentStart(N, m, k)
  const segLen = (k: number): number => segmentStart(N, m, k + 1) - segmentStart(N, m, k)
  const half = reduce.half
  const accOp = accumulateOp(reduce.op)
  const elemBytes = half ? 2 : 4
  // Receive progress: frames from `prev` arrive in order (NATS keeps one publisher's order).
  let recvStep = 0
  let recvChunk = 0
  const recvWeight = new Float64Array(rsSteps)
  // Fan-out all-gather: chunks received so far from each member (by ring position).
  // Reduce-scatter relay: partial sums held as received messages, keyed by the (step, chunk) they go out as.
  const relay = new Map<number, Uint8Array>()
  let relayBytes = 0
  /** Keeps a received message to go out as step t chunk c (see take). */
  const hold = (t: number, c: number, payload: Uint8Array): void => {
    relay.set(t * 2 ** 32 + c, payload)
    relayBytes += payload.length
  }
  const gathered = new Array<number>(m).fill(0)
  // The owner's finished messages, all-gathered as they are (fp16 sums; see the header).
  const ownerKeeps = reduce.half && reduce.op === "sum" && sendSteps > rsSteps
  /** buf[off..off+n) = this rank's own values, when a source makes them. */
  const loadOwn = (off: number, n: number): void => halfSource?.load(off, n)
  /** The binary16 message = half(message + own values); `final`: buf[off..off+n) = its values too. */
  const addOwnIntoHalf = (payload: Uint8Array, off: number, n: number, final: boolean): void => {
    if (halfSource) halfSource.addInto(new Uint16Array(payload.buffer, payload.byteOffset, n), off, n, final)
    else {
      accumulateIntoHalfPayload(payload, buf, off, n)
      if (final) assign(buf, off, payload, n, true)
    }
  }
  let gatherLeft = 0
  if (fanout) for (let k = 0; k < m; k++) if (k !== i) gatherLeft += chunkCount(segLen(k), C)

  const place = (f: Frame, seg: number, chunk: number): number => {
    const n = chunkLength(segLen(seg), C, chunk)
    const off = segStart(seg) + chunk * C
    if (f.offset !== off || f.payload.length !== n * elemBytes) {
      throw op.protocolError(f, `segment ${seg} chunk ${chunk}: expected ${n} elements at ${off}, got ${f.payload.length / elemBytes} at ${f.offset}`)
    }
    return n
  }

  /** The region of `buf` an fp32 all-gather frame goes to, when it is the one expected next and its size fits. */
  const regionFor = (seg: number, chunk: number, offset: number, bytes: number): Uint8Array | undefined => {
    const n = chunkLength(segLen(seg), C, chunk)
    const off = segStart(seg) + chunk * C
    return offset === off && bytes === n * 4 ? new Uint8Array(buf.buffer, buf.byteOffset + off * 4, bytes) : undefined
  }
  // An fp32 all-gather frame is read straight into its place in `buf` (on the direct links): that
  // region's old values went out with this rank's reduce-scatter sends, which the frame's owner
  // needed before it could finish the region, so nothing still reads them. A reduce-scatter frame
  // goes into a slot of `buf`'s space when it has them (simdSpaceWithSlots: the communicator's
  // allocate), so its sum with `buf` runs in place.
  const slots = spaceSlots(buf)
  if (!half && !spec.scatterOnly) {
    op.place = (head, bytes) => {
      if (fanout && (head.flags & Flag.fanout) !== 0) {
        const k = members.indexOf(head.src)
        return k < 0 || k === i || head.chunk !== gathered[k] ? undefined : regionFor(k, head.chunk, head.offset, bytes)
      }
      const t = head.step - stepBase
      if (head.src !== prev) return undefined
      if (t >= 0 && t < rsSteps) return slots?.take(bytes)
      if (t !== recvStep || head.chunk !== recvChunk) return undefined
      return regionFor(recvSeg(t), head.chunk, head.offset, bytes)
    }
  }

  op.handler = (f: Frame): boolean => {
    if (fanout && (f.flags & Flag.fanout) !== 0) {
      const k = members.indexOf(f.src)
      if (k < 0 || k === i || f.chunk !== gathered[k]) throw op.protocolError(f, `unexpected all-gather chunk ${f.chunk} from ${f.src}`)
      const n = place(f, k, f.chunk)
      assign(buf, f.offset, f.payload, n, half)
      releasePayload(f.payload)
      onFinal?.(f.offset, n)
      gathered[k]++
      gatherLeft--
      return true
    }
    if (f.src !== prev) throw op.protocolError(f, `ring member ${members[i]} receives only from ${prev}`)
    const t = f.step - stepBase
    if (t !== recvStep || f.chunk !== recvChunk) {
      throw op.protocolError(f, `expected step ${recvStep} chunk ${recvChunk}, got step ${t} chunk ${f.chunk}`)
    }
    const seg = recvSeg(t)
    const n = place(f, seg, f.chunk)
    const off = f.offset
    if (t < rsSteps) {
      if (f.chunk === 0) recvWeight[t] = f.value
      const keep =
        relayBytes < op.host.windowBytes && (half ? accOp === "sum" && (f.payload.byteOffset & 1) === 0 : (f.payload.byteOffset & 3) === 0)
      if (t === rsSteps - 1) {
        // The last contribution to segment i arrives at its owner: finish it, once.
        if (ownerKeeps && keep) {
          addOwnIntoHalf(f.payload, off, n, true)
          hold(rsSteps, f.chunk, f.payload)
        } else {
          loadOwn(off, n)
          accumulateAndFinish(buf, off, f.payload, n, reduce, f.value + reduce.weight)
          releasePayload(f.payload)
        }
        onFinal?.(off, n)
      } else if (keep) {
        if (half) addOwnIntoHalf(f.payload, off, n, false)
        else accumulateIntoPayload(f.payload, buf, off, n, accOp)
        hold(t + 1, f.chunk, f.payload)
      } else {
        loadOwn(off, n)
        accumulate(buf, off, f.payload, n, half, accOp)
        releasePayload(f.payload)
      }
    } else {
      assign(buf, off, f.payload, n, half)
      releasePayload(f.payload)
      onFinal?.(off, n)
    }
    if (++recvChunk === chunkCount(segLen(seg), C)) {
      recvStep++
      recvChunk = 0
    }
    return true
  }

  // A receiver's window is shared by its ring link and, with fan-out, the m-1 owners' streams.
  if (fanout) op.setFanIn(2, 2 * (m - 1))
  const received = (t: number, c: number): boolean => recvStep > t || (recvStep === t && recvChunk > c)
  const waitPrev = (): number[] => [prev]
  const others = fanout ? members.filter((_, k) => k !== i) : []
  /** The message kept to go out as step t chunk c, if there is one. */
  const take = (t: number, c: number): Uint8Array | undefined => {
    const key = t * 2 ** 32 + c
    const body = relay.get(key)
    if (body) {
      relay.delete(key)
      relayBytes -= body.length
    }
    return body
  }

  for (let t = 0; t < sendSteps; t++) {
    const seg = sendSeg(t)
    const start = segStart(seg)
    const len = segLen(seg)
    const chunks = chunkCount(len, C)
    for (let c = 0; c < chunks; c++) {
      if (t > 0 && !received(t - 1, c)) {
        const tt = t - 1
        const cc = c
        await op.until(() => received(tt, cc), waitPrev)
      }
      const off = start + c * C
      const view = buf.subarray(off, off + chunkLength(len, C, c))
      if (t < rsSteps) {
        // The weight that travels with a partial sum: all contributions it holds.
        const weight = t === 0 ? reduce.weight : recvWeight[t - 1] + reduce.weight
        // The partial sum received as step t-1 chunk c, if it was kept as a message.
        const body = t > 0 ? take(t, c) : halfSource?.bits(off, view.length)
        if (body) await op.sendBody(next, stepBase + t, c, off, view.length, body, weight, released(body))
        else await op.send(next, stepBase + t, c, off, view, weight, HANDED_OVER)
      } else {
        // the owner's own segment (first all-gather step) may go out as its finished message
        const body = t === rsSteps ? take(t, c) : undefined
        const handover = body ? released(body) : HANDED_OVER
        if (fanout) await op.sendFanoutBody(gatherFanout as string, others, stepBase + t, c, off, view.length, body ?? view, 0, handover)
        else await op.sendBody(next, stepBase + t, c, off, view.length, body ?? view, 0, handover)
      }
    }
  }
  await op.until(
    () => recvStep === ringSteps && gatherLeft === 0,
    () => (recvStep < ringSteps ? [prev] : members.filter((_, k) => k !== i && gathered[k] < chunkCount(segLen(k), C)))
  )
}

/**
 * The ring's stages for the cost model, over `members` (global ranks in ring order): p-1
 * reduce-scatter steps, every member i -> i+1 sends n/p; then the all-gather, either as one stage
 * in which every member publishes its finished n/p once and the server delivers it to the p-1
 * others (`fanoutGather`, what the ring all-reduce does for p > 2), or as p-1 more relay steps
 * (p = 2, and the leaders' ring of hierarchical).
 */
export const ringStages = (members: readonly number[], bytes: number, fanoutGather: boolean): CostStage[] => {
  const q = members.length
  if (q <= 1) return []
  const relay = members.map((r, i) => ({ src: r, dsts: [members[(i + 1) % q]!], bytes: bytes / q }))
  if (!fanoutGather || q <= 2) return [{ flows: relay, times: 2 * (q - 1) }]
  const gather = members.map((r) => ({ src: r, dsts: members.filter((d) => d !== r), bytes: bytes / q }))
  return [
    { flows: relay, times: q - 1 },
    { flows: gather, times: 1 }
  ]
}

export const ring = defineAllReduceAlgorithm({
  name: "ring",
  code: 0,
  hint: "reduce-scatter around a ring, then each owner fans its segment out: 2(p-1)/p of the buffer per rank, p latencies; wins large buffers",
  usesFanout: true,
  takesHalfSource: true,
  run: (c) =>
    ringReduce(c.op, c.data, {
      members: c.ranks,
      index: c.rank,
      chunkElems: c.chunkElems,
      stepBase: 0,
      reduce: c.reduce,
      // With two ranks a fan-out reaches one receiver: the plain relay is the same traffic with a
      // whole window for the one link.
      gatherFanout: c.fanout && c.worldSize > 2 ? "all" : undefined,
      halfSource: c.halfSource
    }),
  stages: ({ bytes, topology, fanout }) => [{ name: "ring reduce-scatter + all-gather", stages: ringStages(topology.map((_, r) => r), bytes, fanout) }]
})
