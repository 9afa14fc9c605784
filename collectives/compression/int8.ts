// int8 stochastic quantization (QSGD with 127 levels and a scale per chunk): ~4x. Unbiased:
// q = floor(|x|·127/scale + u), u ~ U[0,1) drawn with 16-bit resolution, so E[q·scale/127] = x up
// to 2^-16 of a step (below fp32's rounding of the decoded value); error <= scale/127 per element.
// The scale is the chunk's max |x|, so one outlier only coarsens its own chunk.
//
// Aggregation: 'allgather'. Quantized values with different scales cannot be summed as bytes: every
// rank gathers every rank's int8 message and decodes all p of them in rank order
// (gradient-reducer.ts). That costs each rank (p-1)·n bytes in instead of ~2n, but quantizes once
// per rank and step, keeps one residual per tensor and gives every rank bitwise the same sum. The
// alternative, a ring whose every hop decodes, adds and re-quantizes (a residual per re-quantizing
// point, keyed per (tensor, ring size, segment): ringSegmentKey), is only modelled
// (simulateRequantizingRing in simulate.ts): its p-1 re-quantizations compound their error.
//
// Wire: header (8) | chunkSize: uint32 | scales: float32[ceil(n/chunkSize)] | q: int8[n].
// Total 12 + 4·ceil(n/chunkSize) + n bytes. A chunk with a NaN or an infinity gets scale NaN and
// decodes to NaN: a diverged gradient stays visible instead of turning into plausible numbers.
import {
  type CompressedMessage,
  type Compressor,
  type EncodeContext,
  HEADER_BYTES,
  bytesOf,
  checkSize,
  checkTarget,
  outBytes,
  outFloats,
  readHeader,
  readU32,
  view,
  writeHeader,
  writeU32
} from "./compressor.ts"
import * as Schema from "effect/Schema"
import { WireDecodeError } from "../../core/errors.ts"
import type { GatherCodec } from "./codec.ts"
import { ErrorFeedbackOption, PositiveInt, SeedOption, defineCodec } from "./registry.ts"
import { hashKey, mixSeed } from "./rng.ts"
import { int8FeedbackSimd, int8SumSimd } from "../simd.ts"

export const INT8_DEFAULT_CHUNK = 4096
const LEVELS = 127

export interface Int8Options {
  readonly chunkSize?: number
  readonly seed?: number
  readonly errorFeedback?: boolean
}

const WIRE = { id: 2, name: "int8" } as const

export class Int8Compressor implements Compressor, GatherCodec {
  readonly name = "int8" as const
  readonly aggregation = "allgather" as const
  readonly errorFeedback: boolean
  readonly chunkSize: number
  readonly seed: number
  private calls = 0

  constructor(options: Int8Options = {}) {
    this.errorFeedback = options.errorFeedback ?? true
    this.chunkSize = options.chunkSize ?? INT8_DEFAULT_CHUNK
    this.seed = options.seed ?? 0
    if (!Number.isInteger(this.chunkSize) || this.chunkSize < 1) throw new RangeError(`int8 chunkSize must be a positive integer, got ${this.chunkSize}`)
  }

  wireBytes(n: number): number {
    return HEADER_BYTES + 4 + 4 * Math.ceil(n / this.chunkSize) + n
  }

  /** The message's bytes with its header and chunk size written, and views of its scales and levels. */
  private message(n: number, out: Uint8Array | undefined): { bytes: Uint8Array; scales: Float32Array; q: Int8Array } {
    const c = this.chunkSize
    const chunks = Math.ceil(n / c)
    const bytes = outBytes(this.wireBytes(n), out)
    writeHeader(bytes, WIRE, n)
    writeU32(bytes, HEADER_BYTES, c)
    return {
      bytes,
      scales: new Float32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES + 4, chunks),
      q: new Int8Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES + 4 + 4 * chunks, n)
    }
  }

  /**
   * The dither's first mulberry32 state for this call. A stream per (seed, rank, step, key): ranks
   * must not share rounding noise, and a rerun (or a restore from checkpoint) reproduces it.
   * Without a step, successive calls differ.
   */
  private stream(ctx: EncodeContext): number {
    const s = mixSeed(this.seed, ctx.rank ?? 0, ctx.step ?? this.calls, ctx.key === undefined ? 0 : hashKey(ctx.key)) | 0
    this.calls++
    return s
  }

  /**
   * Error feedback in one pass: e = f32(e + f32(g·scale)), the message of e, then e -= its decoded
   * values; the same message and residual bits as that compensation, encode(e) and
   * accumulate(message, e, -1). With `e` in a SIMD space (collectives/simd.ts) one kernel does it
   * all a block at a time; otherwise those three steps run as written. `g` is only read.
   */
  encodeFeedback(g: Float32Array, scale: number, e: Float32Array, ctx: EncodeContext = {}, out?: Uint8Array): CompressedMessage {
    if (g.length !== e.length) throw new RangeError(`int8 feedback: gradient has ${g.length} elements, residual ${e.length}`)
    const n = e.length
    const { bytes, scales, q } = this.message(n, out)
    const msg: CompressedMessage = { codec: "int8", length: n, bytes }
    const s = this.stream(ctx)
    if (int8FeedbackSimd(g, scale, e, this.chunkSize, s, q, scales) !== undefined) return msg
    for (let i = 0; i < n; i++) e[i] += Math.fround(g[i] * scale)
    this.quantize(e, s, scales, q)
    this.accumulate(msg, e, -1)
    return msg
  }

  /**
   * into = the sum of the messages' decoded values (all of into's length), added in the order
   * given: what fill(0) and then accumulate(message, into, 1) for each give, bit for bit.
   */
  sumInto(msgs: ReadonlyArray<CompressedMessage | Uint8Array>, into: Float32Array): void {
    const parsed = msgs.map((m) => this.parse(m))
    for (const p of parsed) checkTarget(into, p.n, "int8")
    const c = parsed[0]?.c
    if (c !== undefined && parsed.every((p) => p.c === c) && int8SumSimd(parsed, c, into)) return
    into.fill(0)
    for (const m of msgs) this.accumulate(m, into, 1)
  }

  encode(input: Float32Array, ctx: EncodeContext = {}, out?: Uint8Array): CompressedMessage {
    const { bytes, scales, q } = this.message(input.length, out)
    this.quantize(input, this.stream(ctx), scales, q)
    return { codec: "int8", length: input.length, bytes }
  }

  /** The chunks' scales and the dithered levels of `input`, the dither drawn from mulberry32 state `s` on. */
  private quantize(input: Float32Array, s: number, scales: Float32Array, q: Int8Array): void {
    const n = input.length
    const c = this.chunkSize
    const chunks = Math.ceil(n / c)
    const bits = new Uint32Array(input.buffer, input.byteOffset, n)
    for (let k = 0; k < chunks; k++) {
      const lo = k * c
      const hi = Math.min(n, lo + c)
      let max = 0
      let nan = false
      for (let i = lo; i < hi; i++) {
        const a = Math.abs(input[i])
        if (a > max) max = a
        else if (a !== a) nan = true
      }
      if (nan || max === Infinity) {
        scales[k] = NaN
        q.fill(0, lo, hi)
        continue
      }
      scales[k] = max
      if (max === 0) {
        q.fill(0, lo, hi)
        continue
      }
      const inv = LEVELS / max
      // one mulberry32 draw (inlined: a call per element would dominate) dithers two elements with
      // 16 bits each: the rounding bias left is < 2^-16 of a quantization step, below fp32's own
      // rounding of the decoded value, at half the cost
      let i = lo
      for (; i + 2 <= hi; i += 2) {
        s = (s + 0x6d2b79f5) | 0
        let t = Math.imul(s ^ (s >>> 15), 1 | s)
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
        t ^= t >>> 14
        let v0 = (Math.abs(input[i]) * inv + ((t & 0xffff) + 0.5) * 1.52587890625e-5) | 0
        let v1 = (Math.abs(input[i + 1]) * inv + ((t >>> 16) + 0.5) * 1.52587890625e-5) | 0
        if (v0 > LEVELS) v0 = LEVELS // |x|·inv can round a hair above 127 at the chunk maximum
        if (v1 > LEVELS) v1 = LEVELS
        // branch-free sign from the fp32 sign bit: signs of gradients are coin flips, and a
        // mispredicted branch per element cost more than everything else here together
        const s0 = bits[i] >>> 31
        const s1 = bits[i + 1] >>> 31
        q[i] = (v0 ^ -s0) + s0
        q[i + 1] = (v1 ^ -s1) + s1
      }
      if (i < hi) {
        s = (s + 0x6d2b79f5) | 0
        let t = Math.imul(s ^ (s >>> 15), 1 | s)
        t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t
        let v = (Math.abs(input[i]) * inv + (((t ^ (t >>> 14)) & 0xffff) + 0.5) * 1.52587890625e-5) | 0
        if (v > LEVELS) v = LEVELS
        const sg = bits[i] >>> 31
        q[i] = (v ^ -sg) + sg
      }
    }
  }

  private parse(msg: CompressedMessage | Uint8Array): { n: number; c: number; scales: Float32Array; q: Int8Array } {
    const b = bytesOf(msg)
    const n = readHeader(b, WIRE)
    if (b.byteLength < HEADER_BYTES + 4) throw new WireDecodeError({ reason: "int8 message truncated before its chunk size" })
    const c = readU32(b, HEADER_BYTES)
    if (c < 1) throw new WireDecodeError({ reason: "int8 message has chunk size 0" })
    const chunks = Math.ceil(n / c)
    checkSize(b, HEADER_BYTES + 4 + 4 * chunks + n, "int8")
    const scales = view(Float32Array, b, HEADER_BYTES + 4, chunks)
    const q = new Int8Array(b.buffer, b.byteOffset + HEADER_BYTES + 4 + 4 * chunks, n)
    return { n, c, scales, q }
  }

  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array {
    const { n, c, scales, q } = this.parse(msg)
    const dst = outFloats(n, out)
    for (let k = 0, lo = 0; lo < n; k++, lo += c) {
      const step = scales[k] / LEVELS
      const hi = Math.min(n, lo + c)
      for (let i = lo; i < hi; i++) dst[i] = q[i] * step
    }
    return dst
  }

  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight = 1): void {
    const { n, c, scales, q } = this.parse(msg)
    checkTarget(into, n, "int8")
    for (let k = 0, lo = 0; lo < n; k++, lo += c) {
      const step = scales[k] / LEVELS
      const hi = Math.min(n, lo + c)
      // fround: add exactly the fp32 value decode() would produce, so a residual computed with
      // weight -1 is p - decode(C(p)) to the last bit
      if (weight === 1) for (let i = lo; i < hi; i++) into[i] += Math.fround(q[i] * step)
      else for (let i = lo; i < hi; i++) into[i] += weight * Math.fround(q[i] * step)
    }
  }
}

export const int8Codec = defineCodec({
  name: "int8",
  wireId: WIRE.id,
  aggregation: "allgather",
  hint: "stochastic 8-bit quantization with a scale per chunk, ~4x, unbiased; all-gathered",
  example: { type: "int8" },
  schema: Schema.Struct({ type: Schema.Literal("int8"), chunkSize: Schema.optionalKey(PositiveInt), seed: SeedOption, errorFeedback: ErrorFeedbackOption }),
  create: (c) => new Int8Compressor({ chunkSize: c.chunkSize ?? INT8_DEFAULT_CHUNK, seed: c.seed, errorFeedback: c.errorFeedback }),
  // 32 bits an element become 8, plus 32 bits of scale a chunk
  wireRatio: (c) => 32 / (8 + 32 / (c.chunkSize ?? INT8_DEFAULT_CHUNK))
})
