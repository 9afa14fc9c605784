// Codec cost of each compressor: bytes on the wire relative to fp32, and encode / decode time per
// MiB of fp32 gradient, measured here in one run (medians). The compression benchmark
// (`npm run bench -- compression`) puts these next to its all-reduce timings.
// Run alone: node bench/compression-codecs.ts [MiB]
import { fileURLToPath } from "node:url"
import {
  ErrorFeedback,
  Fp16Compressor,
  Int8Compressor,
  NoneCompressor,
  PowerSgdCompressor,
  SignCompressor,
  TopKCompressor,
  type Compressor
} from "../collectives/compression/index.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"
import { halfFeedbackBits } from "../collectives/float16.ts"
import { simdSpace } from "../collectives/simd.ts"

export interface CodecFigure {
  readonly name: string
  /** Message bytes ÷ fp32 bytes (fp16: 0.5). PowerSGD: both rounds, for a square matrix. */
  readonly bytesOnWireRatio: number
  readonly encodeMsPerMiB: number
  /** Decode into a dense buffer (top-k / sign / int8: what a receiver does per message). */
  readonly decodeMsPerMiB: number
  /**
   * encode with error feedback (p = g + e; e = p − D(C(p))), per MiB, as the gradient reducer does
   * it: fp16 and top-k by their fused pass (fp16's writes the binary16 message the ring sends).
   */
  readonly encodeWithFeedbackMsPerMiB: number
}

const median = (xs: number[]): number => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]

const time = (f: () => void, reps: number): number => {
  f() // warm-up (JIT, scratch buffers)
  const ts: number[] = []
  for (let i = 0; i < reps; i++) {
    const t0 = performance.now()
    f()
    ts.push(performance.now() - t0)
  }
  return median(ts)
}

export const codecFigures = (options: { readonly mib?: number; readonly reps?: number } = {}): CodecFigure[] => {
  const mib = options.mib ?? 16
  const reps = options.reps ?? 5
  const n = (mib * 1024 * 1024) / 4
  const rng = new Mulberry32(42)
  const g = Float32Array.from({ length: n }, () => rng.normal())
  const dense = new Float32Array(n)
  const figures: CodecFigure[] = []
  const codecs: ReadonlyArray<[string, Compressor]> = [
    ["none", new NoneCompressor()],
    ["fp16", new Fp16Compressor()],
    ["int8", new Int8Compressor()],
    ["topk 1%", new TopKCompressor({ ratio: 0.01 })],
    ["topk 0.1%", new TopKCompressor({ ratio: 0.001 })],
    ["sign", new SignCompressor()]
  ]
  for (const [name, c] of codecs) {
    const out = new Uint8Array(c.wireBytes(n))
    let step = 0
    const enc = time(() => void c.encode(g, { step: step++ }, out), reps)
    const msg = c.encode(g, { step: 0 })
    // int8: the reducer decodes with sumInto (SIMD); one message assigns, as the first of p does
    const dec = c instanceof Int8Compressor ? time(() => c.sumInto([msg], dense), reps) : time(() => void c.decode(msg, dense), reps)
    let withEf: number
    if (c instanceof Fp16Compressor) {
      // what GradientReducer does: one fused pass that reads the gradient, updates the residual
      // (in SIMD memory) and writes the message's binary16 bits, which the ring sends as they are
      const e = simdSpace([n])?.[0] ?? new Float32Array(n)
      const bits = new Uint16Array(n)
      withEf = time(() => halfFeedbackBits(g, e, 1, bits), reps)
    } else if (c.encodeFeedback) {
      // what GradientReducer does (top-k, int8): the codec's fused error feedback, with the residual
      // in SIMD memory; the gradient is only read
      const fused = c.encodeFeedback.bind(c)
      const e = simdSpace([n])?.[0] ?? new Float32Array(n)
      withEf = time(() => void fused(g, 1, e, { step: step++ }, out), reps)
    } else {
      const ef = new ErrorFeedback()
      withEf = time(() => void ef.compress(c, "g", g, { step: step++ }, out), reps)
    }
    figures.push({ name, bytesOnWireRatio: c.wireBytes(n) / (4 * n), encodeMsPerMiB: enc / mib, decodeMsPerMiB: dec / mib, encodeWithFeedbackMsPerMiB: withEf / mib })
  }
  // PowerSGD on a square matrix of the same size, p = 1 (the sums are the identity): "decode" is
  // P̂Qᵀ; with error feedback add M = G + e and e -= P̂Q_wᵀ.
  const side = Math.floor(Math.sqrt(n))
  const M = g.subarray(0, side * side)
  for (const rank of [1, 4]) {
    const c = new PowerSgdCompressor({ rank })
    const tensors = [{ key: "W", shape: [side, side], grad: M }]
    // "encode": P = MQ, orthonormalize the (identity-)summed P, Q = MᵀP̂
    const enc = time(() => {
      const r = c.begin(tensors)
      r.second(r.first)
    }, reps)
    const ef = new ErrorFeedback()
    const withEf = time(() => {
      const r = c.begin(tensors, ef)
      r.finish(r.second(r.first))
    }, reps)
    // finish() alone: a round can be finished once, so prepare one per repetition untimed
    const decs: number[] = []
    for (let i = 0; i <= reps; i++) {
      const r = c.begin(tensors)
      const s = r.second(r.first)
      const t0 = performance.now()
      r.finish(s)
      if (i > 0) decs.push(performance.now() - t0)
    }
    const dec = median(decs)
    const m = (side * side * 4) / (1024 * 1024)
    figures.push({
      name: `powersgd r${rank}`,
      bytesOnWireRatio: c.wireBytes([side, side]) / (4 * side * side),
      encodeMsPerMiB: enc / m,
      decodeMsPerMiB: dec / m,
      encodeWithFeedbackMsPerMiB: (withEf - dec) / m
    })
  }
  return figures
}

if (process.argv[1] === fileURLToPath(import.meta.url)) {
  const mib = Number(process.argv[2] ?? 16)
  console.log(`codec cost, ${mib} MiB of fp32 gradient (median of 5)`)
  console.log(`${"codec".padEnd(14)} ${"wire/fp32".padStart(10)} ${"x smaller".padStart(10)} ${"enc ms/MiB".padStart(11)} ${"dec ms/MiB".padStart(11)} ${"enc+EF ms/MiB".padStart(14)}`)
  for (const f of codecFigures({ mib })) {
    console.log(
      `${f.name.padEnd(14)} ${f.bytesOnWireRatio.toFixed(4).padStart(10)} ${(1 / f.bytesOnWireRatio).toFixed(1).padStart(10)} ${f.encodeMsPerMiB.toFixed(3).padStart(11)} ${f.decodeMsPerMiB.toFixed(3).padStart(11)} ${f.encodeWithFeedbackMsPerMiB.toFixed(3).padStart(14)}`
    )
  }
}
