// PowerSGD: reconstruction of low-rank matrices, power iteration via warm start, warm-up and
// uncompressed small tensors, the async all-reduce driver, and state round trips.
import { describe, expect, it } from "vitest"
import {
  CompressionShapeError,
  ErrorFeedback,
  ResidualMismatch,
  PowerSgdCompressor,
  inProcessAllReduce,
  simulateCompressedAllReduce
} from "../collectives/compression/index.ts"
import { orthonormalize } from "../collectives/compression/matrix.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"

const randn = (n: number, rng: Mulberry32): Float32Array => Float32Array.from({ length: n }, () => rng.normal())

/** A Bᵀ for A (n×r), B (m×r), row-major. */
const lowRank = (A: Float32Array, B: Float32Array, n: number, m: number, r: number): Float32Array => {
  const M = new Float32Array(n * m)
  for (let i = 0; i < n; i++) for (let j = 0; j < m; j++) for (let c = 0; c < r; c++) M[i * m + j] += A[i * r + c] * B[j * r + c]
  return M
}

const frob = (x: ArrayLike<number>, y?: ArrayLike<number>): number => {
  let s = 0
  for (let i = 0; i < x.length; i++) s += (x[i] - (y ? y[i] : 0)) ** 2
  return Math.sqrt(s)
}

describe("PowerSGD", () => {
  it("reconstructs an exactly rank-r matrix after one step (p = 1 and p = 4 sharing a column space)", () => {
    const rng = new Mulberry32(1)
    const [n, m, r] = [64, 48, 4]
    const A = randn(n * r, rng)
    const M = lowRank(A, randn(m * r, rng), n, m, r)
    const one = new PowerSgdCompressor({ rank: r })
    const got = simulateCompressedAllReduce([M, M], [one, new PowerSgdCompressor({ rank: r })], null, { shape: [n, m] })
    expect(frob(got, M.map((v) => 2 * v)) / frob(M)).toBeLessThan(1e-5)

    const grads = Array.from({ length: 4 }, () => lowRank(A, randn(m * r, rng), n, m, r))
    const sum = new Float32Array(n * m)
    for (const g of grads) g.forEach((v, i) => (sum[i] += v))
    const comps = grads.map(() => new PowerSgdCompressor({ rank: r }))
    for (let step = 0; step < 3; step++) {
      const agg = simulateCompressedAllReduce(grads, comps, null, { shape: [n, m], step })
      expect(frob(agg, sum) / frob(sum)).toBeLessThan(1e-5)
    }
  })

  it("warm start is a power iteration: the error approaches the best rank-r error", () => {
    const rng = new Mulberry32(2)
    const [n, m, r] = [60, 40, 3]
    // M = U diag(s) Vᵀ with orthonormal U, V and a known spectrum
    const k = 10
    const U = randn(n * k, rng)
    const V = randn(m * k, rng)
    orthonormalize(U, n, k)
    orthonormalize(V, m, k)
    const s = [10, 7, 5, 2, 1.5, 1, 0.5, 0.3, 0.2, 0.1]
    for (let i = 0; i < n; i++) for (let c = 0; c < k; c++) U[i * k + c] *= s[c]
    const M = lowRank(U, V, n, m, k)
    const best = Math.sqrt(s.slice(r).reduce((a, x) => a + x * x, 0))
    const c = new PowerSgdCompressor({ rank: r, minCompressionRate: 1 })
    const errors: number[] = []
    for (let step = 0; step < 30; step++) {
      const round = c.begin([{ key: "M", shape: [n, m], grad: M }])
      const out = round.finish(round.second(round.first)!)[0]
      errors.push(frob(out, M))
    }
    expect(errors[29]).toBeLessThan(best * 1.01)
    expect(errors[29]).toBeGreaterThan(best * 0.999)
    expect(errors[0]).toBeGreaterThan(errors[29])
  })

  it("warm-up steps and small or 1-D tensors go uncompressed, exactly, with no residual", () => {
    const rng = new Mulberry32(3)
    const big = { key: "W", shape: [50, 30], grad: randn(1500, rng) }
    const bias = { key: "b", shape: [30], grad: randn(30, rng) }
    const tiny = { key: "T", shape: [2, 3], grad: randn(6, rng) } // 6 < 2·r(n+m): not worth it
    const c = new PowerSgdCompressor({ rank: 2, warmupSteps: 2 })
    const ef = new ErrorFeedback()
    expect(c.plan(bias.shape).compress).toBe(false)
    expect(c.plan(tiny.shape).compress).toBe(false)
    expect(c.plan(big.shape).compress).toBe(true)
    expect(c.wireBytes(big.shape)).toBe(4 * 1500) // still warming up
    for (let step = 0; step < 2; step++) {
      const round = c.begin([big, bias, tiny], ef)
      expect(round.second(round.first)).toBeNull()
      const [w, b, t] = round.finish(null)
      expect(w).toEqual(big.grad)
      expect(b).toEqual(bias.grad)
      expect(t).toEqual(tiny.grad)
    }
    expect(ef.size).toBe(0)
    expect(c.wireBytes(big.shape)).toBe(4 * 2 * (50 + 30))
    const round = c.begin([big, bias, tiny], ef)
    expect(round.first.length).toBe(50 * 2 + 30 + 6) // P of W, then the raw tensors
    const second = round.second(round.first)!
    expect(second.length).toBe(30 * 2)
    const [w, b, t] = round.finish(second)
    expect(b).toEqual(bias.grad)
    expect(t).toEqual(tiny.grad)
    expect(w).not.toEqual(big.grad)
    expect(ef.keys()).toEqual(["W"])
    expect(c.step).toBe(3)
  })

  it("the async driver over an in-process all-reduce equals the lock-step simulation", async () => {
    const rng = new Mulberry32(4)
    const p = 4
    const shape = [32, 20]
    const steps = Array.from({ length: 3 }, () => Array.from({ length: p }, () => randn(640, rng)))
    const lockstep = Array.from({ length: p }, () => new PowerSgdCompressor({ rank: 3, seed: 9 }))
    const lockEf = Array.from({ length: p }, () => new ErrorFeedback())
    const asyncComps = Array.from({ length: p }, () => new PowerSgdCompressor({ rank: 3, seed: 9 }))
    const asyncEf = Array.from({ length: p }, () => new ErrorFeedback())
    const allReduce = inProcessAllReduce(p)
    for (const grads of steps) {
      const want = simulateCompressedAllReduce(grads, lockstep, lockEf, { key: "W", shape })
      const outs = await Promise.all(asyncComps.map((c, r) => c.reduce([{ key: "W", shape, grad: grads[r] }], allReduce[r], asyncEf[r])))
      for (const o of outs) expect(o[0]).toEqual(want)
    }
    // Q is identical on every rank, and so is the state a checkpoint would hold
    const states = asyncComps.map((c) => c.state())
    for (const s of states) expect(s).toEqual(states[0])
  })

  it("the residual's own-share correction, owed to the next step's first pass, gives bitwise what paying it at once gives", async () => {
    const { simdSpace } = await import("../collectives/simd.ts")
    const p = 4
    // [64, 256]: the SIMD kernels; [40, 25]: rows of 25 floats, the scalar loops
    for (const [shape, rank] of [[[64, 256], 4], [[64, 256], 3], [[40, 25], 2], [[64, 256], 1]] as const) {
      const size = shape[0] * shape[1]
      const rng = new Mulberry32(size + rank)
      const steps = Array.from({ length: 5 }, () => Array.from({ length: p }, () => randn(size, rng)))
      const paid = Array.from({ length: p }, () => new PowerSgdCompressor({ rank, seed: 3 }))
      const paidEf = Array.from({ length: p }, () => new ErrorFeedback())
      const owing = Array.from({ length: p }, () => new PowerSgdCompressor({ rank, seed: 3 }))
      const owingEf = Array.from({ length: p }, () => {
        const ef = new ErrorFeedback()
        ef.allocate = (_k, n) => simdSpace([n])?.[0] ?? new Float32Array(n)
        return ef
      })
      const ar1 = inProcessAllReduce(p)
      const ar2 = inProcessAllReduce(p)
      for (const grads of steps) {
        const want = await Promise.all(paid.map((c, r) => c.reduce([{ key: "W", shape, grad: grads[r] }], ar1[r], paidEf[r], 0.25)))
        for (const ef of paidEf) ef.get("W") // a read pays what is owed
        const got = await Promise.all(owing.map((c, r) => c.reduce([{ key: "W", shape, grad: grads[r] }], ar2[r], owingEf[r], 0.25)))
        for (let r = 0; r < p; r++) expect(got[r][0]).toEqual(want[r][0])
      }
      // what a checkpoint holds: the residuals with the last step's correction paid
      for (let r = 0; r < p; r++) expect(owingEf[r].state()).toEqual(paidEf[r].state())
    }
  })

  it("a step that fails on a residual of the wrong length pays back the corrections it took", () => {
    const rng = new Mulberry32(11)
    const shape = [32, 64]
    const g = [randn(2048, rng), randn(2048, rng)]
    // two identical ranks' worth of state: `twin` pays by reading, `c` goes on to a failing step
    const make = () => ({ c: new PowerSgdCompressor({ rank: 2 }), ef: new ErrorFeedback() })
    const run = ({ c, ef }: ReturnType<typeof make>, t: ReadonlyArray<{ key: string; shape: number[]; grad: Float32Array }>) => {
      const round = c.begin(t, ef)
      return round.finish(round.second(round.first))
    }
    const a = make()
    const twin = make()
    for (const x of [a, twin]) run(x, [{ key: "A", shape, grad: g[0] }, { key: "B", shape, grad: g[1] }])
    const want = twin.ef.state()
    // A's correction is taken, then B's residual has the wrong length
    expect(() => run(a, [{ key: "A", shape, grad: g[0] }, { key: "B", shape: [16, 64], grad: g[1].subarray(0, 1024) }])).toThrow(ResidualMismatch)
    expect(a.ef.state()).toEqual(want)
    expect(want.A).not.toEqual(g[0]) // (the correction is not nothing)
  })

  it("state / restore continues identically", () => {
    const rng = new Mulberry32(5)
    const shape = [24, 16]
    const grads = Array.from({ length: 6 }, () => randn(384, rng))
    const a = new PowerSgdCompressor({ rank: 2 })
    const efA = new ErrorFeedback()
    const run = (c: PowerSgdCompressor, ef: ErrorFeedback, g: Float32Array) => {
      const round = c.begin([{ key: "W", shape, grad: g }], ef)
      return round.finish(round.second(round.first))[0]
    }
    for (let t = 0; t < 3; t++) run(a, efA, grads[t])
    const b = new PowerSgdCompressor({ rank: 2 })
    b.restore(a.state())
    const efB = new ErrorFeedback()
    efB.restore(efA.state())
    for (let t = 3; t < 6; t++) expect(run(b, efB, grads[t])).toEqual(run(a, efA, grads[t]))
    expect(b.step).toBe(6)
  })

  it("a collapsed factor column is re-seeded instead of staying zero", () => {
    const c = new PowerSgdCompressor({ rank: 2, minCompressionRate: 1 })
    const zero = { key: "Z", shape: [10, 8], grad: new Float32Array(80) }
    const round = c.begin([zero])
    expect(round.finish(round.second(round.first))[0]).toEqual(new Float32Array(80))
    const q = c.state().q.Z
    expect(q.some((v) => v !== 0)).toBe(true)
    // and a later non-zero gradient of rank 2 is still captured in full
    const rng = new Mulberry32(6)
    const M = lowRank(randn(20, rng), randn(16, rng), 10, 8, 2)
    const r2 = c.begin([{ key: "Z", shape: [10, 8], grad: M }])
    expect(frob(r2.finish(r2.second(r2.first))[0], M) / frob(M)).toBeLessThan(1e-5)
  })

  it("a shape that does not match the data is a typed error", () => {
    const c = new PowerSgdCompressor({ rank: 2 })
    expect(() => c.begin([{ key: "W", shape: [3, 4], grad: new Float32Array(11) }])).toThrow(CompressionShapeError)
  })

  it("conv kernels [h, w, in, out] are compressed as [h·w·in, out]", () => {
    const c = new PowerSgdCompressor({ rank: 4 })
    expect(c.plan([3, 3, 16, 32])).toEqual({ compress: true, n: 144, m: 32, r: 4 })
  })
})
