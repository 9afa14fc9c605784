// Top-k sparsification (Deep Gradient Compression without momentum correction): keep the k
// largest magnitudes, k = round(ratio·n) (at least 1). Always the exact top-k, ties broken
// towards the lower index, indices ascending; with error feedback the dropped mass stays in the
// residual and is sent later.
//
// Aggregation: 'allgather'. Each rank keeps different indices, so messages cannot be summed
// without decoding; every rank gathers all p messages and accumulates them in rank order.
//
// Wire: header (8) | k: uint32 | values: float32[k] | indices: uint32[k] (strictly ascending).
// Total 12 + 8k bytes.
//
// Speed: for large tensors a DGC-style sampled threshold first narrows the candidates to ~2k in
// one pass, then an exact selection runs on those only; if the sample misjudged (fewer than k or
// too many candidates) it falls back to selection over all n. Both paths give identical output.
import * as Schema from "effect/Schema"
import { WireDecodeError } from "../../core/errors.ts"
import type { GatherCodec } from "./codec.ts"
import { ErrorFeedbackOption, defineCodec } from "./registry.ts"
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
import { kthLargestMagnitude, radixRefine } from "./nth-element.ts"
import { topkCompensateSimd } from "../simd.ts"

export interface TopKOptions {
  /** Fraction of elements kept, in (0, 1]. */
  readonly ratio: number
  readonly errorFeedback?: boolean
  /** Use the sampled threshold above this many elements (exactness is unaffected). */
  readonly sampleAbove?: number
}

const SAMPLE_SIZE = 8192
/** Histogram of select's radix passes (2^11 buckets), reused. */
const SELECT_HIST = new Uint32Array(2048)
/** select's finer counting passes, after the top 11 bits: bits 10..20, then 0..9. */
const LOW_BITS: ReadonlyArray<readonly [number, number]> = [
  [10, 11],
  [0, 10]
]
/** Elements per block of sumInto (64 KiB of fp32: stays in L2 while the messages are added). */
const SUM_BLOCK = 16384

export const topkCount = (ratio: number, n: number): number => (n === 0 ? 0 : Math.min(n, Math.max(1, Math.round(ratio * n))))

const WIRE = { id: 3, name: "topk" } as const

export class TopKCompressor implements Compressor, GatherCodec {
  readonly name = "topk" as const
  readonly aggregation = "allgather" as const
  readonly errorFeedback: boolean
  readonly ratio: number
  readonly sampleAbove: number
  private mags = new Float32Array(0)
  private cand = new Uint32Array(0)
  /** The candidates' values, beside their indices (so selection never gathers from the tensor). */
  private candVals = new Float32Array(0)
  /** select's elements in the bucket of the k-th largest. */
  private bucket = new Uint32Array(0)
  /** How often the sampled path had to fall back to a full selection (for tests and tuning). */
  fallbacks = 0

  constructor(options: TopKOptions) {
    if (!(options.ratio > 0 && options.ratio <= 1)) throw new RangeError(`top-k ratio must be in (0, 1], got ${options.ratio}`)
    this.ratio = options.ratio
    this.errorFeedback = options.errorFeedback ?? true
    this.sampleAbove = options.sampleAbove ?? 1 << 16
  }

  k(n: number): number {
    return topkCount(this.ratio, n)
  }

  wireBytes(n: number): number {
    return HEADER_BYTES + 4 + 8 * this.k(n)
  }

  encode(input: Float32Array, _ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const n = input.length
    const k = this.k(n)
    const { bytes, values, indices } = this.message(n, k, out)
    if (k === n) {
      for (let i = 0; i < n; i++) indices[i] = i
      values.set(input)
    } else if (!(this.samples(n, k) && this.sampled(input, k, values, indices))) {
      this.full(input, k, values, indices)
    }
    return { codec: "topk", length: n, bytes }
  }

  /** The message's bytes with its header and count written, and views of its value and index arrays. */
  private message(n: number, k: number, out: Uint8Array | undefined): { bytes: Uint8Array; values: Float32Array; indices: Uint32Array } {
    const bytes = outBytes(this.wireBytes(n), out)
    writeHeader(bytes, WIRE, n)
    writeU32(bytes, HEADER_BYTES, k)
    return {
      bytes,
      values: new Float32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES + 4, k),
      indices: new Uint32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES + 4 + 4 * k, k)
    }
  }

  /** Whether selecting k of n goes through the sampled threshold (large n, k a small fraction). */
  private samples(n: number, k: number): boolean {
    return n > this.sampleAbove && k * 16 <= n
  }

  private scratch(n: number): Float32Array {
    if (this.mags.length < n) this.mags = new Float32Array(Math.max(n, this.mags.length * 2))
    return this.mags
  }

  /** Exact selection over all n elements. */
  private full(x: Float32Array, k: number, values: Float32Array, indices: Uint32Array): void {
    this.select(x, x.length, undefined, k, values, indices)
  }

  /**
   * Error feedback for top-k in one pass over the bucket, for the gradient reducer:
   * e = f32(e + f32(g·scale)) (the compensated p) and the message C(p), the same bytes `encode(e)`
   * would give afterwards; `g` is only read. The sampled threshold is taken from p computed on the
   * fly at the sample positions, so the candidates are collected while the residual is written;
   * one pass instead of two (compensate, scan).
   */
  encodeCompensated(g: Float32Array, scale: number, e: Float32Array, _ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const n = g.length
    if (e.length !== n) throw new RangeError(`top-k: residual has ${e.length} elements, gradient ${n}`)
    const k = this.k(n)
    if (k === n || !this.samples(n, k)) {
      for (let i = 0; i < n; i++) e[i] += Math.fround(g[i] * scale)
      return this.encode(e, _ctx, out)
    }
    const { bytes, values, indices } = this.message(n, k, out)
    const tauS = this.sampleThreshold(n, k, (i) => Math.fround(e[i] + Math.fround(g[i] * scale)))
    const cap = this.candidates(k)
    const cand = this.cand
    const vals = this.candVals
    // the kernel when the residual lives in SIMD memory (then it is updated in place), else JS
    const simd = topkCompensateSimd(g, scale, e, tauS, cand.subarray(0, cap), vals.subarray(0, cap))
    let count = Math.max(0, simd)
    for (let i = simd >= 0 ? n : 0; i < n; i++) {
      const p = Math.fround(e[i] + Math.fround(g[i] * scale))
      e[i] = p
      const a = Math.abs(p)
      if (a >= tauS || a !== a) {
        if (count < cap) {
          cand[count] = i
          vals[count] = p
        }
        count++
      }
    }
    if (count < k || count > cap) {
      // the sample misjudged: select over all of e (compensated by now)
      this.fallbacks++
      this.full(e, k, values, indices)
    } else {
      this.fromCandidates(k, count, values, indices)
    }
    return { codec: "topk", length: n, bytes }
  }

  /**
   * The whole error-feedback step for the gradient reducer: `encodeCompensated`, then the residual
   * keeps what was not sent, e -= D(C(p)) from this message (the same bits as
   * `accumulate(msg, e, -1)`: each sent value v is e's own value there, so e - v is v - v, which
   * needs no read of e and no parse of the message). `g` is only read.
   */
  encodeFeedback(g: Float32Array, scale: number, e: Float32Array, ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const msg = this.encodeCompensated(g, scale, e, ctx, out)
    const k = readU32(msg.bytes, HEADER_BYTES)
    const values = view(Float32Array, msg.bytes, HEADER_BYTES + 4, k)
    const indices = view(Uint32Array, msg.bytes, HEADER_BYTES + 4 + 4 * k, k)
    for (let j = 0; j < k; j++) {
      const v = values[j]
      e[indices[j]] = v - v
    }
    return msg
  }

  /** The magnitude aimed at ~2k candidates, from a strided sample of `at(i)`. */
  private sampleThreshold(n: number, k: number, at: (i: number) => number): number {
    const m = this.scratch(SAMPLE_SIZE)
    const stride = n / SAMPLE_SIZE
    for (let s = 0; s < SAMPLE_SIZE; s++) {
      const a = Math.abs(at(Math.floor(s * stride)))
      m[s] = a === a ? a : Infinity
    }
    const want = Math.min(SAMPLE_SIZE, Math.ceil((2 * k * SAMPLE_SIZE) / n) + 8)
    return kthLargestMagnitude(m, SAMPLE_SIZE, want)
  }

  /**
   * Threshold from a strided sample, aimed at ~2k candidates so that landing below k is unlikely;
   * then exact selection among the candidates. Returns false when the caller must fall back.
   */
  private sampled(x: Float32Array, k: number, values: Float32Array, indices: Uint32Array): boolean {
    const n = x.length
    const tauS = this.sampleThreshold(n, k, (i) => x[i])
    const cap = this.candidates(k)
    const cand = this.cand
    const vals = this.candVals
    let count = 0
    for (let i = 0; i < n; i++) {
      const v = x[i]
      const a = Math.abs(v)
      if (a >= tauS || a !== a) {
        if (count === cap) {
          this.fallbacks++
          return false
        }
        vals[count] = v
        cand[count++] = i
      }
    }
    if (count < k) {
      this.fallbacks++
      return false
    }
    this.fromCandidates(k, count, values, indices)
    return true
  }

  /**
   * Room for the candidates of a sampled selection of k (the threshold aims at ~2k; past this many
   * the sample misjudged and the caller falls back); returns that capacity.
   */
  private candidates(k: number): number {
    const cap = 4 * k + 64
    if (this.cand.length < cap) {
      this.cand = new Uint32Array(cap)
      this.candVals = new Float32Array(cap)
    }
    return cap
  }

  /**
   * Exact top-k given the candidates (indices cand[0..count) ascending with their values in
   * candVals; count >= k; every element at or above the true k-th magnitude among them): the
   * same tie rule and order as `full`.
   */
  private fromCandidates(k: number, count: number, values: Float32Array, indices: Uint32Array): void {
    this.select(this.candVals, count, this.cand, k, values, indices)
  }

  /**
   * The k largest magnitudes among x[0..count), NaN counting as largest, ties to the lower
   * position, in position order: their values to `values` and their indices (`at[j]` for position
   * j, or j itself without `at`) to `indices`.
   *
   * A radix select on the magnitudes' bits (they order as the magnitudes do; every NaN is given
   * the bits just above +Infinity's): one pass writes the bits and counts their top 11, only the
   * elements in the bucket that holds the k-th are kept for the two finer counts, and a last pass
   * writes out. Three passes over x instead of six.
   */
  private select(x: Float32Array, count: number, at: Uint32Array | undefined, k: number, values: Float32Array, indices: Uint32Array): void {
    const xb = new Uint32Array(x.buffer, x.byteOffset, count)
    const m = this.scratch(count)
    const u = new Uint32Array(m.buffer, m.byteOffset, count)
    const hist = SELECT_HIST
    hist.fill(0)
    for (let j = 0; j < count; j++) {
      let v = xb[j] & 0x7fffffff
      if (v > 0x7f800000) v = 0x7f800001
      u[j] = v
      hist[v >>> 21]++
    }
    // the bucket of the k-th largest; `want`: its rank among that bucket's elements, from the top
    let b = 2047
    let want = k
    while (hist[b] < want) want -= hist[b--]
    const inBucket = hist[b]
    if (this.bucket.length < inBucket) this.bucket = new Uint32Array(Math.max(inBucket, this.bucket.length * 2))
    const sub = this.bucket
    let s = 0
    for (let j = 0; j < count; j++) if (u[j] >>> 21 === b) sub[s++] = u[j]
    // bits 10..20, then 0..9, among the elements that share the bits found so far
    const found = radixRefine(sub, s, LOW_BITS, (b << 21) >>> 0, 0xffe00000, want)
    const tau = found.prefix
    // `found.want` is how many elements equal to the k-th are taken (the lowest positions)
    let ties = found.want
    let o = 0
    for (let j = 0; j < count && o < k; j++) {
      const v = u[j]
      if (v > tau || (v === tau && ties-- > 0)) {
        values[o] = x[j]
        indices[o++] = at ? at[j] : j
      }
    }
  }

  private parse(msg: CompressedMessage | Uint8Array): { n: number; values: Float32Array; indices: Uint32Array } {
    const b = bytesOf(msg)
    const n = readHeader(b, WIRE)
    if (b.byteLength < HEADER_BYTES + 4) throw new WireDecodeError({ reason: "top-k message truncated before its count" })
    const k = readU32(b, HEADER_BYTES)
    if (k > n) throw new WireDecodeError({ reason: `top-k message claims ${k} of ${n} elements` })
    checkSize(b, HEADER_BYTES + 4 + 8 * k, "topk")
    const values = view(Float32Array, b, HEADER_BYTES + 4, k)
    const indices = view(Uint32Array, b, HEADER_BYTES + 4 + 4 * k, k)
    let prev = -1
    for (let j = 0; j < k; j++) {
      const i = indices[j]
      if (i <= prev || i >= n) throw new WireDecodeError({ reason: `top-k index ${i} at position ${j} is out of order or beyond ${n}` })
      prev = i
    }
    return { n, values, indices }
  }

  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array {
    const { n, values, indices } = this.parse(msg)
    const dst = outFloats(n, out)
    dst.fill(0)
    for (let j = 0; j < indices.length; j++) dst[indices[j]] = values[j]
    return dst
  }

  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight = 1): void {
    const { n, values, indices } = this.parse(msg)
    checkTarget(into, n, "topk")
    if (weight === 1) for (let j = 0; j < indices.length; j++) into[indices[j]] += values[j]
    else for (let j = 0; j < indices.length; j++) into[indices[j]] += weight * values[j]
  }

  /**
   * into = the sum of the messages (zero where none has an entry): the same values as
   * `into.fill(0)` then `accumulate(msgs[r], into)` for r in order, in one pass over `into`. It
   * goes block by block (64 KiB), zeroing a block and adding each message's entries that fall in
   * it while the block is in cache, instead of a pass that zeroes the whole buffer and one
   * scattered pass per message. Every message is checked before anything is written.
   */
  sumInto(msgs: ReadonlyArray<CompressedMessage | Uint8Array>, into: Float32Array): void {
    const parsed = msgs.map((m) => this.parse(m))
    for (const p of parsed) checkTarget(into, p.n, "topk")
    const next = new Uint32Array(parsed.length)
    for (let lo = 0; lo < into.length; lo += SUM_BLOCK) {
      const hi = Math.min(into.length, lo + SUM_BLOCK)
      into.fill(0, lo, hi)
      for (let r = 0; r < parsed.length; r++) {
        const { values, indices } = parsed[r]
        let j = next[r]
        for (; j < indices.length && indices[j] < hi; j++) into[indices[j]] += values[j]
        next[r] = j
      }
    }
  }
}

/** 'auto' weighs top-k at this density. */
const AUTO_DENSITY = 0.01

export const topkCodec = defineCodec({
  name: "topk",
  wireId: WIRE.id,
  aggregation: "allgather",
  hint: "keeps the k = ratio·n largest magnitudes (values + indices), 1% is ~50x; all-gathered",
  example: { type: "topk", ratio: 0.01 },
  schema: Schema.Struct({
    type: Schema.Literal("topk"),
    ratio: Schema.Finite.check(Schema.isGreaterThan(0), Schema.isLessThanOrEqualTo(1)),
    errorFeedback: ErrorFeedbackOption
  }),
  create: (c) => new TopKCompressor({ ratio: c.ratio, errorFeedback: c.errorFeedback }),
  auto: { order: 2, config: { type: "topk", ratio: AUTO_DENSITY } },
  // values + int32 indices
  wireRatio: (c) => 1 / (2 * c.ratio)
})
