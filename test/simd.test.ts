// The WebAssembly SIMD kernels against the scalar loops they stand in for: every result must be
// bit-for-bit the same (ranks may mix paths, and a collective's results must be identical on every
// rank), over every binary16 pattern, random fp32 bit patterns (NaN, Inf, subnormals included),
// lengths with SIMD tails and lengths spanning several scratch blocks.
import { describe, expect, it } from "vitest"
import { decodeHalfScalar, encodeHalfScalar, halfTable, roundToHalfScalar } from "../collectives/float16.ts"
import {
  SIMD_BLOCK,
  decodeAddDivideSimd,
  decodeHalfSimd,
  encodeHalfSimd,
  halfFeedbackSimd,
  roundHalfSimd,
  simdAvailable
} from "../collectives/simd.ts"

/** A deterministic xorshift stream of 32-bit words. */
const words = (n: number, seed: number): Uint32Array => {
  const out = new Uint32Array(n)
  let x = seed >>> 0 || 1
  for (let i = 0; i < n; i++) {
    x ^= x << 13
    x ^= x >>> 17
    x ^= x << 5
    out[i] = x >>> 0
  }
  return out
}

/** fp32 values: a third arbitrary bit patterns, the rest spread over 30 binades around fp16's range. */
const floats = (n: number, seed: number): Float32Array => {
  const w = words(n, seed)
  const f = new Float32Array(w.buffer)
  for (let i = 0; i < n; i++) {
    if (i % 3 === 0) continue
    const u = w[i] / 2 ** 32
    f[i] = (u - 0.5) * 2 ** (Math.floor(u * 1e6) % 30 - 22)
  }
  f[0] = NaN
  f[1] = Infinity
  f[2] = -Infinity
  f[3] = 65520 // rounds to Inf
  f[4] = 65519 // rounds to 65504
  f[5] = 2 ** -25 // a tie between 0 and the smallest subnormal
  f[6] = -0
  f[7] = 5.960464477539063e-8 * 1.5 // a subnormal tie
  return f
}

/** Same value, where NaN equals any NaN (the bits of a NaN may differ; both paths produce NaN). */
const sameBits = (a: Float32Array, b: Float32Array): number => {
  let bad = 0
  for (let i = 0; i < a.length; i++) if (!(Object.is(a[i], b[i]) || (Number.isNaN(a[i]) && Number.isNaN(b[i])))) bad++
  return bad
}

const LENGTHS = [256, 257, 263, 1000, SIMD_BLOCK, SIMD_BLOCK + 13, 3 * SIMD_BLOCK + 5]

describe("SIMD kernels", () => {
  it("load on this runtime (Node >= 22 has WebAssembly SIMD)", () => {
    expect(simdAvailable()).toBe(true)
  })

  it("below the size threshold they decline and the caller runs its scalar loop", () => {
    expect(encodeHalfSimd(new Float32Array(10), new Uint16Array(10))).toBe(false)
  })

  it("encode fp32 -> binary16 gives the scalar loop's bits", () => {
    for (const n of LENGTHS) {
      const x = floats(n, n)
      const a = new Uint16Array(n)
      const b = new Uint16Array(n)
      encodeHalfScalar(x, a)
      expect(encodeHalfSimd(x, b)).toBe(true)
      expect(Buffer.from(b.buffer).equals(Buffer.from(a.buffer))).toBe(true)
    }
  })

  it("decode every binary16 pattern, and decode-accumulate, as the scalar loop does", () => {
    const all = new Uint16Array(65536).map((_, i) => i)
    const a = new Float32Array(65536)
    const b = new Float32Array(65536)
    decodeHalfScalar(all, a)
    expect(decodeHalfSimd(all, b, false)).toBe(true)
    expect(sameBits(a, b)).toBe(0)
    const base = floats(65536, 99)
    const acc1 = base.slice()
    const acc2 = base.slice()
    const t = halfTable()
    for (let i = 0; i < 65536; i++) acc1[i] += t[all[i]]
    decodeHalfSimd(all, acc2, true)
    expect(sameBits(acc1, acc2)).toBe(0)
  })

  it("decode-add-divide matches (dst + value) / d computed in double", () => {
    for (const [n, d] of [[SIMD_BLOCK + 7, 3], [1001, 0.7], [4096, 4]] as const) {
      const h = new Uint16Array(words(n, 7).buffer, 0, n)
      const base = floats(n, 5)
      const ref = base.slice()
      const got = base.slice()
      const t = halfTable()
      for (let i = 0; i < n; i++) ref[i] = (ref[i] + t[h[i]]) / d
      expect(decodeAddDivideSimd(h, got, d)).toBe(true)
      expect(sameBits(ref, got)).toBe(0)
    }
  })

  it("round to the nearest binary16 value in place", () => {
    for (const n of LENGTHS) {
      const x = floats(n, 3 * n)
      const ref = x.slice()
      roundToHalfScalar(ref)
      expect(roundHalfSimd(x)).toBe(true)
      expect(sameBits(ref, x)).toBe(0)
    }
  })

  it("fused fp16 error feedback: sent value and residual as the scalar loop computes them, for any scale", () => {
    for (const scale of [1, 0.25, 1 / 3, 0.1]) {
      const n = SIMD_BLOCK + 11
      const g = floats(n, 11)
      const e = floats(n, 12).map((v) => (Number.isFinite(v) ? v * 1e-3 : 0))
      const g1 = g.slice()
      const e1 = e.slice()
      for (let i = 0; i < n; i++) g1[i] = Math.fround(g1[i] * scale) + e1[i]
      e1.set(g1)
      roundToHalfScalar(g1)
      for (let i = 0; i < n; i++) e1[i] -= g1[i]
      expect(halfFeedbackSimd(g, e, scale)).toBe(true)
      expect(sameBits(g1, g)).toBe(0)
      expect(sameBits(e1, e)).toBe(0)
    }
  })

  it("GRADWIRE_SIMD=0 turns them off in a fresh process", async () => {
    const { execFileSync } = await import("node:child_process")
    const out = execFileSync(process.execPath, ["-e", 'import("./collectives/simd.ts").then((m) => console.log(m.simdAvailable()))'], {
      env: { ...process.env, GRADWIRE_SIMD: "0" },
      encoding: "utf8"
    })
    expect(out.trim()).toBe("false")
  })
})
