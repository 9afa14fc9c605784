// Codec cost of each registered compressor (collectives/compression/, each with the config 'auto'
// would use, else its entry's example) and a few more settings: bytes on the wire relative to fp32,
// and encode / decode time per MiB of fp32 gradient, measured here in one run (medians). The
// compression benchmark (`npm run bench -- compression`) puts these next to its all-reduce timings.
// Run alone: node bench/compression-codecs.ts [MiB]
import { fileURLToPath } from "node:url"
import {
  ErrorFeedback,
  PowerSgdCompressor,
  codecs,
  createCompressor,
  type Codec,
  type Compressor,
  type LinearCodec,
  type ResolvedCompressionConfig
} from "../collectives/compression/index.ts"
import { Mulberry32 } from "../collectives/compression/rng.ts"
import { halfFeedbackBits } from "../collectives/float16.ts"
import { simdSpace } from "../collectives/simd.ts"
import { median } from "../scheduler/cost-model.ts"

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

/** A label and config per registered codec: the config 'auto' would switch to, else the entry's example. */
export const benchCodecs = (): Array<{ readonly label: string; readonly config: ResolvedCompressionConfig }> =>
  codecs().map((c) => ({ label: c.name, config: (c.auto?.config ?? c.example) as ResolvedCompressionConfig }))

/** Settings measured besides the registry's: a sparser top-k and PowerSGD at rank 1. */
const EXTRA: ReadonlyArray<{ readonly label: string; readonly config: ResolvedCompressionConfig }> = [
  { label: "topk 0.1%", config: { type: "topk", ratio: 0.001 } },
  { label: "powersgd r1", config: { type: "powersgd", rank: 1, warmupSteps: 0 } }
]

const hasMessages = (c: Codec): c is Codec & Compressor => typeof (c as Partial<Compressor>).encode === "function"

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

/**
 * A linear codec without byte messages, as the reducer runs it: encode = C into its domain vector,
 * decode = D of the sum, encode with error feedback = p = g + e, C(p), e = p - D(C(p)).
 */
const linearFigure = (label: string, c: LinearCodec, g: Float32Array, mib: number, reps: number): CodecFigure => {
  const n = g.length
  const y = new Float32Array(c.domainLength(n))
  const own = new Float32Array(n)
  const e = new Float32Array(n)
  const enc = time(() => c.toDomain(g, y), reps)
  const dec = time(() => c.fromDomain(y, own), reps)
  const withEf = time(() => {
    for (let i = 0; i < n; i++) e[i] += g[i]
    c.toDomain(e, y)
    c.fromDomain(y, own)
    for (let i = 0; i < n; i++) e[i] -= own[i]
  }, reps)
  return { name: label, bytesOnWireRatio: (y.length * (c.wire === "f16" ? 2 : 4)) / (4 * n), encodeMsPerMiB: enc / mib, decodeMsPerMiB: dec / mib, encodeWithFeedbackMsPerMiB: withEf / mib }
}

/**
 * PowerSGD on a square matrix of the gradient's size, p = 1 (the sums are the identity): "encode"
 * is P = MQ, orthonormalize the (identity-)summed P, Q = MᵀP̂; "decode" is P̂Qᵀ; with error feedback
 * add M = G + e and e -= P̂Q_wᵀ.
 */
const powerSgdFigure = (label: string, c: PowerSgdCompressor, M: Float32Array, side: number, reps: number): CodecFigure => {
  const tensors = [{ key: "W", shape: [side, side], grad: M }]
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
  return {
    name: label,
    bytesOnWireRatio: c.wireBytes([side, side]) / (4 * side * side),
    encodeMsPerMiB: enc / m,
    decodeMsPerMiB: dec / m,
    encodeWithFeedbackMsPerMiB: (withEf - dec) / m
  }
}

export const codecFigures = (options: { readonly mib?: number; readonly reps?: number } = {}): CodecFigure[] => {
  const mib = options.mib ?? 16
  const reps = options.reps ?? 5
  const n = (mib * 1024 * 1024) / 4
  const rng = new Mulberry32(42)
  const g = Float32Array.from({ length: n }, () => rng.normal())
  const dense = new Float32Array(n)
  const figures: CodecFigure[] = []
  const side = Math.floor(Math.sqrt(n))
  for (const { label, config } of [...benchCodecs(), ...EXTRA]) {
    const c = createCompressor(config)
    if (c.aggregation === "custom") {
      // PowerSGD's step-by-step form runs it without a group; another custom codec has no figure here
      if (typeof (c as Partial<PowerSgdCompressor>).begin === "function") figures.push(powerSgdFigure(label, c as PowerSgdCompressor, g.subarray(0, side * side), side, reps))
      continue
    }
    if (!hasMessages(c)) {
      if (c.aggregation === "linear") figures.push(linearFigure(label, c, g, mib, reps))
      continue
    }
    const out = new Uint8Array(c.wireBytes(n))
    let step = 0
    const enc = time(() => void c.encode(g, { step: step++ }, out), reps)
    const msg = c.encode(g, { step: 0 })
    // what the reducer does with one message of p (int8: its SIMD sum), else a decode
    const sumInto = c.sumInto?.bind(c)
    const dec = sumInto ? time(() => sumInto([msg], dense), reps) : time(() => void c.decode(msg, dense), reps)
    let withEf: number
    if (c.aggregation === "linear" && c.castsToWire) {
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
    figures.push({ name: label, bytesOnWireRatio: c.wireBytes(n) / (4 * n), encodeMsPerMiB: enc / mib, decodeMsPerMiB: dec / mib, encodeWithFeedbackMsPerMiB: withEf / mib })
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
