// Error feedback: the invariant (what was sent plus the residual equals the sum of the gradients,
// step after step), per compress point and for the aggregate of every aggregation kind; residual
// keying; checkpoint state round trips.
import { describe, expect, it } from "vitest"
import {
  ErrorFeedback,
  Fp16Compressor,
  Int8Compressor,
  NoneCompressor,
  PowerSgdCompressor,
  ResidualMismatch,
  SignCompressor,
  TopKCompressor,
  ringSegmentKey,
  simulateCompressedAllReduce,
  simulateRequantizingRing,
  type Codec,
  type Compressor
} from "../collectives/compression/index.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"

const randn = (n: number, rng: Mulberry32, scale = 1): Float32Array => Float32Array.from({ length: n }, () => rng.normal() * scale)

const maxAbs = (x: ArrayLike<number>): number => {
  let m = 0
  for (let i = 0; i < x.length; i++) m = Math.max(m, Math.abs(x[i]))
  return m
}

const lossy = (): ReadonlyArray<Compressor & Codec> => [
  new Fp16Compressor(),
  new Int8Compressor({ chunkSize: 128 }),
  new TopKCompressor({ ratio: 0.01 }),
  new TopKCompressor({ ratio: 0.2 }),
  new SignCompressor({ chunkSize: 64 })
]

describe("error feedback, one rank", () => {
  for (const c of lossy()) {
    it(`${c.name}${c instanceof TopKCompressor ? ` ${c.ratio}` : ""}: Σ decode(sent) + residual == Σ gradients after every step`, () => {
      const rng = new Mulberry32(11)
      const ef = new ErrorFeedback()
      const n = 1000
      const sumG = new Float64Array(n)
      const sumSent = new Float64Array(n)
      let gMax = 0
      for (let t = 1; t <= 60; t++) {
        // gradients of changing scale, with a persistent direction, as in training
        const g = randn(n, rng, 1 + Math.sin(t))
        for (let i = 0; i < 10; i++) g[i] += 3
        gMax += maxAbs(g)
        const before = g.slice()
        const msg = ef.compress(c, "w", g, { step: t })
        expect(g).toEqual(before) // the gradient itself is untouched
        const d = c.decode(msg)
        const e = ef.get("w")!
        for (let i = 0; i < n; i++) {
          sumG[i] += g[i]
          sumSent[i] += d[i]
        }
        // every fp32 operation rounds by <= 2^-24 of its operands; the residual operations see
        // values up to |e| + |g|, so the drift is bounded by a few ulps of the running magnitudes
        const tol = 2 ** -20 * (gMax + t * maxAbs(e))
        for (let i = 0; i < n; i++) {
          const err = Math.abs(sumSent[i] + e[i] - sumG[i])
          if (err > tol) expect.fail(`step ${t}, element ${i}: |Σsent + e - Σg| = ${err} > ${tol}`)
        }
      }
    })
  }

  it("the residual comes from this rank's own message: e = p - D(C(p))", () => {
    const rng = new Mulberry32(3)
    const c = new TopKCompressor({ ratio: 0.1 })
    const ef = new ErrorFeedback()
    ef.compress(c, "w", randn(100, rng))
    const e0 = ef.get("w")!.slice()
    const g = randn(100, rng)
    const msg = ef.compress(c, "w", g)
    const p = g.map((v, i) => v + e0[i])
    const d = c.decode(msg)
    expect(ef.get("w")).toEqual(p.map((v, i) => v - d[i]))
    expect(c.encode(p).bytes).toEqual(msg.bytes)
  })

  it("keeps nothing for uncompressed tensors or when switched off", () => {
    const ef = new ErrorFeedback()
    const g = new Float32Array([1, 2, 3])
    ef.compress(new NoneCompressor(), "raw", g)
    ef.compress(new TopKCompressor({ ratio: 0.3, errorFeedback: false }), "off", g)
    ef.compress(new SignCompressor({ errorFeedback: false }), "off2", g)
    expect(ef.size).toBe(0)
    ef.compress(new TopKCompressor({ ratio: 0.3 }), "on", g)
    expect(ef.keys()).toEqual(["on"])
    expect([...ef.get("on")!]).toEqual([1, 2, 0])
  })

  it("keys residuals separately and refuses a length change", () => {
    const ef = new ErrorFeedback()
    const c = new SignCompressor({ chunkSize: 8 })
    ef.compress(c, "a", new Float32Array([1, -2, 3]))
    ef.compress(c, "b", new Float32Array([5, 5, 5, 5, 1]))
    expect(ef.keys()).toEqual(["a", "b"])
    expect(() => ef.compress(c, "a", new Float32Array(4))).toThrow(ResidualMismatch)
  })
})

describe("residual state for checkpoints", () => {
  it("state() is a copy; restore() continues bit for bit, from typed arrays or plain number arrays", () => {
    for (const c of lossy()) {
      const rng = new Mulberry32(5)
      const grads = Array.from({ length: 12 }, () => randn(300, rng))
      const a = new ErrorFeedback()
      for (let t = 0; t < 6; t++) a.compress(c, "w", grads[t], { step: t })
      const saved = a.state()
      const asJson = JSON.parse(JSON.stringify(Object.fromEntries(Object.entries(saved).map(([k, v]) => [k, [...v]]))))
      saved.w.fill(123) // mutating the snapshot must not touch the store
      const b = new ErrorFeedback()
      b.restore(asJson)
      for (let t = 6; t < 12; t++) {
        const ma = a.compress(c, "w", grads[t], { step: t })
        const mb = b.compress(c, "w", grads[t], { step: t })
        expect(mb.bytes, `${c.name} step ${t}`).toEqual(ma.bytes)
      }
      expect(b.state()).toEqual(a.state())
    }
  })
})

describe("error feedback through the simulated collectives (p = 4)", () => {
  const p = 4
  const n = 997 // not divisible by p: uneven ring segments

  const run = (
    make: () => Compressor & Codec,
    steps: number,
    check: (t: number, sumA: Float64Array, sumG: Float64Array, residualSum: Float64Array, gMax: number) => void,
    simulate: (grads: Float32Array[], c: Compressor & Codec, efs: ErrorFeedback[], o: { key: string; step: number }) => Float32Array = simulateCompressedAllReduce
  ) => {
    const rng = new Mulberry32(21)
    const c = make()
    const efs = Array.from({ length: p }, () => new ErrorFeedback())
    const sumA = new Float64Array(n)
    const sumG = new Float64Array(n)
    let gMax = 0
    for (let t = 0; t < steps; t++) {
      const grads = Array.from({ length: p }, () => randn(n, rng))
      for (const g of grads) {
        gMax += maxAbs(g)
        for (let i = 0; i < n; i++) sumG[i] += g[i]
      }
      const agg = simulate(grads, c, efs, { key: "w", step: t })
      for (let i = 0; i < n; i++) sumA[i] += agg[i]
      // all residuals of all ranks, whatever their keys (int8 keeps one per ring segment)
      const residualSum = new Float64Array(n)
      for (const ef of efs) {
        for (const k of ef.keys()) {
          const e = ef.get(k)!
          const seg = /#ring\d+\.(\d+)$/.exec(k)
          const lo = seg ? Math.floor((Number(seg[1]) * n) / p) : 0
          for (let i = 0; i < e.length; i++) residualSum[lo + i] += e[i]
        }
      }
      check(t, sumA, sumG, residualSum, gMax)
    }
    return efs
  }

  const invariant = (t: number, sumA: Float64Array, sumG: Float64Array, res: Float64Array, gMax: number): void => {
    const tol = 2 ** -19 * (gMax + (t + 1) * maxAbs(res))
    for (let i = 0; i < n; i++) {
      const err = Math.abs(sumA[i] + res[i] - sumG[i])
      if (err > tol) expect.fail(`step ${t}, element ${i}: ${err} > ${tol}`)
    }
  }

  for (const make of [() => new TopKCompressor({ ratio: 0.01 }), () => new SignCompressor({ chunkSize: 64 }), () => new Int8Compressor({ chunkSize: 64 })]) {
    const name = make().name
    it(`${name}: Σ aggregates + Σ every residual == Σ all gradients, step after step`, () => {
      const efs = run(make, 40, invariant)
      // all-gathered: one compress point per rank and tensor
      for (const ef of efs) expect(ef.keys()).toEqual(["w"])
    })
  }

  it("int8 in the re-quantizing ring model (not what the reducer runs): the same, with a residual per compress point", () => {
    const efs = run(() => new Int8Compressor({ chunkSize: 64 }), 40, invariant, simulateRequantizingRing)
    // one compress point per (rank, segment): origin, hop or owner
    for (const ef of efs) expect([...ef.keys()].sort()).toEqual([0, 1, 2, 3].map((c) => ringSegmentKey("w", p, c)).sort())
  })

  it("fp16: the same up to the uncompensated fp16 rounding of partial sums in the ring", () => {
    run(() => new Fp16Compressor(), 20, (t, sumA, sumG, res) => {
      for (let i = 0; i < n; i++) {
        // p-1 hop roundings + the owner's, each <= 2^-11 of a partial sum of |g| <= ~4·4
        const tol = (t + 1) * p * 2 ** -11 * 16
        if (Math.abs(sumA[i] + res[i] - sumG[i]) > tol) expect.fail(`step ${t}, element ${i}`)
      }
    })
  })

  it("PowerSGD: Σ aggregates + Σ residuals == Σ gradients (each rank's own share P̂ Q_wᵀ)", () => {
    const rng = new Mulberry32(8)
    const shape = [40, 25]
    const size = 40 * 25
    const comps = Array.from({ length: p }, () => new PowerSgdCompressor({ rank: 2 }))
    const efs = Array.from({ length: p }, () => new ErrorFeedback())
    const sumA = new Float64Array(size)
    const sumG = new Float64Array(size)
    let gMax = 0
    for (let t = 0; t < 30; t++) {
      const grads = Array.from({ length: p }, () => randn(size, rng))
      for (const g of grads) {
        gMax += maxAbs(g)
        for (let i = 0; i < size; i++) sumG[i] += g[i]
      }
      const agg = simulateCompressedAllReduce(grads, comps, efs, { key: "W", shape, step: t })
      for (let i = 0; i < size; i++) sumA[i] += agg[i]
      const res = new Float64Array(size)
      for (const ef of efs) ef.get("W")!.forEach((v, i) => (res[i] += v))
      const tol = 2 ** -16 * (gMax + (t + 1) * maxAbs(res))
      for (let i = 0; i < size; i++) {
        const err = Math.abs(sumA[i] + res[i] - sumG[i])
        if (err > tol) expect.fail(`step ${t}, element ${i}: ${err} > ${tol}`)
      }
    }
  })

  it("every rank would see the same aggregate: p = 1 sends nothing and compresses nothing", () => {
    const ef = new ErrorFeedback()
    const g = new Float32Array([1, 2, 3, 4])
    expect(simulateCompressedAllReduce([g], new TopKCompressor({ ratio: 0.25 }), [ef])).toEqual(g)
    expect(ef.size).toBe(0)
  })
})
