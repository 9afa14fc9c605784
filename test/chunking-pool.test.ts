// Tests of buffer reuse in chunking (core/chunking.ts): BufferPool lending and give-back rules,
// encodeFrames / splitMessage into pooled buffers, and the Reassembler's pooled payloads with
// release(): reuse happens, held payloads never share memory, stale or double releases are refused,
// and failed or expired messages give their buffers back by themselves.
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { BufferPool, type FramePool, Reassembler, encodeFrames, splitMessage } from "../core/chunking.ts"
import { ChunkError, ConfigError } from "../core/errors.ts"
import { type WireTensor, decodeMessage, encodeMessage, wireTensor } from "../core/wire.ts"
import { openNats } from "../core/connection.ts"
import { withServer } from "./support/nats.ts"
import { feed, payloadOf } from "./support/chunk-frames.ts"

const same = (a: Uint8Array, b: Uint8Array): boolean => Buffer.compare(a, b) === 0

/** Frames as a NATS receiver gets them: each in a buffer of its own, not views of the sender's. */
const copies = (frames: ReadonlyArray<Uint8Array>): Array<Uint8Array> => frames.map((f) => Uint8Array.prototype.slice.call(f))

describe("BufferPool", () => {
  it("lends exact-size buffers at offset 0 and reuses given-back ones", () => {
    const pool = new BufferPool()
    const a = pool.take(1000)
    expect(a.length).toBe(1000)
    expect(a.byteOffset).toBe(0)
    expect(pool.owns(a)).toBe(true)
    const ab = a.buffer
    pool.give(a)
    expect(pool.owns(a)).toBe(false)
    expect(pool.idle).toBe(1)
    expect(pool.idleBytes).toBe(1000)
    const b = pool.take(900) // fits, and not more than twice the size
    expect(b.buffer).toBe(ab)
    expect(b.length).toBe(900)
    expect(pool.idle).toBe(0)
    const c = pool.take(300) // nothing idle: a new buffer
    expect(c.buffer).not.toBe(ab)
  })

  it("never lends a buffer twice before it is given back", () => {
    fc.assert(
      fc.property(fc.array(fc.tuple(fc.boolean(), fc.integer({ min: 0, max: 5000 })), { maxLength: 60 }), (ops) => {
        const pool = new BufferPool({ maxIdleBuffers: 4 })
        const held: Array<Uint8Array> = []
        for (const [take, n] of ops) {
          if (take || held.length === 0) {
            const b = pool.take(n)
            expect(b.length).toBe(n)
            for (const h of held) expect(h.buffer).not.toBe(b.buffer)
            held.push(b)
          } else {
            pool.give(held.splice(n % held.length, 1)[0])
          }
          expect(pool.idle).toBeLessThanOrEqual(4)
        }
      })
    )
  })

  it("does not hand a big idle buffer to a request less than half its size", () => {
    const pool = new BufferPool()
    const big = pool.take(10_000)
    pool.give(big)
    expect(pool.take(4000).buffer).not.toBe(big.buffer)
    expect(pool.take(5000).buffer).toBe(big.buffer)
  })

  it("refuses a double give-back and a buffer it never lent", () => {
    const pool = new BufferPool()
    const a = pool.take(64)
    pool.give(a.subarray(8, 16)) // any view of the lent buffer gives it back
    expect(() => pool.give(a)).toThrow(ChunkError)
    expect(() => pool.give(new Uint8Array(64))).toThrow(/not lent out by this pool/)
    expect(() => new BufferPool().give(pool.take(8))).toThrow(ChunkError)
    expect(() => pool.take(-1)).toThrow(ChunkError)
    expect(() => new BufferPool({ maxIdleBytes: 0 })).toThrow(ConfigError)
  })

  it("keeps at most maxIdleBuffers / maxIdleBytes idle", () => {
    const pool = new BufferPool({ maxIdleBuffers: 2, maxIdleBytes: 2500 })
    const bs = [pool.take(1000), pool.take(1000), pool.take(1000)]
    for (const b of bs) pool.give(b)
    expect(pool.idle).toBe(2)
    expect(pool.idleBytes).toBe(2000)
    const big = pool.take(3000)
    pool.give(big) // above maxIdleBytes: dropped
    expect(pool.idle).toBe(2)
  })

  it("when full, keeps the buffers given back last: a larger size in use now replaces the longest idle ones", () => {
    const pool = new BufferPool({ maxIdleBuffers: 8, maxIdleBytes: 4000 })
    const small = Array.from({ length: 4 }, () => pool.take(1000))
    for (const b of small) pool.give(b)
    expect(pool.idleBytes).toBe(4000)
    // a call with larger frames: its buffers come back, and are there for its next frames
    const large = pool.take(2000)
    pool.give(large)
    expect([pool.idle, pool.idleBytes]).toEqual([3, 4000])
    expect(pool.take(2000).buffer).toBe(large.buffer)
    // the small buffers kept are the ones given back last
    expect(pool.take(1000).buffer).toBe(small[2]!.buffer)
    expect(pool.take(1000).buffer).toBe(small[3]!.buffer)
    expect(pool.stats.reused).toBe(3)
  })
})

describe("encodeFrames / splitMessage into a pool", () => {
  const tensorOf = (n: number): WireTensor<"float32"> =>
    wireTensor("float32", [n], Float32Array.from({ length: n }, (_, i) => Math.sin(i) * 100 + i))

  it("writes the same frames as without a pool, all views of one pooled buffer, reused after give", () => {
    const pool = new BufferPool()
    const message = { grad: tensorOf(5000), step: 3 }
    for (const max of [1 << 20, 4096, 1000]) {
      const plain = encodeFrames(message, max, "m.1")
      const pooled = encodeFrames(message, max, "m.1", { pool })
      expect(pooled.length).toBe(plain.length)
      pooled.forEach((f, i) => expect(same(f, plain[i])).toBe(true))
      for (const f of pooled) expect(f.buffer).toBe(pooled[0].buffer)
      expect(pool.owns(pooled[0])).toBe(true)
      const ab = pooled[0].buffer
      pool.give(pooled[0])
      const again = encodeFrames(message, max, "m.1", { pool })
      expect(again[0].buffer).toBe(ab)
      pool.give(again[0])
    }
  })

  it("splitMessage with a pool round-trips and leaves no stale bytes in reused buffers", () => {
    const pool = new BufferPool()
    // First fill a buffer with 0xff, then reuse it for a shorter message with padding.
    const dirty = pool.take(12_000)
    dirty.fill(0xff)
    pool.give(dirty)
    const payload = encodeMessage({ a: wireTensor("uint8", [3], Uint8Array.of(1, 2, 3)), b: tensorOf(2000) })
    const frames = splitMessage(payload, 2048, "s", { pool })
    expect(frames[0].buffer).toBe(dirty.buffer)
    const reference = splitMessage(payload, 2048, "s")
    frames.forEach((f, i) => expect(same(f, reference[i])).toBe(true))
    const pooledFrames = encodeFrames({ a: wireTensor("uint8", [3], Uint8Array.of(1, 2, 3)), b: tensorOf(2000) }, 2048, "s", { pool: new BufferPool() })
    pooledFrames.forEach((f, i) => expect(same(f, reference[i])).toBe(true))
    expect(same(feed(new Reassembler(), frames)!, payload)).toBe(true)
  })

  it("a pool returning the wrong size is a ChunkError; a failed encode takes nothing", () => {
    const short: FramePool = { take: (n) => new Uint8Array(n - 1), give: () => {} }
    expect(() => encodeFrames({ x: 1 }, 1024, undefined, { pool: short })).toThrow(ChunkError)
    let taken = 0
    const counting: FramePool = { take: (n) => (taken++, new Uint8Array(n)), give: () => {} }
    expect(() => splitMessage(payloadOf(100), 24, "id", { pool: counting })).toThrow(/cannot hold/)
    expect(() => encodeFrames({ s: Symbol("not encodable") }, 1024, undefined, { pool: counting })).toThrow()
    expect(taken).toBe(0)
  })
})

describe("Reassembler with a pool", () => {
  it("takes payload buffers from the pool and gets them back on release", () => {
    const pool = new BufferPool()
    const r = new Reassembler({ pool })
    const a = feed(r, copies(splitMessage(payloadOf(10_000, 1), 1024, "a")))!
    expect(same(a, payloadOf(10_000, 1))).toBe(true)
    expect(a.byteOffset).toBe(0)
    expect(pool.owns(a)).toBe(true)
    const ab = a.buffer
    expect(r.release(a)).toBe(true)
    expect(pool.owns(a)).toBe(false)
    expect(r.release(a)).toBe(false) // released twice: refused, nothing freed
    const b = feed(r, copies(splitMessage(payloadOf(9_000, 2), 1024, "b")))!
    expect(b.buffer).toBe(ab) // reused
    expect(same(b, payloadOf(9_000, 2))).toBe(true)
    expect(r.release(a)).toBe(false) // a stale view of a buffer lent out again: refused
    expect(pool.owns(b)).toBe(true)
    expect(same(b, payloadOf(9_000, 2))).toBe(true)
    expect(r.release(b)).toBe(true)
  })

  it("payloads held at the same time never share memory and stay intact until released", () => {
    fc.assert(
      fc.property(
        fc.array(fc.record({ size: fc.integer({ min: 0, max: 6000 }), hold: fc.boolean() }), { minLength: 1, maxLength: 25 }),
        fc.integer({ min: 200, max: 3000 }),
        (messages, max) => {
          const pool = new BufferPool({ maxIdleBuffers: 3 })
          const r = new Reassembler({ pool })
          const held: Array<{ payload: Uint8Array; seed: number; size: number }> = []
          messages.forEach(({ size, hold }, i) => {
            const seed = i + 1
            const payload = feed(r, copies(splitMessage(payloadOf(size, seed), max, `m${i}`)))!
            expect(same(payload, payloadOf(size, seed))).toBe(true)
            for (const h of held) {
              if (h.payload.byteOffset === 0 && h.payload.length > 0 && payload.length > 0) expect(h.payload.buffer).not.toBe(payload.buffer)
            }
            if (hold) held.push({ payload, seed, size })
            else r.release(payload) // false for single-frame payloads, which are views of the frame
          })
          for (const h of held) {
            expect(same(h.payload, payloadOf(h.size, h.seed))).toBe(true)
            r.release(h.payload)
          }
        }
      ),
      { numRuns: 60 }
    )
  })

  it("a decoded tensor views the pooled payload; a single-frame payload is not pooled", () => {
    const pool = new BufferPool()
    const r = new Reassembler({ pool })
    const t = wireTensor("float32", [3000], Float32Array.from({ length: 3000 }, (_, i) => i * 0.5))
    const whole = feed(r, copies(encodeFrames({ g: t }, 4096, "t")))!
    const got = (decodeMessage(whole) as { g: WireTensor<"float32"> }).g
    expect(got.data.buffer).toBe(whole.buffer)
    expect(Array.from(got.data.subarray(0, 3))).toEqual([0, 0.5, 1])
    expect(r.release(whole)).toBe(true)
    const single = r.push(copies(splitMessage(payloadOf(100), 1024))[0])!
    expect(pool.owns(single)).toBe(false)
    expect(r.release(single)).toBe(false)
    expect(new Reassembler().release(single)).toBe(false)
  })

  it("gives back the buffers of failed and expired messages by itself", () => {
    let now = 0
    const pool = new BufferPool()
    const r = new Reassembler({ pool, timeoutMs: 100, now: () => now })
    const a = copies(splitMessage(payloadOf(5000), 1024, "a"))
    r.push(a[0])
    expect(pool.idle).toBe(0)
    expect(() => r.push(a[2])).toThrow(/missing chunk 1/)
    expect(pool.idle).toBe(1)
    expect(r.pendingBytes).toBe(0)
    const b = copies(splitMessage(payloadOf(5000, 3), 1024, "b"))
    r.push(b[0])
    expect(pool.idle).toBe(0) // took the given-back buffer
    now = 1000
    expect(r.expire()).toHaveLength(1)
    expect(pool.idle).toBe(1)
    // And the pool's buffer serves the next message correctly.
    const c = feed(r, copies(splitMessage(payloadOf(4800, 4), 1024, "c")))!
    expect(same(c, payloadOf(4800, 4))).toBe(true)
    expect(r.release(c)).toBe(true)
  })
})

describe("pooled buffers through NATS", () => {
  it("frames given back right after flush() arrive intact, though the sender scribbles over them at once", async () => {
    await withServer({ jetstream: false, maxPayload: 256 * 1024 }, async (server) => {
      const pub = await openNats({ servers: server.url, name: "pool-pub" })
      const sub = await openNats({ servers: server.url, name: "pool-sub" })
      try {
        const sendPool = new BufferPool()
        const r = new Reassembler({ pool: new BufferPool() })
        const n = 300_000 // 1.2 MB: 5 frames
        const messages = 6
        const received: Array<string> = []
        let reused = 0
        const done = new Promise<void>((resolve, reject) => {
          sub.nc.subscribe("gw.test.pool", {
            callback: (err, msg) => {
              if (err) return reject(err)
              try {
                const whole = r.push(msg.data)
                if (whole === undefined) return
                const { i, g } = decodeMessage(whole) as { i: number; g: WireTensor<"float32"> }
                let ok = g.data.length === n
                for (let k = 0; ok && k < n; k += 997) ok = g.data[k] === i * 1e6 + k
                received.push(`${i}:${ok}`)
                if (!r.release(whole)) throw new Error("payload did not come from the pool")
                if (received.length === messages) resolve()
              } catch (e) {
                reject(e)
              }
            }
          })
        })
        await sub.nc.flush()
        let last: ArrayBuffer | undefined
        for (let i = 0; i < messages; i++) {
          const t = wireTensor("float32", [n], Float32Array.from({ length: n }, (_, k) => i * 1e6 + k))
          const frames = encodeFrames({ i, g: t }, pub.maxPayload, `p${i}`, { pool: sendPool })
          if (frames[0].buffer === last) reused++
          last = frames[0].buffer as ArrayBuffer
          for (const f of frames) pub.nc.publish("gw.test.pool", f)
          await pub.nc.flush()
          new Uint8Array(frames[0].buffer).fill(0xaa) // nats.js must hold no reference any more
          sendPool.give(frames[0])
        }
        await done
        expect(received).toEqual(Array.from({ length: messages }, (_, i) => `${i}:true`))
        expect(reused).toBe(messages - 1)
      } finally {
        await Promise.all([pub.close(), sub.close()])
      }
    })
  })
})
