// Unit and property tests of message chunking (core/chunking.ts): split/reassemble round trips,
// interleaved senders, every loss/duplication/foreign-frame case as a typed ChunkError, expiry.
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { ChunkError, ConfigError } from "../core/errors.ts"
import { Reassembler, chunkHeaderBytes, encodeFrames, splitMessage } from "../core/chunking.ts"
import { type WireTensor, decodeMessage, encodeMessage, wireTensor } from "../core/wire.ts"
import { feed, payloadOf } from "./support/chunk-frames.ts"

const chunkError = (f: () => unknown, match?: RegExp): ChunkError => {
  let caught: unknown
  try {
    f()
  } catch (e) {
    caught = e
  }
  expect(caught, "expected a ChunkError").toBeInstanceOf(ChunkError)
  expect((caught as ChunkError)._tag).toBe("ChunkError")
  if (match) expect((caught as ChunkError).message).toMatch(match)
  return caught as ChunkError
}

describe("splitMessage / Reassembler round trips", () => {
  it("random sizes and max payloads: frames fit, reassembly is exact", () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 5000 }),
        fc.integer({ min: 0, max: 3000 }),
        fc.option(fc.oneof(fc.string({ minLength: 1, maxLength: 12 }), fc.nat())),
        (size, extra, id) => {
          const header = chunkHeaderBytes(32) // room for any generated id
          const maxPayload = header + 1 + extra
          const payload = payloadOf(size, size + extra)
          const frames = splitMessage(payload, maxPayload, id ?? undefined)
          for (const f of frames) expect(f.byteLength).toBeLessThanOrEqual(maxPayload)
          const r = new Reassembler()
          const out = feed(r, frames)
          expect(out).toBeDefined()
          expect(Buffer.compare(out!, payload)).toBe(0)
          expect(r.pending).toBe(0)
          expect(r.pendingBytes).toBe(0)
        }
      ),
      { numRuns: 300 }
    )
  })

  it("a payload that fits is one frame; exactly maxPayload needs two; 0 bytes is one empty frame", () => {
    const max = 1000
    const h = chunkHeaderBytes(0)
    expect(splitMessage(payloadOf(max - h), max)).toHaveLength(1)
    const exact = splitMessage(payloadOf(max), max)
    expect(exact).toHaveLength(2)
    for (const f of exact) expect(f.byteLength).toBeLessThanOrEqual(max)
    expect(Buffer.compare(feed(new Reassembler(), exact)!, payloadOf(max))).toBe(0)
    const empty = splitMessage(new Uint8Array(0), max)
    expect(empty).toHaveLength(1)
    expect(new Reassembler().push(empty[0])!.byteLength).toBe(0)
    const emptyWithId = splitMessage(new Uint8Array(0), max, "m-0")
    expect(new Reassembler().push(emptyWithId[0])!.byteLength).toBe(0)
  })

  it("single frames come back as views (no copy); multi-frame payloads land 8-aligned", () => {
    const single = splitMessage(payloadOf(100), 1024)[0]
    const out = new Reassembler().push(single)!
    expect(out.buffer).toBe(single.buffer)
    const frames = splitMessage(payloadOf(10_000), 1024, "big")
    const whole = feed(new Reassembler(), frames)!
    expect(whole.byteOffset % 8).toBe(0)
    expect(whole.byteLength).toBe(10_000)
  })

  it("reassembled messages decode with zero-copy tensor views", () => {
    const data = Float32Array.from({ length: 100_000 }, (_, i) => Math.sin(i))
    const encoded = encodeMessage({ kind: "grad", step: 7, tensors: [wireTensor("float32", [100, 1000], data)] })
    const frames = splitMessage(encoded, 64 * 1024, "w1.7")
    expect(frames.length).toBeGreaterThan(1)
    const whole = feed(new Reassembler(), frames)!
    const msg = decodeMessage(whole) as { step: number; tensors: Array<WireTensor<"float32">> }
    expect(msg.step).toBe(7)
    expect(msg.tensors[0].data.buffer).toBe(whole.buffer)
    expect(msg.tensors[0].data).toEqual(data)
  })

  it("encodeFrames writes exactly the frames of splitMessage(encodeMessage(value))", () => {
    const tensorArb = fc.tuple(fc.integer({ min: 0, max: 3000 }), fc.integer({ min: 0, max: 3 })).map(([n, k]) =>
      k === 0 ? wireTensor("float32", [n], Float32Array.from({ length: n }, (_, i) => i * 0.5 - 7)) : wireTensor("uint8", [n % 13], payloadOf(n % 13, k))
    )
    fc.assert(
      fc.property(
        fc.array(tensorArb, { maxLength: 4 }),
        fc.integer({ min: 33, max: 5000 }),
        fc.string({ maxLength: 20 }),
        (tensors, maxPayload, note) => {
          const message = { kind: "grad", note, tensors, raw: new Int32Array([1, 2, 3]) }
          const frames = encodeFrames(message, maxPayload, "m.1")
          const reference = splitMessage(encodeMessage(message), maxPayload, "m.1")
          expect(frames.map((f) => Buffer.from(f).toString("hex"))).toEqual(reference.map((f) => Buffer.from(f).toString("hex")))
          for (const f of frames) expect(f.byteLength).toBeLessThanOrEqual(maxPayload)
          const whole = feed(new Reassembler(), frames)!
          const back = decodeMessage(whole) as { note: string; tensors: Array<WireTensor> }
          expect(back.note).toBe(note)
          back.tensors.forEach((t, i) => expect(t.data).toEqual(tensors[i].data))
        }
      ),
      { numRuns: 200 }
    )
  })

  it("interleaved messages from several senders all complete", () => {
    fc.assert(
      fc.property(
        fc.array(fc.integer({ min: 0, max: 3000 }), { minLength: 1, maxLength: 6 }),
        fc.array(fc.nat(), { minLength: 200, maxLength: 200 }),
        (sizes, picks) => {
          const max = 256
          const messages = sizes.map((n, i) => ({ id: `sender${i}.1`, payload: payloadOf(n, i + 1) }))
          const queues = messages.map((m) => splitMessage(m.payload, max, m.id))
          const r = new Reassembler()
          const done = new Map<number, Uint8Array>()
          let k = 0
          while (queues.some((q) => q.length > 0)) {
            const live = queues.map((q, i) => (q.length > 0 ? i : -1)).filter((i) => i >= 0)
            const which = live[picks[k++ % picks.length] % live.length]
            const out = r.push(queues[which].shift()!)
            if (out) done.set(which, out)
          }
          expect(done.size).toBe(messages.length)
          messages.forEach((m, i) => expect(Buffer.compare(done.get(i)!, m.payload)).toBe(0))
          expect(r.pending).toBe(0)
        }
      ),
      { numRuns: 150 }
    )
  })

  it("generates distinct ids when none is given", () => {
    const a = splitMessage(payloadOf(3000), 512)
    const b = splitMessage(payloadOf(3000, 9), 512)
    const r = new Reassembler()
    // interleave two id-less messages: they must not collide
    let outA: Uint8Array | undefined
    let outB: Uint8Array | undefined
    for (let i = 0; i < Math.max(a.length, b.length); i++) {
      if (i < a.length) outA = r.push(a[i]) ?? outA
      if (i < b.length) outB = r.push(b[i]) ?? outB
    }
    expect(Buffer.compare(outA!, payloadOf(3000))).toBe(0)
    expect(Buffer.compare(outB!, payloadOf(3000, 9))).toBe(0)
  })
})

describe("chunk errors are ChunkError and leave the reassembler usable", () => {
  const frames = (id: string, n = 5000, max = 1032): Array<Uint8Array> => splitMessage(payloadOf(n), max, id)

  it("rejects foreign and malformed frames", () => {
    const r = new Reassembler()
    chunkError(() => r.push(new Uint8Array(0)), /not a gradwire chunk frame/)
    chunkError(() => r.push(payloadOf(100)), /not a gradwire chunk frame/)
    chunkError(() => r.push(encodeMessage({ kind: "grad" })), /not a gradwire chunk frame/)
    chunkError(() => r.push("frame" as never), /Uint8Array/)
    const f = Uint8Array.prototype.slice.call(frames("m")[0])
    f[3] = 9
    chunkError(() => r.push(f), /version 9/)
    const badHeader = Uint8Array.prototype.slice.call(frames("m")[0])
    badHeader[14] = 8 // header length that does not match the id length
    chunkError(() => r.push(badHeader), /malformed chunk header/)
    const badIndex = Uint8Array.prototype.slice.call(frames("m")[0])
    new DataView(badIndex.buffer).setUint32(4, 99, true) // index >= count
    chunkError(() => r.push(badIndex), /chunk 99 of/)
    const zeroCount = Uint8Array.prototype.slice.call(frames("m")[0])
    new DataView(zeroCount.buffer).setUint32(8, 0, true)
    chunkError(() => r.push(zeroCount), /malformed/)
    const single = Uint8Array.prototype.slice.call(splitMessage(payloadOf(10), 1024)[0])
    single[single.length - 1] = 0
    chunkError(() => r.push(single.subarray(0, single.length - 1)), /carries 9 bytes of a 10-byte message/)
    expect(r.pending).toBe(0)
  })

  it("duplicated chunk: error, state dropped, the rest of that message ignored, others unaffected", () => {
    const r = new Reassembler()
    const a = frames("a")
    const b = frames("b")
    expect(r.push(a[0])).toBeUndefined()
    expect(r.push(b[0])).toBeUndefined()
    expect(r.push(a[1])).toBeUndefined()
    const e = chunkError(() => r.push(a[1]), /duplicated chunk 1/)
    expect(e.messageId).toBe("a")
    expect(r.pending).toBe(1)
    for (const f of a.slice(2)) expect(r.push(f)).toBeUndefined() // leftovers of the failed message
    expect(Buffer.compare(feed(r, b.slice(1))!, payloadOf(5000))).toBe(0)
    expect(r.pending).toBe(0)
    // the same id can be used again for a fresh message
    expect(Buffer.compare(feed(r, a)!, payloadOf(5000))).toBe(0)
  })

  it("missing (lost) chunk and out-of-order chunk", () => {
    const r = new Reassembler()
    const a = frames("a")
    r.push(a[0])
    chunkError(() => r.push(a[2]), /missing chunk 1 of 5: chunk 2 arrived next/)
    expect(r.pending).toBe(0)
    const b = frames("b")
    r.push(b[0])
    r.push(b[1])
    chunkError(() => r.push(b[4]), /missing chunk 2-3 of 5/)
    const c = frames("c")
    chunkError(() => r.push(c[2]), /missing chunk 0-1 of 5: the first chunk seen is 2/)
    expect(r.push(c[3])).toBeUndefined() // reported once, then ignored
    const d = frames("d")
    r.push(d[0])
    r.push(d[2 - 1])
    chunkError(() => r.push(d[0]), /duplicated chunk 0/) // went backwards
    expect(r.pending).toBe(0)
  })

  it("a chunk whose count or total disagrees with earlier ones", () => {
    const r = new Reassembler()
    const a = frames("x", 5000)
    const other = frames("x", 6000)
    r.push(a[0])
    chunkError(() => r.push(other[1]), /earlier chunks said 5 \/ 5000/)
    const b = frames("y")
    r.push(b[0])
    chunkError(() => r.push(splitMessage(payloadOf(10), 1024, "y")[0]), /single-frame message arrived/)
    expect(r.pending).toBe(0)
  })

  it("a chunk with the wrong number of bytes, and impossible count/total headers", () => {
    const r = new Reassembler()
    const a = frames("a")
    r.push(a[0])
    chunkError(() => r.push(a[1].subarray(0, a[1].length - 1)), /carries \d+ bytes, expected \d+/)
    const lie = Uint8Array.prototype.slice.call(frames("b")[0])
    new DataView(lie.buffer).setUint32(16, 100, true) // 5 chunks cannot make 100 bytes
    chunkError(() => r.push(lie), /cannot make a 100-byte message/)
    expect(r.pending).toBe(0)
  })

  it("refuses a total above maxMessageBytes before allocating, and caps pending bytes", () => {
    const r = new Reassembler({ maxMessageBytes: 4096, maxPendingBytes: 8192 })
    chunkError(() => r.push(frames("big", 5000)[0]), /above the limit of 4096 bytes/)
    const huge = Uint8Array.prototype.slice.call(frames("bogus")[0])
    new DataView(huge.buffer).setUint32(20, 0x1fffff, true) // ~2^53 bytes announced
    chunkError(() => r.push(huge), /above the limit/)
    expect(r.pendingBytes).toBe(0)
    r.push(frames("p1", 4000)[0])
    r.push(frames("p2", 4000)[0])
    chunkError(() => r.push(frames("p3", 4000)[0]), /maxPendingBytes/)
    expect(r.pending).toBe(2)
    expect(r.pendingBytes).toBe(8000)
    // default limit: a bogus 2^40-byte header is refused without allocating
    const d = Uint8Array.prototype.slice.call(frames("bogus2")[0])
    new DataView(d.buffer).setUint32(20, 0x100, true)
    chunkError(() => new Reassembler().push(d), /above the limit of 2147483648/)
  })

  it("a late repeat of a delivered message's chunk is a duplicate", () => {
    const r = new Reassembler()
    const a = frames("a")
    feed(r, a)
    chunkError(() => r.push(a[3]), /duplicated chunk 3 of 5 of a message already delivered/)
  })

  it("splitMessage rejects a maxPayload that cannot hold a header and data", () => {
    chunkError(() => splitMessage(payloadOf(100), 24, "id"), /cannot hold/)
    chunkError(() => splitMessage(payloadOf(100), 0), /positive integer/)
    chunkError(() => splitMessage(payloadOf(100), 1.5), /positive integer/)
    chunkError(() => splitMessage(payloadOf(10), 100, "x".repeat(2000)), /above the limit/)
    expect(() => new Reassembler({ timeoutMs: -1 })).toThrow(ConfigError)
  })

  it("fuzz: random and bit-flipped frames only ever raise ChunkError (bounded)", () => {
    const good = [...frames("f", 3000, 512), ...splitMessage(payloadOf(50), 512)]
    fc.assert(
      fc.property(
        fc.oneof(
          fc.uint8Array({ maxLength: 120 }),
          fc.tuple(fc.nat({ max: good.length - 1 }), fc.array(fc.tuple(fc.nat(), fc.integer({ min: 0, max: 7 })), { minLength: 1, maxLength: 3 })).map(([i, flips]) => {
            const f = Uint8Array.prototype.slice.call(good[i])
            for (const [at, bit] of flips) f[at % Math.min(f.length, 40)] ^= 1 << bit // flip header bits mostly
            return f
          })
        ),
        (frame) => {
          const r = new Reassembler({ maxMessageBytes: 1 << 20 })
          try {
            r.push(frame)
          } catch (e) {
            if (!(e instanceof ChunkError)) throw e
          }
        }
      ),
      { numRuns: 3000 }
    )
  })
})

describe("expiry", () => {
  it("drops an incomplete message after timeoutMs of silence and reports a missing chunk", () => {
    let now = 1_000
    const r = new Reassembler({ timeoutMs: 500, now: () => now })
    const a = splitMessage(payloadOf(5000), 1032, "slow")
    r.push(a[0])
    now = 1_400
    r.push(a[1]) // activity pushes the deadline to 1900
    expect(r.expire(1_800)).toEqual([])
    expect(r.pending).toBe(1)
    const errors = r.expire(1_900)
    expect(errors).toHaveLength(1)
    expect(errors[0]).toBeInstanceOf(ChunkError)
    expect(errors[0]._tag).toBe("ChunkError")
    expect(errors[0].messageId).toBe("slow")
    expect(errors[0].message).toMatch(/missing chunk 2 of 5: nothing arrived for 500 ms/)
    expect(r.pending).toBe(0)
    expect(r.pendingBytes).toBe(0)
    now = 1_950
    expect(r.push(a[2])).toBeUndefined() // a straggler of the dropped message is ignored
    expect(r.expire(3_000)).toEqual([])
  })

  it("keeps other messages and expires only the stale ones", () => {
    let now = 0
    const r = new Reassembler({ timeoutMs: 100, now: () => now })
    const a = splitMessage(payloadOf(3000), 1024, "a")
    const b = splitMessage(payloadOf(3000), 1024, "b")
    r.push(a[0])
    now = 80
    r.push(b[0])
    now = 150
    const errors = r.expire()
    expect(errors.map((e) => e.messageId)).toEqual(["a"])
    expect(r.pending).toBe(1)
    expect(Buffer.compare(feed(r, b.slice(1))!, payloadOf(3000))).toBe(0)
  })
})
