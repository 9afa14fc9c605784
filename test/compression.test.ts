// Codec round trips and decode-error bounds for the element-wise compressors (pure logic).
import fc from "fast-check"
import { describe, expect, it } from "vitest"
import { WireDecodeError } from "../core/errors.ts"
import {
  Fp16Compressor,
  Int8Compressor,
  NoneCompressor,
  SignCompressor,
  TopKCompressor,
  codecOf,
  decodeFp16,
  encodeFp16,
  fp16BitsToFp32,
  fp32ToFp16Bits,
  topkCount,
  type Compressor
} from "../collectives/compression/index.ts"
import { fp16Table } from "../collectives/compression/fp16.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"
import { kthLargestMagnitude } from "../collectives/compression/nth-element.ts"

const randn = (n: number, seed: number, scale = 1): Float32Array => {
  const rng = new Mulberry32(seed)
  return Float32Array.from({ length: n }, () => rng.normal() * scale)
}

const f32 = fc.float({ noDefaultInfinity: false, noNaN: false })
const f32Array = (maxLength: number) => fc.float32Array({ maxLength, noNaN: true, noDefaultInfinity: true, size: "medium" })

/** Reference fp32 -> fp16: nearest finite half by binary search over the value table, ties to even. */
const refHalf = (x: number): number => {
  if (Number.isNaN(x)) return 0x7e00
  const sign = x < 0 || Object.is(x, -0) ? 0x8000 : 0
  const a = Math.abs(x)
  if (a >= 65520) return sign | 0x7c00
  const t = fp16Table()
  let lo = 0
  let hi = 0x7bff
  while (lo < hi) {
    const mid = (lo + hi + 1) >>> 1
    if (t[mid] <= a) lo = mid
    else hi = mid - 1
  }
  if (lo === 0x7bff) return sign | lo
  const dLo = a - t[lo]
  const dHi = t[lo + 1] - a
  const h = dLo < dHi ? lo : dHi < dLo ? lo + 1 : lo % 2 === 0 ? lo : lo + 1
  return sign | h
}

describe("fp16", () => {
  it("every half value survives decode -> encode bit for bit (NaN stays NaN)", () => {
    const t = fp16Table()
    const back = new Uint16Array(65536)
    encodeFp16(t, back)
    for (let h = 0; h < 65536; h++) {
      if (Number.isNaN(t[h])) expect(Number.isNaN(fp16BitsToFp32(back[h]))).toBe(true)
      else if (back[h] !== h) expect.fail(`half 0x${h.toString(16)} came back as 0x${back[h].toString(16)}`)
    }
  })

  it("rounds to nearest even, like the reference, for arbitrary fp32 (subnormals, overflow, Inf, NaN)", () => {
    fc.assert(
      fc.property(f32, (x) => {
        const got = fp32ToFp16Bits(x)
        if (Number.isNaN(x)) return Number.isNaN(fp16BitsToFp32(got))
        return got === refHalf(x)
      }),
      { numRuns: 20000 }
    )
  })

  it("handles the edges: overflow to Inf, the largest half, subnormal ties, signed zero", () => {
    expect(fp32ToFp16Bits(65504)).toBe(0x7bff)
    expect(fp32ToFp16Bits(65519.99)).toBe(0x7bff)
    expect(fp32ToFp16Bits(65520)).toBe(0x7c00)
    expect(fp32ToFp16Bits(1e9)).toBe(0x7c00)
    expect(fp32ToFp16Bits(-1e9)).toBe(0xfc00)
    expect(fp32ToFp16Bits(Infinity)).toBe(0x7c00)
    expect(fp32ToFp16Bits(-Infinity)).toBe(0xfc00)
    expect(fp32ToFp16Bits(2 ** -24)).toBe(1)
    expect(fp32ToFp16Bits(2 ** -25)).toBe(0) // tie -> even (0)
    expect(fp32ToFp16Bits(3 * 2 ** -25)).toBe(2) // tie between 1 and 2 -> even (2)
    expect(fp32ToFp16Bits(2 ** -14)).toBe(0x0400) // smallest normal
    expect(fp32ToFp16Bits(-0)).toBe(0x8000)
    expect(fp32ToFp16Bits(1 + 2 ** -11)).toBe(0x3c00) // tie -> even mantissa
    expect(fp32ToFp16Bits(1 + 3 * 2 ** -11)).toBe(0x3c02)
  })

  it("relative error <= 2^-11 in the normal range", () => {
    fc.assert(
      fc.property(fc.float({ min: 2 ** -14, max: 65504, noNaN: true }), fc.boolean(), (a, neg) => {
        const x = neg ? -a : a
        const back = fp16BitsToFp32(fp32ToFp16Bits(x))
        return Math.abs(back - x) <= 2 ** -11 * Math.abs(x)
      }),
      { numRuns: 5000 }
    )
  })

  it("bulk encode/decode agree with the scalar functions", () => {
    const x = randn(10_000, 1, 100)
    const h = new Uint16Array(x.length)
    encodeFp16(x, h)
    const back = new Float32Array(x.length)
    decodeFp16(h, back)
    for (let i = 0; i < x.length; i += 97) {
      expect(h[i]).toBe(fp32ToFp16Bits(x[i]))
      expect(back[i]).toBe(fp16BitsToFp32(h[i]))
    }
  })
})

describe("int8 (stochastic, scale per chunk)", () => {
  it("error <= scale/127 per element, scale = the chunk's max |x|", () => {
    const c = new Int8Compressor({ chunkSize: 256 })
    fc.assert(
      fc.property(f32Array(2000), fc.nat(), (x, step) => {
        const d = c.decode(c.encode(x, { step }))
        for (let lo = 0; lo < x.length; lo += 256) {
          let scale = 0
          for (let i = lo; i < Math.min(x.length, lo + 256); i++) scale = Math.max(scale, Math.abs(x[i]))
          for (let i = lo; i < Math.min(x.length, lo + 256); i++) {
            if (!(Math.abs(d[i] - x[i]) <= (scale / 127) * (1 + 1e-6))) return false
          }
        }
        return true
      }),
      { numRuns: 200 }
    )
  })

  it("is unbiased: the mean of many decodes converges to the input", () => {
    const c = new Int8Compressor({ chunkSize: 64 })
    const x = randn(128, 7)
    const trials = 4000
    const mean = new Float64Array(x.length)
    const d = new Float32Array(x.length)
    for (let s = 0; s < trials; s++) {
      c.decode(c.encode(x, { step: s, rank: 3, key: "w" }), d)
      for (let i = 0; i < x.length; i++) mean[i] += d[i] / trials
    }
    for (let lo = 0; lo < x.length; lo += 64) {
      let scale = 0
      for (let i = lo; i < lo + 64; i++) scale = Math.max(scale, Math.abs(x[i]))
      // per-element std of one decode <= (scale/127)/2; 6 standard errors of the mean
      const tol = (6 * (scale / 127)) / 2 / Math.sqrt(trials)
      for (let i = lo; i < lo + 64; i++) expect(Math.abs(mean[i] - x[i])).toBeLessThan(tol)
    }
  })

  it("is deterministic per (seed, rank, step, key) and differs across ranks", () => {
    const x = randn(5000, 2)
    const c = new Int8Compressor()
    const a = c.encode(x, { step: 5, rank: 0, key: "k" }).bytes
    const b = new Int8Compressor().encode(x, { step: 5, rank: 0, key: "k" }).bytes
    const r1 = c.encode(x, { step: 5, rank: 1, key: "k" }).bytes
    expect(Buffer.from(a).equals(Buffer.from(b))).toBe(true)
    expect(Buffer.from(a).equals(Buffer.from(r1))).toBe(false)
  })

  it("a chunk with NaN or Inf decodes to NaN; other chunks are unaffected; zeros stay zero", () => {
    const c = new Int8Compressor({ chunkSize: 4 })
    const x = new Float32Array([1, NaN, 2, 3, 0, 0, 0, 0, 0.5, -0.25, 0.125, Infinity, 4, -4, 2])
    const d = c.decode(c.encode(x))
    expect([...d.subarray(0, 4)].every(Number.isNaN)).toBe(true)
    expect([...d.subarray(4, 8)]).toEqual([0, 0, 0, 0])
    expect([...d.subarray(8, 12)].every(Number.isNaN)).toBe(true)
    expect(d[12]).toBe(4)
    expect(d[13]).toBe(-4)
  })

  // The SIMD kernels (collectives/simd.ts) take over when the residual lives in a space; their
  // bytes and bits must be the scalar loops', or ranks on different paths would disagree.
  const bits = (a: Float32Array): Buffer => Buffer.from(a.buffer, a.byteOffset, a.byteLength)
  /**
   * Bit for bit, but any NaN equals any NaN: V8's JIT tiers give the scalar loops' NaNs different
   * signs from run to run (-1·NaN may become a sign flip), so NaN bits are not the scalar path's to promise.
   */
  const sameFloats = (a: Float32Array, b: Float32Array): boolean =>
    a.length === b.length && (bits(a).equals(bits(b)) || a.every((v, i) => (Number.isNaN(v) ? Number.isNaN(b[i]) : Object.is(v, b[i]))))

  it("encodeFeedback: the message and residual of compensate, encode, accumulate(msg, e, -1), with the residual in a SIMD space or not", async () => {
    const { simdSpace } = await import("../collectives/simd.ts")
    // chunk sizes: the default, one not a multiple of 8 (odd pairs and single tails), one that
    // does not divide a kernel block, one of 1; lengths not multiples of the chunk
    const cases: Array<[number, number]> = [
      [4096, 300_001],
      [100, 70_003],
      [3000, 200_000],
      [7, 1001],
      [1, 513]
    ]
    for (const [chunkSize, n] of cases) {
      const g = randn(n, chunkSize, 2)
      // a chunk of zeros, a NaN, an infinity and a subnormal, where the chunk size allows
      g.fill(0, 2 * chunkSize, 3 * chunkSize)
      g[Math.min(n - 1, 5 * chunkSize + 3)] = NaN
      g[Math.min(n - 1, 7 * chunkSize + 1)] = -Infinity
      g[Math.min(n - 1, 9 * chunkSize)] = 1e-40
      const e0 = randn(n, chunkSize + 1, 1e-2)
      e0.fill(0, 2 * chunkSize, 3 * chunkSize)
      for (const scale of [0.25, 0.3]) {
        const ctx = { step: 3, rank: 1, key: "w" }
        const ref = new Int8Compressor({ chunkSize })
        const eRef = e0.slice()
        for (let i = 0; i < n; i++) eRef[i] += Math.fround(g[i] * scale)
        const want = Buffer.from(ref.encode(eRef, ctx).bytes)
        ref.accumulate(want, eRef, -1)
        for (const where of ["plain", "space"] as const) {
          const c = new Int8Compressor({ chunkSize })
          const e = where === "space" ? simdSpace([n])![0]! : new Float32Array(n)
          e.set(e0)
          const gg = g.slice()
          const got = Buffer.from(c.encodeFeedback(gg, scale, e, ctx).bytes)
          const label = `chunk ${chunkSize}, n ${n}, scale ${scale}, residual ${where}`
          expect(got.equals(want), label).toBe(true)
          expect(sameFloats(e, eRef), label).toBe(true)
          expect(bits(gg).equals(bits(g)), `${label}: the gradient is only read`).toBe(true)
        }
      }
    }
  })

  it("encodeFeedback draws the stream encode would: successive calls without a step differ, and match encode's", async () => {
    const { simdSpace } = await import("../collectives/simd.ts")
    const n = 10_000
    const g = randn(n, 3)
    const a = new Int8Compressor()
    const b = new Int8Compressor()
    const ea = simdSpace([n])![0]!
    const eb = new Float32Array(n)
    const m1 = Buffer.from(a.encodeFeedback(g, 1, ea).bytes)
    const m2 = Buffer.from(a.encodeFeedback(g, 1, ea).bytes)
    expect(m1.equals(m2)).toBe(false)
    for (let i = 0; i < n; i++) eb[i] += g[i]
    const r1 = Buffer.from(b.encode(eb).bytes)
    b.accumulate(r1, eb, -1)
    for (let i = 0; i < n; i++) eb[i] += g[i]
    const r2 = Buffer.from(b.encode(eb).bytes)
    expect(m1.equals(r1) && m2.equals(r2)).toBe(true)
  })

  it("sumInto: the bits of zeroing then accumulating each message in order, into a SIMD space or not", async () => {
    const { simdSpace } = await import("../collectives/simd.ts")
    for (const [chunkSize, n] of [[4096, 150_001], [7, 1001], [3000, 70_000]] as const) {
      const c = new Int8Compressor({ chunkSize })
      const msgs = [0, 1, 2, 3].map((r) => {
        const x = randn(n, 50 + r, r + 1)
        if (r === 2) x[Math.min(n - 1, chunkSize + 2)] = NaN
        if (r === 3) x.fill(0, 0, chunkSize)
        return c.encode(x, { step: 1, rank: r }).bytes.slice()
      })
      for (const list of [msgs, msgs.slice(1, 2)]) {
        const want = new Float32Array(n).fill(0)
        for (const m of list) c.accumulate(m, want, 1)
        for (const where of ["plain", "space"] as const) {
          const into = where === "space" ? simdSpace([n])![0]! : new Float32Array(n)
          into.fill(123)
          c.sumInto(list, into)
          expect(sameFloats(into, want), `chunk ${chunkSize}, ${list.length} messages, ${where}`).toBe(true)
        }
      }
    }
    expect(() => new Int8Compressor().sumInto([new Int8Compressor().encode(new Float32Array(10)).bytes], new Float32Array(9))).toThrow()
  })
})

describe("top-k", () => {
  const reference = (x: Float32Array, k: number): number[] =>
    [...x.keys()]
      .sort((a, b) => Math.abs(x[b]) - Math.abs(x[a]) || a - b)
      .slice(0, k)
      .sort((a, b) => a - b)

  it("keeps exactly the k largest magnitudes (ties to the lower index), indices ascending", () => {
    fc.assert(
      fc.property(
        fc.oneof(f32Array(3000), fc.array(fc.integer({ min: -3, max: 3 }), { maxLength: 500, size: "medium" }).map((a) => Float32Array.from(a))),
        fc.double({ min: 0.001, max: 1, noNaN: true }),
        (x, ratio) => {
          const c = new TopKCompressor({ ratio })
          const k = c.k(x.length)
          const msg = c.encode(x)
          const want = reference(x, k)
          const b = msg.bytes
          const view = new DataView(b.buffer, b.byteOffset, b.byteLength)
          if (view.getUint32(8, true) !== k || b.length !== c.wireBytes(x.length)) return false
          for (let j = 0; j < k; j++) {
            if (view.getUint32(12 + 4 * k + 4 * j, true) !== want[j]) return false
            if (view.getFloat32(12 + 4 * j, true) !== x[want[j]]) return false
          }
          const d = c.decode(msg)
          const set = new Set(want)
          for (let i = 0; i < x.length; i++) if (d[i] !== (set.has(i) ? x[i] : 0)) return false
          return true
        }
      ),
      { numRuns: 300 }
    )
  })

  it("NaN counts above +-Infinity, which counts above every finite value; ties among them to the lower index", () => {
    // magnitude rank: NaN (any payload) > Infinity > finite |x|
    const key = (v: number): number => (Number.isNaN(v) ? 2 : Math.abs(v) === Infinity ? 1 : 0)
    const referenceNaN = (x: Float32Array, k: number): number[] =>
      [...x.keys()]
        .sort((a, b) => key(x[b]) - key(x[a]) || (key(x[a]) === 0 ? Math.abs(x[b]) - Math.abs(x[a]) : 0) || a - b)
        .slice(0, k)
        .sort((a, b) => a - b)
    const nanBits = new Float32Array(new Uint32Array([0x7fc00000, 0xffc00001, 0x7f800123]).buffer)
    fc.assert(
      fc.property(
        fc.array(fc.oneof(fc.constantFrom(...nanBits, Infinity, -Infinity, 0, -0, 1, -1), fc.float({ noNaN: true })), { minLength: 1, maxLength: 400 }),
        fc.double({ min: 0.001, max: 1, noNaN: true }),
        (vals, ratio) => {
          const x = Float32Array.from(vals)
          const c = new TopKCompressor({ ratio })
          const k = c.k(x.length)
          const b = c.encode(x).bytes
          const view = new DataView(b.buffer, b.byteOffset, b.byteLength)
          const want = referenceNaN(x, k)
          for (let j = 0; j < k; j++) if (view.getUint32(12 + 4 * k + 4 * j, true) !== want[j]) return false
          return true
        }
      ),
      { numRuns: 300 }
    )
  })

  it("k = round(ratio·n), at least 1, at most n", () => {
    expect(topkCount(0.01, 0)).toBe(0)
    expect(topkCount(0.01, 10)).toBe(1)
    expect(topkCount(0.01, 1000)).toBe(10)
    expect(topkCount(0.07, 100)).toBe(7)
    expect(topkCount(1, 5)).toBe(5)
  })

  it("the sampled-threshold path gives bit-identical messages to the full selection", () => {
    for (const [n, ratio, seed] of [
      [300_000, 0.01, 1],
      [200_000, 0.001, 2],
      [100_000, 0.05, 3]
    ] as const) {
      const x = randn(n, seed)
      for (let i = 0; i < n; i += 7) x[i] = 0 // many ties at zero
      const sampled = new TopKCompressor({ ratio, sampleAbove: 1000 })
      const full = new TopKCompressor({ ratio, sampleAbove: Infinity })
      const a = sampled.encode(x).bytes
      const b = full.encode(x).bytes
      expect(Buffer.from(a).equals(Buffer.from(b))).toBe(true)
      expect(sampled.fallbacks).toBe(0)
    }
    // a tensor where the sample misleads (all mass in a few elements the stride skips): falls back, still exact
    const x = new Float32Array(100_000)
    for (let i = 1; i < 3000; i += 2) x[i] = i
    const c = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
    const d = c.decode(c.encode(x))
    expect(reference(x, c.k(x.length)).every((i) => d[i] === x[i])).toBe(true)
  })

  it("the fused error-feedback pass gives compensate-then-encode's message and residual; encodeFeedback leaves accumulate(msg, e, -1)'s residual; the gradient is only read", async () => {
    const { simdSpace } = await import("../collectives/simd.ts")
    const sampledAt = (n: number): Set<number> => new Set(Array.from({ length: 8192 }, (_, s) => Math.floor((s * n) / 8192)))
    const cases: Array<[string, number, (n: number) => Float32Array, number]> = [
      ["gaussian", 300_000, (n) => randn(n, 5), 1e-3],
      // every magnitude equal: far more candidates than the cap, so it falls back
      ["flat", 300_000, (n) => new Float32Array(n).fill(0.5), 0],
      // the largest values exactly where the sample looks, fewer of them than k: too few
      // candidates, so it falls back
      ["misled", 1_000_000, (n) => {
        const at = sampledAt(n)
        return Float32Array.from({ length: n }, (_, i) => (at.has(i) ? 1e6 : 1 + (i % 1000) / 1000))
      }, 0]
    ]
    for (const [name, n, make, noise] of cases) {
      for (const where of ["plain", "space"] as const) {
        const g = make(n)
        const e0 = randn(n, 6).map((v) => v * noise)
        const scale = 0.3
        const ref = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
        const eRef = e0.slice()
        for (let i = 0; i < n; i++) eRef[i] += Math.fround(g[i] * scale)
        const want = Buffer.from(ref.encode(eRef).bytes)
        const c = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
        const e = where === "space" ? simdSpace([n])![0] : new Float32Array(n)
        e.set(e0)
        const gg = g.slice()
        const got = Buffer.from(c.encodeCompensated(gg, scale, e).bytes)
        expect(got.equals(want), `${name}, residual ${where}`).toBe(true)
        expect(Buffer.from(e.buffer, e.byteOffset, e.byteLength).equals(Buffer.from(eRef.buffer))).toBe(true)
        expect(Buffer.from(gg.buffer).equals(Buffer.from(g.buffer)), "the gradient is only read").toBe(true)
        if (name !== "gaussian") expect(c.fallbacks).toBe(1)
        else expect(c.fallbacks).toBe(0)
        // encodeFeedback: the same message, the residual after accumulate(msg, e, -1), and the
        // gradient only read
        const f = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
        const e2 = where === "space" ? simdSpace([n])![0]! : new Float32Array(n)
        e2.set(e0)
        const g2 = g.slice()
        const msg = f.encodeFeedback(g2, scale, e2)
        expect(Buffer.from(msg.bytes).equals(want), `${name}, feedback, residual ${where}`).toBe(true)
        const eAfter = eRef.slice()
        ref.accumulate(want, eAfter, -1)
        expect(Buffer.from(e2.buffer, e2.byteOffset, e2.byteLength).equals(Buffer.from(eAfter.buffer))).toBe(true)
        expect(Buffer.from(g2.buffer).equals(Buffer.from(g.buffer)), "the gradient is only read").toBe(true)
      }
    }
  })

  it("encodeFeedback leaves the residual accumulate(msg, e, -1) would, with NaN and infinities among the sent values", () => {
    const n = 200_000
    const g = randn(n, 11)
    for (const [i, v] of [[7, Number.NaN], [5000, Infinity], [123_456, -Infinity], [199_999, Number.NaN]] as const) g[i] = v
    const e0 = randn(n, 12).map((v) => v * 1e-3)
    const a = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
    const b = new TopKCompressor({ ratio: 0.01, sampleAbove: 1000 })
    const ea = e0.slice()
    const eb = e0.slice()
    const ga = g.slice()
    const m = a.encodeCompensated(ga, 0.5, ea)
    a.accumulate(m, ea, -1)
    const gb = g.slice()
    b.encodeFeedback(gb, 0.5, eb)
    const differ: number[] = []
    for (let i = 0; i < n; i++) if (Number.isNaN(ea[i]) ? !Number.isNaN(eb[i]) : !Object.is(ea[i], eb[i])) differ.push(i)
    expect(differ).toEqual([])
    expect(Number.isNaN(eb[7]) && Number.isNaN(eb[5000])).toBe(true)
  })

  it("kthLargestMagnitude: the k-th largest of non-negative values (ties, zeros, Infinity), as sorting finds it; a left as it was", () => {
    fc.assert(
      fc.property(
        fc.oneof(
          fc.float32Array({ minLength: 1, maxLength: 2000, noNaN: true, size: "medium" }),
          fc.array(fc.integer({ min: 0, max: 4 }), { minLength: 1, maxLength: 400 }).map((a) => Float32Array.from(a))
        ),
        fc.double({ min: 0, max: 1, noNaN: true }),
        (raw, at) => {
          const a = raw.map((v) => Math.abs(v))
          const k = 1 + Math.min(a.length - 1, Math.floor(at * a.length))
          const before = a.slice()
          const got = kthLargestMagnitude(a, a.length, k)
          const want = a.slice().sort()[a.length - k]
          return Object.is(got, want) && Buffer.from(a.buffer).equals(Buffer.from(before.buffer))
        }
      ),
      { numRuns: 300 }
    )
    expect(() => kthLargestMagnitude(new Float32Array(3), 3, 4)).toThrow(RangeError)
  })

  it("sumInto: the bits of zeroing then accumulating each message in order, across blocks, with shared indices, -0 and NaN", () => {
    const n = 3 * 16384 + 77
    const c = new TopKCompressor({ ratio: 0.02, sampleAbove: 1 << 30 })
    const msgs = [0, 1, 2, 3].map((r) => {
      const x = randn(n, 40 + r)
      // shared large entries (every message picks them), block edges, a -0 and a NaN
      for (const i of [0, 16383, 16384, 32767, 32768, n - 1]) x[i] = 1e3 * (r + 1)
      if (r === 1) x[5] = NaN
      return c.encode(x).bytes.slice()
    })
    const zeroes = c.encode(Float32Array.from({ length: n }, (_, i) => (i === 7 ? -0 : 0))).bytes.slice()
    for (const list of [msgs, msgs.slice(0, 1), [zeroes, msgs[2]], []]) {
      const want = new Float32Array(n)
      for (const m of list) c.accumulate(m, want)
      const got = Float32Array.from({ length: n }, () => 9)
      c.sumInto(list, got)
      expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true)
    }
    // a bad message is refused before anything is written
    const bad = msgs[3].slice()
    new DataView(bad.buffer).setUint32(12 + 4 * c.k(n), n + 5, true)
    const target = new Float32Array(n).fill(9)
    expect(() => c.sumInto([msgs[0], bad], target)).toThrow(WireDecodeError)
    expect(target.every((v) => v === 9)).toBe(true)
  })

  it("a NaN is always selected (a diverged gradient stays visible)", () => {
    const x = new Float32Array([1, 2, NaN, 3, 4])
    const c = new TopKCompressor({ ratio: 0.2 })
    expect(Number.isNaN(c.decode(c.encode(x))[2])).toBe(true)
  })

  it("rejects out-of-range or unordered indices", () => {
    const c = new TopKCompressor({ ratio: 0.5 })
    const msg = c.encode(new Float32Array([5, 1, 4, 2])).bytes.slice()
    // indices start at 12 + 4k = 20; make the second index smaller than the first
    new DataView(msg.buffer).setUint32(24, 0, true)
    expect(() => c.decode(msg)).toThrow(WireDecodeError)
  })
})

describe("sign", () => {
  it("decodes to scale·sign(x), scale = mean |x| of the chunk; the sign is the fp32 sign bit", () => {
    fc.assert(
      fc.property(f32Array(1000), (x) => {
        const c = new SignCompressor({ chunkSize: 64 })
        const d = c.decode(c.encode(x))
        for (let lo = 0; lo < x.length; lo += 64) {
          const hi = Math.min(x.length, lo + 64)
          let sum = 0
          for (let i = lo; i < hi; i++) sum += Math.abs(x[i])
          const scale = Math.fround(sum / (hi - lo))
          for (let i = lo; i < hi; i++) if (!Object.is(d[i], x[i] < 0 || Object.is(x[i], -0) ? -scale : scale)) return false
        }
        return true
      }),
      { numRuns: 300 }
    )
  })

  it("is ~32x smaller than fp32", () => {
    const c = new SignCompressor()
    expect((4 * 1 << 20) / c.wireBytes(1 << 20)).toBeGreaterThan(31.5)
  })
})

describe("every codec", () => {
  const codecs: ReadonlyArray<Compressor> = [
    new NoneCompressor(),
    new Fp16Compressor(),
    new Int8Compressor({ chunkSize: 100 }),
    new TopKCompressor({ ratio: 0.1 }),
    new SignCompressor({ chunkSize: 16 })
  ]

  it("wireBytes(n) is the exact message length, for any n (0 included)", () => {
    for (const c of codecs) {
      for (const n of [0, 1, 7, 8, 9, 100, 101, 1000, 4097]) {
        expect(c.encode(randn(n, n)).bytes.length, `${c.name} n=${n}`).toBe(c.wireBytes(n))
        expect(c.decode(c.encode(randn(n, n))).length).toBe(n)
      }
    }
  })

  it("accumulate(msg, into, w) adds w·decode(msg); decode is the same from an unaligned copy", () => {
    for (const c of codecs) {
      const x = randn(1001, 5)
      const msg = c.encode(x, { step: 1 })
      const d = c.decode(msg)
      const into = randn(1001, 6)
      const want = into.map((v, i) => v + -0.5 * d[i])
      c.accumulate(msg, into, -0.5)
      expect(into).toEqual(want)
      const shifted = new Uint8Array(msg.bytes.length + 1)
      shifted.set(msg.bytes, 1)
      expect(c.decode(shifted.subarray(1))).toEqual(d)
      // a Node Buffer at an odd offset inside a larger pool, as the NATS client hands them out
      const pool = Buffer.alloc(msg.bytes.length + 3)
      pool.set(msg.bytes, 3)
      expect(c.decode(pool.subarray(3))).toEqual(d)
      expect(codecOf(msg)).toBe(c.name)
    }
  })

  it("encodes into a caller's buffer without allocating a new one", () => {
    for (const c of codecs) {
      const x = randn(500, 9)
      const out = new Uint8Array(c.wireBytes(500) + 64)
      const msg = c.encode(x, { step: 2 }, out)
      expect(msg.bytes.buffer).toBe(out.buffer)
      expect(c.decode(msg)).toEqual(c.decode(c.encode(x, { step: 2 })))
    }
  })

  it("truncated, foreign, other-codec and wrong-length messages are WireDecodeErrors", () => {
    for (const c of codecs) {
      const msg = c.encode(randn(300, 3)).bytes
      expect(() => c.decode(msg.subarray(0, msg.length - 1))).toThrow(WireDecodeError)
      expect(() => c.decode(msg.subarray(0, 5))).toThrow(WireDecodeError)
      const foreign = msg.slice()
      foreign[0] = 0x00
      expect(() => c.decode(foreign)).toThrow(WireDecodeError)
      const other = codecs.find((o) => o.name !== c.name)!
      expect(() => other.decode(msg)).toThrow(/ranks disagree/)
      expect(() => c.accumulate(msg, new Float32Array(299))).toThrow(WireDecodeError)
    }
  })
})
