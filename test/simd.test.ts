// The WebAssembly SIMD kernels against the scalar loops they stand in for: every result must be
// bit-for-bit the same (ranks may mix paths, and a collective's results must be identical on every
// rank), over every binary16 pattern, random fp32 bit patterns (NaN, Inf, subnormals included),
// lengths with SIMD tails and lengths spanning several scratch blocks.
import { describe, expect, it } from "vitest"
import {
  addHalfIntoHalf,
  addScaledIntoHalf,
  addScaledIntoHalfScalar,
  decodeHalfScalar,
  encodeHalfScalar,
  halfFeedbackBitsScalar,
  halfTable,
  roundToHalfScalar
} from "../collectives/float16.ts"
import {
  SIMD_BLOCK,
  decodeAddDivideSimd,
  feedbackMatMulSimd,
  decodeOuterSimd,
  matMulTSimd,
  decodeHalfSimd,
  encodeHalfSimd,
  roundHalfSimd,
  simdAvailable,
  simdSpace,
  inSimdSpace,
  topkCompensateSimd,
  addIntoHalfSimd,
  addHalfIntoHalfSimd,
  addScaledIntoHalfSimd,
  halfFeedbackBitsSimd,
  addF32Simd,
  addDivideF32Simd,
  scaleF32Simd,
  divideF32Simd
} from "../collectives/simd.ts"
import { accumulate, accumulateDivide, accumulateIntoHalfPayload, accumulateIntoPayload, divide, scale } from "../collectives/kernels.ts"

/** binary16 NaN bits (the NaN of a sum may differ in payload between paths). */
const isHalfNaN = (h: number): boolean => (h & 0x7c00) === 0x7c00 && (h & 0x3ff) !== 0

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

/**
 * fp16 error feedback as values, the reference for halfFeedbackBits: p = f32(f32(g·scale) + e);
 * g = half(p) (the value sent, whose bits are the message); e = p - g (what rounding dropped).
 */
const halfFeedbackScalar = (g: Float32Array, e: Float32Array, scale: number): void => {
  for (let i = 0; i < g.length; i++) g[i] = Math.fround(g[i] * scale) + e[i]
  e.set(g)
  roundToHalfScalar(g)
  for (let i = 0; i < g.length; i++) e[i] -= g[i]
}

/** Every binary16 midpoint (the tie itself and one fp32 step either side), both signs. */
const midpoints = (): Float32Array => {
  const t = halfTable()
  const bits: number[] = []
  const f = new Float32Array(1)
  const u = new Uint32Array(f.buffer)
  for (let h = 0; h < 0x7c00; h++) {
    f[0] = h === 0x7bff ? 65520 : (t[h] + t[h + 1]) / 2 // exact in fp32 (halves are 11-bit values); 65520 rounds to Inf
    for (const d of [-1, 0, 1]) bits.push(u[0] + d, (u[0] + d) | 0x80000000)
  }
  return new Float32Array(Uint32Array.from(bits).buffer)
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

  it("rounding at every binary16 midpoint (the tie and one fp32 step either side), both signs, as the scalar loop", () => {
    // roundHalf rounds in the fp32 domain; the ties are where that can go wrong
    const x = midpoints()
    const ref = x.slice()
    roundToHalfScalar(ref)
    const viaRound = x.slice()
    expect(roundHalfSimd(viaRound)).toBe(true)
    expect(sameBits(ref, viaRound)).toBe(0)
  })

  it("a ring relay's fp16 partial sum added into the received message: the bits of decode-add then encode", () => {
    for (const n of LENGTHS) {
      const buf = floats(n, 7 * n).map((v) => (Number.isFinite(v) ? v : 1))
      const msg = new Uint16Array(words(n, 9 * n).buffer.slice(0, n * 4)).subarray(0, n)
      // the two-pass path: add the message into the buffer, encode the buffer for the next hop
      const t = halfTable()
      const sum = buf.map((v, i) => v + t[msg[i]])
      const ref = new Uint16Array(n)
      encodeHalfScalar(sum, ref)
      const viaKernel = msg.slice()
      const before = buf.slice()
      expect(addIntoHalfSimd(buf, viaKernel)).toBe(true)
      expect(sameBits(before, buf)).toBe(0) // the buffer is only read
      const viaFallback = new Uint8Array(msg.slice().buffer)
      accumulateIntoHalfPayload(viaFallback, buf, 0, n)
      let bad = 0
      for (let i = 0; i < n; i++) if (viaKernel[i] !== ref[i] && !(isHalfNaN(viaKernel[i]) && isHalfNaN(ref[i]))) bad++
      expect(bad).toBe(0)
      expect(Buffer.from(viaFallback).equals(Buffer.from(viaKernel.buffer, viaKernel.byteOffset, n * 2))).toBe(true)
    }
  })

  it("fp16 error feedback into bits: the bits of halfFeedback's sent values and the same residual, for any scale; the gradient is only read", () => {
    for (const scale of [1, 0.25, 1 / 3, 0.1]) {
      for (const n of [...LENGTHS, SIMD_BLOCK + 11]) {
        const g = floats(n, 13 + n)
        const e = floats(n, 14 + n).map((v) => (Number.isFinite(v) ? v * 1e-3 : 0))
        // the reference: halfFeedback rounds g in place; its bits are what is sent
        const g1 = g.slice()
        const e1 = e.slice()
        halfFeedbackScalar(g1, e1, scale)
        const want = new Uint16Array(n)
        encodeHalfScalar(g1, want)
        const viaScalar = new Uint16Array(n)
        const e2 = e.slice()
        const g2 = g.slice()
        halfFeedbackBitsScalar(g2, e2, scale, viaScalar)
        const viaKernel = new Uint16Array(n)
        const e3 = e.slice()
        const g3 = g.slice()
        expect(halfFeedbackBitsSimd(g3, e3, scale, viaKernel)).toBe(true)
        expect(Buffer.from(viaScalar.buffer).equals(Buffer.from(want.buffer))).toBe(true)
        expect(Buffer.from(viaKernel.buffer).equals(Buffer.from(want.buffer))).toBe(true)
        expect(sameBits(e1, e2)).toBe(0)
        expect(sameBits(e1, e3)).toBe(0)
        expect(sameBits(g, g2)).toBe(0)
        expect(sameBits(g, g3)).toBe(0)
      }
    }
  })

  it("fp16 error feedback into bits at every binary16 midpoint (ties, one fp32 step either side, both signs)", () => {
    const t = halfTable()
    const x = midpoints()
    const want = new Uint16Array(x.length)
    encodeHalfScalar(x, want)
    const got = new Uint16Array(x.length)
    const e = new Float32Array(x.length)
    expect(halfFeedbackBitsSimd(x, e, 1, got)).toBe(true)
    expect(Buffer.from(got.buffer).equals(Buffer.from(want.buffer))).toBe(true)
    for (let i = 0; i < x.length; i++) expect(Object.is(e[i], Math.fround(x[i] - t[want[i]])) || !Number.isFinite(x[i] - t[want[i]])).toBe(true)
  })

  it("a relay's partial sum added into the message when the own values are binary16 bits: the bits of decode, add, encode", () => {
    for (const n of LENGTHS) {
      const own = new Uint16Array(words(n, 5 * n).buffer.slice(0, n * 2))
      const msg = new Uint16Array(words(n, 6 * n + 1).buffer.slice(0, n * 2))
      const t = halfTable()
      const ref = new Uint16Array(n)
      encodeHalfScalar(Float32Array.from(own, (h, i) => t[h] + t[msg[i]]), ref)
      const viaKernel = msg.slice()
      const ownBefore = own.slice()
      expect(addHalfIntoHalfSimd(own, viaKernel)).toBe(true)
      expect(Buffer.from(own.buffer).equals(Buffer.from(ownBefore.buffer))).toBe(true)
      // the fp16 reducer's own bits live in a space: read in place there
      const space = simdSpace([Math.ceil(n / 2)])!
      const ownInSpace = new Uint16Array(space[0].buffer, space[0].byteOffset, n)
      ownInSpace.set(own)
      const viaSpace = msg.slice()
      expect(addHalfIntoHalfSimd(ownInSpace, viaSpace)).toBe(true)
      expect(Buffer.from(ownInSpace.buffer, ownInSpace.byteOffset, 2 * n).equals(Buffer.from(own.buffer))).toBe(true)
      expect(Buffer.from(viaSpace.buffer).equals(Buffer.from(viaKernel.buffer))).toBe(true)
      const viaDispatch = msg.slice()
      addHalfIntoHalf(own, viaDispatch)
      let bad = 0
      for (let i = 0; i < n; i++) if (viaKernel[i] !== ref[i] && !(isHalfNaN(viaKernel[i]) && isHalfNaN(ref[i]))) bad++
      expect(bad).toBe(0)
      expect(Buffer.from(viaDispatch.buffer).equals(Buffer.from(viaKernel.buffer))).toBe(true)
    }
  })

  it("a relay's own scaled (and compensated) gradient added into the message: the bits of scale, add the residual, add, encode; the residual is spent; the gradient only read, or (store) given the new values", () => {
    const t = halfTable()
    const halfEq = (a: Uint16Array, b: Uint16Array): number => {
      let bad = 0
      for (let i = 0; i < a.length; i++) if (a[i] !== b[i] && !(isHalfNaN(a[i]) && isHalfNaN(b[i]))) bad++
      return bad
    }
    for (const scale of [1, 0.25, 1 / 3]) {
      for (const n of [...LENGTHS, 2 * SIMD_BLOCK + 9]) {
        // gradients and partial sums in fp16's range (NaN, Inf, subnormals and ties among them)
        const g = floats(n, 31 + n)
        const e = floats(n, 32 + n).map((v) => (Number.isFinite(v) ? v * 1e-3 : 0))
        const msg = new Uint16Array(words(n, 33 + n).buffer.slice(0, n * 2))
        for (const withE of [false, true]) {
          // the reference, written out: x = f32(g·s) (+ e), then half(x + value(msg))
          const want = new Uint16Array(n)
          encodeHalfScalar(
            Float32Array.from(g, (v, i) => {
              const x = Math.fround(v * scale)
              return (withE ? Math.fround(x + e[i]) : x) + t[msg[i]]
            }),
            want
          )
          const wantValues = Float32Array.from(want, (h) => t[h])
          for (const store of [false, true]) {
            const run = (f: (g: Float32Array, e: Float32Array | undefined, h: Uint16Array) => unknown, gIn: Float32Array, eIn: Float32Array): void => {
              gIn.set(g)
              eIn.set(e)
              const h = msg.slice()
              f(gIn, withE ? eIn : undefined, h)
              expect(halfEq(h, want)).toBe(0)
              expect(sameBits(gIn, store ? wantValues : g)).toBe(0)
              // the residual is spent where it was folded in, and untouched without it
              expect(withE ? eIn.every((v) => Object.is(v, 0)) : sameBits(eIn, e) === 0).toBe(true)
            }
            const simd = (a: Float32Array, b: Float32Array | undefined, h: Uint16Array) => expect(addScaledIntoHalfSimd(a, scale, b, h, store)).toBe(true)
            run((a, b, h) => addScaledIntoHalfScalar(a, scale, b, h, store), new Float32Array(n), new Float32Array(n))
            run(simd, new Float32Array(n), new Float32Array(n))
            run((a, b, h) => addScaledIntoHalf(a, scale, b, h, store), new Float32Array(n), new Float32Array(n))
            // every placement: either array in a space, both in one space, and at an odd offset in it
            const [gs, es] = simdSpace([n + 1, n + 1])!
            run(simd, gs.subarray(0, n), new Float32Array(n))
            run(simd, new Float32Array(n), es.subarray(0, n))
            run(simd, gs.subarray(0, n), es.subarray(0, n))
            run(simd, gs.subarray(1), es.subarray(1))
          }
        }
      }
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

  describe("PowerSGD kernels (r <= 4)", () => {
    /** Plain float64 reference of M·Q (n×m times m×r). */
    const refMatMul = (M: Float32Array, n: number, m: number, Q: Float32Array, r: number): Float64Array => {
      const P = new Float64Array(n * r)
      for (let i = 0; i < n; i++) for (let c = 0; c < r; c++) {
        let a = 0
        for (let j = 0; j < m; j++) a += M[i * m + j] * Q[j * r + c]
        P[i * r + c] = a
      }
      return P
    }
    const normal = (n: number, seed: number): Float32Array => {
      const w = words(2 * n, seed)
      const out = new Float32Array(n)
      for (let i = 0; i < n; i++) out[i] = Math.sqrt(-2 * Math.log((w[2 * i] + 1) / 2 ** 32)) * Math.cos((2 * Math.PI * w[2 * i + 1]) / 2 ** 32)
      return out
    }
    // several row blocks (65536 / m rows each), a partial last block, r from 1 to 4
    const SHAPES = [[300, 1024, 4], [129, 512, 3], [2000, 64, 1], [70, 4096, 2]] as const

    it("feedbackMatMul: the residual becomes G·s + e exactly, and P = M·Q to fp32 rounding", () => {
      for (const [n, m, r] of SHAPES) {
        for (const s of [0.25, 1 / 3]) {
          const G = normal(n * m, n + m)
          const E = normal(n * m, r).map((v) => v * 0.01)
          const Q = normal(m * r, 7)
          const M = E.map((e, i) => Math.fround(e + Math.fround(G[i] * s)))
          const P = new Float32Array(n * r)
          expect(feedbackMatMulSimd(G, s, E, n, m, Q, r, P)).toBe(true)
          expect(sameBits(M, E)).toBe(0)
          const ref = refMatMul(M, n, m, Q, r)
          let worst = 0
          for (let k = 0; k < ref.length; k++) worst = Math.max(worst, Math.abs(P[k] - ref[k]) / Math.sqrt(m))
          expect(worst).toBeLessThan(1e-5) // fp32 sums of m products of unit-size terms
        }
      }
    })

    it("feedbackMatMul with an owed correction: the residual and P bitwise as paying it first (subtractOwn), then the plain pass", async () => {
      const { subtractOwn } = await import("../collectives/compression/matrix.ts")
      for (const [n, m, r] of SHAPES) {
        const s = 1 / 3
        const G = normal(n * m, n + 1)
        const E = normal(n * m, m + 2).map((v) => v * 0.01)
        const Q = normal(m * r, 3)
        const owed = { P: normal(n * r, 4), Qw: normal(m * r, 5) }
        // the reference: the correction on its own (the scalar fp32 formula), then the plain kernel
        const E1 = E.slice()
        subtractOwn(owed, n, m, r, E1)
        expect(sameBits(E1, E)).toBeGreaterThan(0) // the correction changes the residual
        const P1 = new Float32Array(n * r)
        expect(feedbackMatMulSimd(G, s, E1, n, m, Q, r, P1)).toBe(true)
        // fused, with the residual outside and inside a space, and the gradient in the same space
        const E2 = E.slice()
        const P2 = new Float32Array(n * r)
        expect(feedbackMatMulSimd(G, s, E2, n, m, Q, r, P2, owed)).toBe(true)
        expect(sameBits(E1, E2)).toBe(0)
        expect(sameBits(P1, P2)).toBe(0)
        const [G3, E3] = simdSpace([n * m, n * m])!
        G3.set(G)
        E3.set(E)
        const P3 = new Float32Array(n * r)
        expect(feedbackMatMulSimd(G3, s, E3, n, m, Q, r, P3, owed)).toBe(true)
        expect(sameBits(E1, E3)).toBe(0)
        expect(sameBits(P1, P3)).toBe(0)
        expect(sameBits(G, G3)).toBe(0) // the gradient is only read
      }
    })

    it("matMulT: Q = Mᵀ·P to fp32 rounding", () => {
      for (const [n, m, r] of SHAPES) {
        const M = normal(n * m, 3)
        const P = normal(n * r, 4)
        const Q = new Float32Array(m * r)
        expect(matMulTSimd(M, n, m, P, r, Q)).toBe(true)
        // Mᵀ·P is (Pᵀ·M)ᵀ: the reference multiplies the transposes
        const Mt = new Float32Array(m * n)
        for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) Mt[j * n + i] = M[i * m + j]
        const ref = refMatMul(Mt, m, n, P, r)
        let worst = 0
        for (let k = 0; k < ref.length; k++) worst = Math.max(worst, Math.abs(Q[k] - ref[k]) / Math.sqrt(n))
        expect(worst).toBeLessThan(1e-5)
      }
    })

    it("decodeOuter: the aggregate is bitwise the scalar loop's (every rank decodes the same); subtractOwn takes this rank's share with the same formula", async () => {
      const { decodeOuter, subtractOwn } = await import("../collectives/compression/matrix.ts")
      for (const [n, m, r] of SHAPES) {
        const P = normal(n * r, 5)
        const Q = normal(m * r, 6)
        const Qw = normal(m * r, 8)
        const E = normal(n * m, 9)
        const out = new Float32Array(n * m)
        expect(decodeOuterSimd(P, Q, n, m, r, out)).toBe(true)
        // the fixed formula, element by element
        const f = Math.fround
        const ref = new Float32Array(n * m)
        const refE = E.slice()
        const col = (F: Float32Array, c: number, j: number): number => (c < r ? F[j * r + c] : 0)
        for (let i = 0; i < n; i++) {
          const p = [0, 1, 2, 3].map((c) => (c < r ? P[i * r + c] : 0))
          for (let j = 0; j < m; j++) {
            ref[i * m + j] = f(f(f(f(p[0] * col(Q, 0, j)) + f(p[1] * col(Q, 1, j))) + f(p[2] * col(Q, 2, j))) + f(p[3] * col(Q, 3, j)))
            refE[i * m + j] = f(refE[i * m + j] - f(f(f(f(p[0] * col(Qw, 0, j)) + f(p[1] * col(Qw, 1, j))) + f(p[2] * col(Qw, 2, j))) + f(p[3] * col(Qw, 3, j))))
          }
        }
        expect(sameBits(ref, out)).toBe(0)
        // (the owed correction of feedbackMatMulSimd is compared with subtractOwn above)
        const E2 = E.slice()
        subtractOwn({ P, Qw }, n, m, r, E2)
        expect(sameBits(refE, E2)).toBe(0)
        // and matrix.ts's exported function gives the same bits on this path
        const out3 = new Float32Array(n * m)
        decodeOuter(P, Q, n, m, r, out3)
        expect(sameBits(ref, out3)).toBe(0)
      }
    })

    it("shapes the kernels cannot take are declined (the scalar loops run)", () => {
      const P = new Float32Array(100 * 5)
      expect(matMulTSimd(new Float32Array(100 * 64), 100, 64, P, 5, new Float32Array(64 * 5))).toBe(false) // r > 4
      expect(matMulTSimd(new Float32Array(100 * 10), 100, 10, P, 2, new Float32Array(10 * 2))).toBe(false) // m % 4
    })

    it("a process without SIMD (GRADWIRE_SIMD=0) decodes bitwise the same aggregate", async () => {
      const { execFileSync } = await import("node:child_process")
      const script = `
        import { decodeOuter, feedbackMatMul } from "./collectives/compression/matrix.ts"
        import { simdAvailable } from "./collectives/simd.ts"
        import { createHash } from "node:crypto"
        const n = 200, m = 256, r = 3
        let x = 12345
        const fill = (k) => Float32Array.from({ length: k }, () => ((x = (Math.imul(x, 1103515245) + 12345) | 0) >>> 8) / 2 ** 23 - 1)
        const P = fill(n * r), Q = fill(m * r), Qw = fill(m * r), E = fill(n * m), G = fill(n * m), out = new Float32Array(n * m)
        // the residual: the owed share subtracted and the gradient added (P1, this rank's own
        // contribution, may differ between the paths and is not compared)
        feedbackMatMul(G, 0.25, E, n, m, Q, r, new Float32Array(n * r), { P, Qw })
        decodeOuter(P, Q, n, m, r, out)
        const h = createHash("sha256").update(new Uint8Array(out.buffer)).update(new Uint8Array(E.buffer)).digest("hex")
        console.log(JSON.stringify({ simd: simdAvailable(), h }))`
      const run = (flag: string): { simd: boolean; h: string } =>
        JSON.parse(execFileSync(process.execPath, ["--input-type=module", "-e", script], { env: { ...process.env, GRADWIRE_SIMD: flag }, encoding: "utf8" }).trim())
      const scalar = run("0")
      const simd = run("1")
      expect(scalar.simd).toBe(false)
      expect(simd.simd).toBe(true)
      expect(simd.h).toBe(scalar.h)
    })
  })

  describe("fp32 reductions (the plain all-reduce's sums, divisions and weights)", () => {
    /** `x` as an ordinary array, or copied into a space of its own. */
    const where = (x: Float32Array, inSpace: boolean): Float32Array => {
      if (!inSpace) return x.slice()
      const [v] = simdSpace([x.length])!
      v.set(x)
      return v
    }
    /** Both arrays copied into one space. */
    const together = (a: Float32Array, b: Float32Array): [Float32Array, Float32Array] => {
      const [va, vb] = simdSpace([a.length, b.length])!
      va.set(a)
      vb.set(b)
      return [va, vb]
    }
    /** Every placement of the pair: ordinary, a or b in a space, both in one space. */
    const placements = (a: Float32Array, b: Float32Array): Array<[string, Float32Array, Float32Array]> => [
      ["ordinary", a.slice(), b.slice()],
      ["a in a space", where(a, true), b.slice()],
      ["b in a space", a.slice(), where(b, true)],
      ["both in one space", ...together(a, b)]
    ]

    it("a += b gives the JS loop's f32 sums; b is only read", () => {
      for (const n of LENGTHS) {
        const a = floats(n, n + 11)
        const b = floats(n, n + 12)
        const ref = a.slice()
        for (let i = 0; i < n; i++) ref[i] += b[i]
        for (const [label, x, y] of placements(a, b)) {
          expect(addF32Simd(x, y), label).toBe(true)
          expect(sameBits(ref, x), `${label}, n = ${n}`).toBe(0)
          expect(sameBits(b, y), `${label}: b changed`).toBe(0)
        }
      }
    })

    it("a = (a + b) / d gives the JS loop's values (sum and quotient in double) for any divisor", () => {
      for (const n of [257, SIMD_BLOCK + 13, 3 * SIMD_BLOCK + 5]) {
        for (const d of [3, 4, 0.7, 1 / 3, 2.5e-3, 12345.678]) {
          const a = floats(n, n + 21)
          const b = floats(n, n + 22)
          const ref = a.slice()
          for (let i = 0; i < n; i++) ref[i] = (ref[i] + b[i]) / d
          for (const [label, x, y] of placements(a, b)) {
            expect(addDivideF32Simd(x, y, d), label).toBe(true)
            expect(sameBits(ref, x), `${label}, n = ${n}, d = ${d}`).toBe(0)
          }
        }
      }
    })

    it("a *= s and a /= d give the JS loop's values, for f32 and non-f32 factors and divisors", () => {
      for (const n of LENGTHS) {
        for (const f of [3, 0.5, -1.5, 0.7, 1 / 3, 1e-3, 7e37]) {
          const a = floats(n, n + 31)
          const mul = a.slice()
          const div = a.slice()
          for (let i = 0; i < n; i++) {
            mul[i] *= f
            div[i] /= f
          }
          for (const inSpace of [false, true]) {
            const x = where(a, inSpace)
            expect(scaleF32Simd(x, f)).toBe(true)
            expect(sameBits(mul, x), `scale n = ${n}, f = ${f}, in space ${inSpace}`).toBe(0)
            const y = where(a, inSpace)
            expect(divideF32Simd(y, f)).toBe(true)
            expect(sameBits(div, y), `divide n = ${n}, d = ${f}, in space ${inSpace}`).toBe(0)
          }
        }
      }
    })

    it("the data path's functions (kernels.ts) give the scalar formulas at an offset, aligned payload or not", () => {
      const n = SIMD_BLOCK + 301
      const off = 37
      const buf = floats(off + n + 5, 41)
      const vals = floats(n, 42)
      for (const shift of [0, 1]) {
        // a received message: the values at byte offset `shift` of a larger buffer
        const raw = new Uint8Array(n * 4 + 8)
        raw.set(new Uint8Array(vals.buffer), shift)
        const payload = raw.subarray(shift, shift + n * 4)

        const acc = buf.slice()
        accumulate(acc, off, payload, n, false, "sum")
        const accRef = buf.slice()
        for (let i = 0; i < n; i++) accRef[off + i] += vals[i]
        expect(sameBits(accRef, acc), `accumulate, shift ${shift}`).toBe(0)

        const divd = buf.slice()
        accumulateDivide(divd, off, payload, n, false, 3)
        const divRef = buf.slice()
        for (let i = 0; i < n; i++) divRef[off + i] = (divRef[off + i] + vals[i]) / 3
        expect(sameBits(divRef, divd), `accumulateDivide, shift ${shift}`).toBe(0)
      }
      // into the payload itself (aligned, as the ring requires): buf is only read
      const raw = new Uint8Array(vals.slice().buffer)
      const before = buf.slice()
      accumulateIntoPayload(raw, buf, off, n, "sum")
      const intoRef = vals.slice()
      for (let i = 0; i < n; i++) intoRef[i] += buf[off + i]
      expect(sameBits(intoRef, new Float32Array(raw.buffer))).toBe(0)
      expect(sameBits(before, buf)).toBe(0)

      for (const f of [3, 0.7]) {
        const sc = buf.slice()
        scale(sc, off, n, f)
        const dv = buf.slice()
        divide(dv, off, n, f)
        const scRef = buf.slice()
        const dvRef = buf.slice()
        for (let i = 0; i < n; i++) {
          scRef[off + i] *= f
          dvRef[off + i] /= f
        }
        expect(sameBits(scRef, sc), `scale ${f}`).toBe(0)
        expect(sameBits(dvRef, dv), `divide ${f}`).toBe(0)
      }
      // a weight of 1 changes nothing, NaN bits included
      const one = buf.slice()
      scale(one, off, n, 1)
      expect(Buffer.from(one.buffer).equals(Buffer.from(buf.buffer))).toBe(true)
    })
  })

  describe("arrays in a SIMD space (worked on in place, no copies)", () => {
    /** Copies of `xs` placed in one new space. */
    const placed = (...xs: Float32Array[]): Float32Array[] => {
      const views = simdSpace(xs.map((x) => x.length))
      expect(views).toBeDefined()
      views!.forEach((v, i) => {
        expect(inSimdSpace(v)).toBe(true)
        v.set(xs[i])
      })
      return views!
    }

    it("a space's arrays start at zero and do not overlap", () => {
      const [a, b, c] = simdSpace([1001, 5, SIMD_BLOCK])!
      expect([a.length, b.length, c.length]).toEqual([1001, 5, SIMD_BLOCK])
      expect(a.every((v) => v === 0) && b.every((v) => v === 0) && c.every((v) => v === 0)).toBe(true)
      a.fill(1)
      c.fill(3)
      b.fill(2)
      expect(a.every((v) => v === 1) && b.every((v) => v === 2) && c.every((v) => v === 3)).toBe(true)
      expect(inSimdSpace(new Float32Array(10))).toBe(false)
    })

    it("binary16 encode, decode, decode-add, decode-add-divide, rounding: the same bits as ordinary arrays", () => {
      for (const n of [257, SIMD_BLOCK + 13, 3 * SIMD_BLOCK + 5]) {
        const x = floats(n, n + 1)
        const h = new Uint16Array(words(n, 3).buffer, 0, n)
        const [xs] = placed(x)
        const e1 = new Uint16Array(n)
        const e2 = new Uint16Array(n)
        encodeHalfSimd(x, e1)
        encodeHalfSimd(xs, e2)
        expect(Buffer.from(e2.buffer).equals(Buffer.from(e1.buffer))).toBe(true)
        for (const add of [false, true]) {
          const d1 = x.slice()
          const [d2] = placed(x)
          decodeHalfSimd(h, d1, add)
          decodeHalfSimd(h, d2, add)
          expect(sameBits(d1, d2)).toBe(0)
        }
        const v1 = x.slice()
        const [v2] = placed(x)
        decodeAddDivideSimd(h, v1, 3)
        decodeAddDivideSimd(h, v2, 3)
        expect(sameBits(v1, v2)).toBe(0)
        const r1 = x.slice()
        const [r2] = placed(x)
        roundHalfSimd(r1)
        roundHalfSimd(r2)
        expect(sameBits(r1, r2)).toBe(0)
      }
    })

    it("fp16 error feedback into bits with the residual in a space, and with gradient, residual and message in one", () => {
      const n = 2 * SIMD_BLOCK + 9
      const g = floats(n, 23)
      const e = floats(n, 24).map((v) => (Number.isFinite(v) ? v * 1e-3 : 0))
      for (const scale of [0.25, 1 / 3]) {
        const want = new Uint16Array(n)
        const e1 = e.slice()
        halfFeedbackBitsScalar(g, e1, scale, want)
        const out2 = new Uint16Array(n)
        const [e2] = placed(e)
        expect(halfFeedbackBitsSimd(g, e2, scale, out2)).toBe(true)
        expect(Buffer.from(out2.buffer).equals(Buffer.from(want.buffer))).toBe(true)
        expect(sameBits(e1, e2)).toBe(0)
        // the message's n binary16 values in n/2 floats of the same space
        const [g3, e3, m3] = placed(g, e, new Float32Array(Math.ceil(n / 2)))
        const out3 = new Uint16Array(m3.buffer, m3.byteOffset, n)
        expect(halfFeedbackBitsSimd(g3, e3, scale, out3)).toBe(true)
        expect(Buffer.from(out3.buffer, out3.byteOffset, n * 2).equals(Buffer.from(want.buffer))).toBe(true)
        expect(sameBits(e1, e3)).toBe(0)
        expect(sameBits(g, g3)).toBe(0)
      }
    })

    it("top-k compensation: the residual as the JS loop computes it, and the indices at or above the threshold (NaN included)", () => {
      const n = 3 * SIMD_BLOCK + 7
      const g = floats(n, 31).map((v) => (Number.isFinite(v) ? v : 0))
      g[100] = NaN
      const e = floats(n, 32).map((v) => (Number.isFinite(v) ? v * 0.01 : 0))
      for (const scale of [0.25, 0.3]) {
        const thr = 1e-3
        const ref = e.slice()
        const want: number[] = []
        for (let i = 0; i < n; i++) {
          ref[i] = Math.fround(ref[i] + Math.fround(g[i] * scale))
          const a = Math.abs(ref[i])
          if (a >= thr || a !== a) want.push(i)
        }
        expect(want.length).toBeGreaterThan(10)
        expect(want.length).toBeLessThan(n)
        const [es] = placed(e)
        const cand = new Uint32Array(want.length + 5)
        const vals = new Float32Array(want.length + 5)
        expect(topkCompensateSimd(g, scale, es, Math.fround(thr), cand, vals)).toBe(want.length)
        expect(sameBits(ref, es)).toBe(0)
        expect([...cand.subarray(0, want.length)]).toEqual(want)
        expect(sameBits(vals.subarray(0, want.length), Float32Array.from(want, (i) => ref[i]))).toBe(0)
        // too small a candidate array: the count still says how many there were, the first ones are kept
        const [es2] = placed(e)
        const few = new Uint32Array(7)
        expect(topkCompensateSimd(g, scale, es2, Math.fround(thr), few, new Float32Array(7))).toBe(want.length)
        expect([...few]).toEqual(want.slice(0, 7))
        expect(sameBits(ref, es2)).toBe(0)
      }
      // a residual outside any space is declined (the JS loop runs)
      expect(topkCompensateSimd(g, 1, e.slice(), 1, new Uint32Array(10), new Float32Array(10))).toBe(-1)
    })

    it("PowerSGD kernels with the residual (and matrix, and output) in a space: the same bits", () => {
      const [n, m, r] = [300, 1024, 4]
      const w = words(4 * n * m, 77)
      const G = Float32Array.from({ length: n * m }, (_, i) => w[i] / 2 ** 32 - 0.5)
      const E = Float32Array.from({ length: n * m }, (_, i) => (w[n * m + i] / 2 ** 32 - 0.5) * 0.01)
      const Q = Float32Array.from({ length: m * r }, (_, i) => w[2 * n * m + i] / 2 ** 32 - 0.5)
      const E1 = E.slice()
      const P1 = new Float32Array(n * r)
      feedbackMatMulSimd(G, 0.25, E1, n, m, Q, r, P1)
      const [E2, G2] = placed(E, G)
      const P2 = new Float32Array(n * r)
      feedbackMatMulSimd(G, 0.25, E2, n, m, Q, r, P2)
      expect(sameBits(E1, E2)).toBe(0)
      expect(sameBits(P1, P2)).toBe(0)
      const [E3] = placed(E)
      feedbackMatMulSimd(G2, 0.25, E3, n, m, Q, r, P2) // G2 is in another space: copied in
      expect(sameBits(E1, E3)).toBe(0)
      const Q1 = new Float32Array(m * r)
      const Q2 = new Float32Array(m * r)
      matMulTSimd(E1, n, m, P1, r, Q1)
      matMulTSimd(E2, n, m, P1, r, Q2)
      expect(sameBits(Q1, Q2)).toBe(0)
      // the next step's pass paying this step's share, residual outside and inside a space
      feedbackMatMulSimd(G, 0.25, E1, n, m, Q, r, new Float32Array(n * r), { P: P1, Qw: Q2 })
      feedbackMatMulSimd(G, 0.25, E2, n, m, Q, r, new Float32Array(n * r), { P: P1, Qw: Q2 })
      expect(sameBits(E1, E2)).toBe(0)
      const out1 = new Float32Array(n * m)
      decodeOuterSimd(P1, Q1, n, m, r, out1)
      const [out3] = placed(new Float32Array(n * m))
      decodeOuterSimd(P1, Q1, n, m, r, out3)
      expect(sameBits(out1, out3)).toBe(0)
    })
  })
})
