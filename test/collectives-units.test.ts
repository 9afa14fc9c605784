// Pure parts of the collectives: fp16 conversion, segment and chunk cuts, bucket plans, credit
// windows, frame headers.
import { headers, type Msg } from "@nats-io/nats-core"
import { describe, expect, it } from "vitest"
import { planBuckets } from "../collectives/bucketing.ts"
import { AckLedger, FanoutWindow, SendWindow } from "../collectives/flow-control.ts"
import { decodeHalf, encodeHalf, halfTable, roundToHalf } from "../collectives/float16.ts"
import { Flag, FrameAssembler, Kind, Opcode, Variant, frameHeaders, readFrame, splitFrame, variantOf, type Frame } from "../collectives/frames.ts"
import { describeOp } from "../collectives/communicator.ts"
import { chunkCount, chunkLength, segmentBounds } from "../collectives/segments.ts"
import { prng } from "./support/collectives-cases.ts"

describe("float16", () => {
  it("round-trips every non-NaN half exactly", () => {
    const t = halfTable()
    const bits = new Uint16Array(65536).map((_, i) => i)
    const values = new Float32Array(65536)
    decodeHalf(bits, values)
    const back = new Uint16Array(65536)
    encodeHalf(values, back)
    for (let h = 0; h < 65536; h++) {
      if (Number.isNaN(t[h])) expect(Number.isNaN(t[back[h]])).toBe(true)
      else expect(back[h]).toBe(h)
    }
  })

  it("rounds to the nearest half, ties to even, and saturates to infinity", () => {
    const t = halfTable()
    const rnd = prng(5)
    const xs = new Float32Array(200_000)
    for (let i = 0; i < xs.length; i++) {
      // Magnitudes from subnormal halves to beyond the half range.
      xs[i] = (rnd() < 0.5 ? -1 : 1) * 2 ** (rnd() * 44 - 27) * (1 + rnd())
    }
    xs.set([0, -0, 65504, 65519.99, 65520, 1e10, -1e10, 2 ** -25, 2 ** -24 * 1.5, 2 ** -24 * 2.5, 1 + 2 ** -11, 1 + 3 * 2 ** -11], 0)
    const h = new Uint16Array(xs.length)
    encodeHalf(xs, h)
    for (let i = 0; i < xs.length; i++) {
      const x = xs[i]
      const got = t[h[i]]
      if (Math.abs(x) >= 65520) {
        expect(got).toBe(x > 0 ? Infinity : -Infinity)
        continue
      }
      // No other half is closer; on a tie the chosen one has an even mantissa.
      const err = Math.abs(got - x)
      for (const d of [-1, 1]) {
        const other = t[(h[i] + d) & 0xffff]
        if (!Number.isFinite(other) || Math.sign(other) !== Math.sign(got)) continue
        const e2 = Math.abs(other - x)
        expect(err <= e2).toBe(true)
        if (err === e2 && err > 0) expect(h[i] & 1).toBe(0)
      }
    }
    const r = Float32Array.from(xs.subarray(0, 1000))
    roundToHalf(r)
    for (let i = 0; i < 1000; i++) expect(Object.is(r[i], t[h[i]])).toBe(true)
  })
})

describe("segments and chunks", () => {
  it("cut any length into p segments differing by at most one, covering it exactly", () => {
    for (const n of [0, 1, 2, 7, 100, 1001]) {
      for (let p = 1; p <= 9; p++) {
        let covered = 0
        const sizes: number[] = []
        for (let k = 0; k < p; k++) {
          const [s, e] = segmentBounds(n, p, k)
          expect(s).toBe(covered)
          covered = e
          sizes.push(e - s)
        }
        expect(covered).toBe(n)
        expect(Math.max(...sizes) - Math.min(...sizes)).toBeLessThanOrEqual(1)
      }
    }
  })

  it("give every region at least one chunk, of at most the chunk size", () => {
    expect(chunkCount(0, 10)).toBe(1)
    expect(chunkLength(0, 10, 0)).toBe(0)
    expect(chunkCount(25, 10)).toBe(3)
    expect([0, 1, 2].map((c) => chunkLength(25, 10, c))).toEqual([10, 10, 5])
  })
})

describe("bucket plan", () => {
  it("packs in order, keeps the first bucket small and gives big variables their own bucket", () => {
    // 4-byte elements: first bucket 40 B = 10 elements, the others 100 B = 25 elements.
    const plan = planBuckets([4, 4, 4, 10, 30, 5, 0, 20, 3], 100, 40)
    expect(plan.map((b) => b.vars)).toEqual([[0, 1], [2, 3], [4], [5, 6, 7], [8]])
    expect(plan.map((b) => b.direct)).toEqual([false, false, true, false, false])
    expect(plan[3].offsets).toEqual([0, 5, 5])
    expect(plan[3].length).toBe(25)
    expect(planBuckets([], 100, 40)).toEqual([])
  })

  it("is the same for the same sizes (every rank builds the same plan)", () => {
    const sizes = Array.from({ length: 50 }, (_, i) => (i * 7919) % 3000)
    expect(planBuckets(sizes, 4096, 1024)).toEqual(planBuckets([...sizes], 4096, 1024))
  })
})

describe("credit windows", () => {
  it("a link sends until its window is full, and always when nothing is outstanding", () => {
    const w = new SendWindow(100)
    expect(w.canSend(500)).toBe(true) // larger than the window, but nothing outstanding
    w.sent = 60
    expect(w.canSend(40)).toBe(true)
    expect(w.canSend(41)).toBe(false)
    w.onAck(30)
    expect(w.canSend(70)).toBe(true)
    w.onAck(10) // an older, smaller cumulative ack changes nothing
    expect(w.acked).toBe(30)
  })

  it("a fan-out window is held back by its slowest receiver", () => {
    const w = new FanoutWindow(100, [1, 2, 3])
    w.sent = 100
    w.onAck(1, 100)
    w.onAck(2, 100)
    expect(w.canSend(10)).toBe(false)
    expect(w.laggards()).toEqual([3])
    w.onAck(3, 50)
    expect(w.canSend(50)).toBe(true)
    expect(w.canSend(51)).toBe(false)
  })

  it("a receiver acks every ackEvery bytes, and at once when asked", () => {
    const l = new AckLedger(100)
    expect(l.consume(60, false)).toBe(-1)
    expect(l.consume(60, false)).toBe(120)
    expect(l.consume(10, false)).toBe(-1)
    expect(l.consume(10, true)).toBe(140)
  })
})

describe("frames", () => {
  it("carry a 40-byte header in a NATS header block that keeps the body 4-byte aligned", () => {
    const h = frameHeaders(Kind.data, Flag.fanout | Flag.half, 5, 17, 123456, 7, 3, 99, 1_000_001, 5000, 2.5)
    // What nats.js writes on the wire (MsgHdrsImpl.encode, not part of the MsgHdrs type).
    const block = (h as unknown as { encode(): Uint8Array }).encode()
    expect(block.length % 4).toBe(0)
    const data = new Uint8Array(8)
    const f = readFrame({ headers: h, data } as unknown as Msg)
    expect(f).toMatchObject({ kind: Kind.data, flags: Flag.fanout | Flag.half, opcode: 5, variant: 17, seq: 123456, src: 7, step: 3, chunk: 99, length: 1_000_001, offset: 5000, value: 2.5, wireBytes: 48 })
    expect(readFrame({ headers: headers(), data } as unknown as Msg)).toBeUndefined()
    expect(readFrame({ headers: undefined, data } as unknown as Msg)).toBeUndefined()
  })

  it("too large for max_payload, split in pieces that carry the frame's header and are put together again; a stray or oversized piece drops the frame", () => {
    const body = new Uint8Array(10_003).map((_, i) => (i * 7) & 0xff)
    const h = frameHeaders(Kind.data, Flag.fanout, 5, 17, 9, 2, 3, 4, 1_000_000, 800, 1.5)
    expect(splitFrame(h, body, 10_003)).toBeUndefined()
    const pieces = splitFrame(h, body, 4099)!
    // pieces of a multiple of 4 bytes (4096), Flag.more on all but the last
    expect(pieces.map((p) => p.data.length)).toEqual([4096, 4096, 1811])
    const frames = pieces.map((p) => readFrame(p as unknown as Msg)!)
    expect(frames.map((f) => [f.pieces, f.flags])).toEqual([
      [3, Flag.fanout | Flag.more],
      [3, Flag.fanout | Flag.more],
      [3, Flag.fanout]
    ])
    const released: Uint8Array[] = []
    const asm = new FrameAssembler((n) => new Uint8Array(n), (p) => void released.push(p))
    expect(asm.add(frames[0]!)).toBeUndefined()
    expect(asm.add(frames[1]!)).toBeUndefined()
    const whole = asm.add(frames[2]!) as Frame
    expect(whole).toMatchObject({ kind: Kind.data, flags: Flag.fanout, seq: 9, src: 2, step: 3, chunk: 4, length: 1_000_000, offset: 800, value: 1.5, pieces: 0, wireBytes: 40 + 10_003 })
    expect(whole.payload).toEqual(body)
    expect(released).toEqual(frames.map((f) => f.payload))
    expect([asm.open, asm.assembled]).toEqual([0, 1])
    // a last piece with no first one before it, and a piece past what the first announced: dropped
    expect(asm.add(frames[2]!)).toBeUndefined()
    asm.add(frames[0]!)
    asm.add({ ...frames[1]!, payload: new Uint8Array(4096) })
    asm.add({ ...frames[1]!, payload: new Uint8Array(4100) })
    expect(asm.open).toBe(0)
    expect(asm.add(frames[2]!)).toBeUndefined()
    // a call that ended leaves no pieces behind
    asm.add(frames[0]!)
    expect(asm.open).toBe(1)
    asm.drop(8)
    expect(asm.open).toBe(1)
    asm.drop(9)
    expect(asm.open).toBe(0)
  })

  it("carry the algorithm's code in a whole byte of the variant, next to the call's options", () => {
    const data = new Uint8Array(0)
    for (const code of [0, 3, 4, 200, 255]) {
      const v = variantOf(code, 3, true, true)
      const f = readFrame({ headers: frameHeaders(Kind.data, 0, Opcode.allReduce, v, 1, 0, 0, 0, 10, 0, 0), data } as unknown as Msg)
      expect(f?.variant).toBe(v)
      expect((f?.variant ?? 0) & 0xff).toBe(code)
      expect(((f?.variant ?? 0) & Variant.reduceMask) >> Variant.reduceShift).toBe(3)
    }
    // distinct codes, options alike: distinct variants (so ranks running different algorithms disagree)
    expect(new Set([0, 1, 2, 3, 4, 255].map((c) => variantOf(c, 0, false))).size).toBe(6)
    expect(describeOp(Opcode.allReduce, variantOf(0, 0, false))).toBe("allReduce(ring, sum, f32)")
    expect(describeOp(Opcode.allReduce, variantOf(1, 1, true, true))).toBe("allReduce(tree, no fan-out, mean, f16)")
    expect(describeOp(Opcode.allReduce, variantOf(254, 3, false))).toBe("allReduce(algorithm #254, weightedMean, f32)")
    expect(describeOp(Opcode.broadcast, variantOf(1, 0, true))).toBe("broadcast(tree, f16)")
    expect(describeOp(Opcode.allGather, variantOf(0, 0, false))).toBe("allGather(fanout, f32)")
  })
})
