// Convergence sanity in pure math: multi-output least squares trained by minibatch SGD on 4
// simulated ranks, gradients going through simulateCompressedAllReduce. With error feedback every
// codec must end close to uncompressed training; top-k 1% without error feedback must end
// measurably worse than with it. (The digits test with real worker processes comes with the
// trainer.)
import { beforeAll, describe, expect, it } from "vitest"
import {
  ErrorFeedback,
  Fp16Compressor,
  Int8Compressor,
  NoneCompressor,
  PowerSgdCompressor,
  SignCompressor,
  TopKCompressor,
  simulateCompressedAllReduce,
  type AnyCompressor
} from "../collectives/compression/index.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"

const P = 4
const D = 64 // features
const C = 16 // outputs: W is D×C, a matrix, so PowerSGD applies
const N = 2048
const BATCH = 32
const STEPS = 500
const LR = 0.05

const problem = (() => {
  const rng = new Mulberry32(1234)
  const X = Float32Array.from({ length: N * D }, () => rng.normal())
  const Wstar = Float32Array.from({ length: D * C }, () => rng.normal())
  const Y = new Float32Array(N * C)
  for (let i = 0; i < N; i++)
    for (let c = 0; c < C; c++) {
      let s = 0
      for (let j = 0; j < D; j++) s += X[i * D + j] * Wstar[j * C + c]
      Y[i * C + c] = s + 0.1 * rng.normal()
    }
  return { X, Y }
})()

const loss = (W: Float32Array): number => {
  const { X, Y } = problem
  let s = 0
  for (let i = 0; i < N; i++)
    for (let c = 0; c < C; c++) {
      let z = -Y[i * C + c]
      for (let j = 0; j < D; j++) z += X[i * D + j] * W[j * C + c]
      s += z * z
    }
  return s / (2 * N)
}

/** Mean gradient over a minibatch of rank r's shard. */
const gradient = (W: Float32Array, rank: number, rng: Mulberry32): Float32Array => {
  const { X, Y } = problem
  const g = new Float32Array(D * C)
  const shard = N / P
  const z = new Float64Array(C)
  for (let b = 0; b < BATCH; b++) {
    const i = rank * shard + Math.floor(rng.next() * shard)
    for (let c = 0; c < C; c++) {
      let s = -Y[i * C + c]
      for (let j = 0; j < D; j++) s += X[i * D + j] * W[j * C + c]
      z[c] = s
    }
    for (let j = 0; j < D; j++) for (let c = 0; c < C; c++) g[j * C + c] += (X[i * D + j] * z[c]) / BATCH
  }
  return g
}

const train = (make: () => AnyCompressor, errorFeedback: boolean): number => {
  const comps = Array.from({ length: P }, make)
  const efs = errorFeedback ? Array.from({ length: P }, () => new ErrorFeedback()) : null
  const rngs = Array.from({ length: P }, (_, r) => new Mulberry32(100 + r))
  const W = new Float32Array(D * C)
  for (let step = 0; step < STEPS; step++) {
    const grads = comps.map((_, r) => gradient(W, r, rngs[r]))
    const sum = simulateCompressedAllReduce(grads, comps, efs, { key: "W", shape: [D, C], step })
    for (let k = 0; k < W.length; k++) W[k] -= (LR * sum[k]) / P
  }
  return loss(W)
}

describe("convergence with compressed gradients (least squares, 4 simulated ranks)", () => {
  let baseline = 0
  let start = 0
  let topkWithFeedback = 0
  beforeAll(() => {
    baseline = train(() => new NoneCompressor(), false)
    start = loss(new Float32Array(D * C))
  })

  it("uncompressed SGD solves the problem", () => {
    expect(baseline).toBeLessThan(start * 0.01)
  })

  const withEf: ReadonlyArray<[string, () => AnyCompressor, number]> = [
    ["fp16", () => new Fp16Compressor(), 1.05],
    ["int8", () => new Int8Compressor({ chunkSize: 256 }), 1.05],
    ["topk 1%", () => new TopKCompressor({ ratio: 0.01 }), 1.25],
    ["sign", () => new SignCompressor({ chunkSize: 256 }), 1.25],
    ["powersgd rank 2", () => new PowerSgdCompressor({ rank: 2 }), 1.05]
  ]
  for (const [name, make, factor] of withEf) {
    it(`${name} with error feedback ends within ${factor}x of uncompressed loss`, () => {
      const l = train(make, true)
      if (name === "topk 1%") topkWithFeedback = l
      // the baseline sits at SGD's noise floor; "close" = within a factor of that floor
      expect(l).toBeLessThan(baseline * factor)
    })
  }

  it("top-k 1% without error feedback is measurably worse than with it", () => {
    const withFeedback = topkWithFeedback || train(() => new TopKCompressor({ ratio: 0.01 }), true)
    const without = train(() => new TopKCompressor({ ratio: 0.01, errorFeedback: false }), false)
    expect(without).toBeGreaterThan(withFeedback * 10)
  })
})
