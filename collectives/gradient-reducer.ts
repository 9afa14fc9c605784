// Reduces one step's gradients across the group: the flat gradient (every variable back to back,
// in a stable order) is cut into buckets, contiguous ranges of it, so a bucket needs no packing
// copy; each bucket is all-reduced (or, for codecs that cannot be summed on the wire, all-gathered
// and decoded) as soon as the previous ones are under way, a few in flight at once.
//
// The result is the weighted mean sum_i w_i g_i / sum_i w_i (w_i: rank i's sample count), the
// large-batch SGD gradient. Uncompressed buckets use the communicator's weightedMean; compressed
// ones scale the local gradient by w_i / W first (W from one tiny all-reduce per step), so error
// feedback sees exactly what is sent.
//
// The path is the aggregation the codec declares (compression/codec.ts), never its name:
//   none      the plain fp32 weighted-mean all-reduce.
//   linear    castsToWire (fp16): all-reduce with binary16 on the wire. On a ring, error feedback is
//             folded into it (FeedbackHalfSource): a rank casts only the segment it sends first,
//             p = g·(w/W) + e, residual e = p - half(p); as a relay or owner it adds f32(g·(w/W))
//             into the partial sum at fp32, with no cast of its own, so its residual is nonzero on
//             that one segment only. Other algorithms: every rank casts all of p with its residual,
//             then reduces the bits.
//             Otherwise: y = C(p) into a domain buffer kept per bucket, e = p - D(y), a sum
//             all-reduce of y (fp32 or binary16 on the wire, as the codec says), result D(Σ y).
//   allgather (int8, topk, sign): all-gather of every rank's message; each rank decodes all of them
//             in rank order (so every rank gets bitwise the same sum).
//   custom    (PowerSGD): the codec's own rounds of fp32 sum all-reduces, per variable.
import type { AllReduceAlgorithm, Communicator } from "./communicator.ts"
import { planBuckets, DEFAULT_BUCKET_BYTES, DEFAULT_FIRST_BUCKET_BYTES } from "./bucketing.ts"
import { addScaledIntoHalf, halfFeedbackBits, roundToHalf } from "./float16.ts"
import { scale } from "./kernels.ts"
import type { HalfSource } from "./algorithms/ring.ts"
import { findAllReduceAlgorithm } from "./algorithms/registry.ts"
import { inSimdSpace, simdSpace } from "./simd.ts"
import {
  CodecContractError,
  createCompressor,
  ErrorFeedback,
  type Codec,
  type CustomCodec,
  type ResolvedCompressionConfig
} from "./compression/index.ts"

export interface GradientSlotInfo {
  readonly name: string
  readonly shape: ReadonlyArray<number>
  readonly offset: number
  readonly size: number
}

/** How one call goes: its algorithm, and its data path (absent: the communicator's choice by size). */
export interface Route {
  readonly algorithm: AllReduceAlgorithm
  readonly transport?: "nats" | "direct"
}

/** A route's name in timings and timelines: "tree", or "tree/nats" when the call names its path. */
export const routeName = (r: Route): string => (r.transport === undefined ? r.algorithm : `${r.algorithm}/${r.transport}`)

/** A route's path as a call option: none when it leaves the path to the communicator. */
const pathOf = (r: Route): { readonly transport?: "nats" | "direct" } => (r.transport === undefined ? {} : { transport: r.transport })

export interface GradientReducerOptions {
  /** A fixed algorithm, or a function choosing one per bucket size in bytes. */
  readonly algorithm: AllReduceAlgorithm | ((bytes: number) => AllReduceAlgorithm)
  /**
   * Per bucket size, the algorithm and the data path together (in place of `algorithm`): what a
   * tuner that times both paths uses. Called once per call, so it may hand out a schedule.
   */
  readonly route?: (bytes: number) => Route
  readonly compression?: ResolvedCompressionConfig
  /** binary16 on the wire for uncompressed buckets. */
  readonly wire?: "f32" | "f16"
  readonly bucketBytes?: number
  readonly firstBucketBytes?: number
  readonly maxInFlight?: number
  /** Timing of each bucket's reduction (for the timeline). */
  readonly onBucket?: (info: { bucket: number; bytes: number; algorithm: string; startMs: number; endMs: number; encodeMs: number }) => void
}

/** Residuals, and the state of a codec that keeps its own (PowerSGD: under "powersgd"), for a checkpoint. */
export interface ReducerState {
  readonly residuals: Record<string, Float32Array>
  readonly [codec: string]: unknown
}

export interface ReducerStats {
  /** Bytes this rank put on the wire for gradients in the last step (its own messages). */
  readonly wireBytes: number
  /** What the same step would send uncompressed (fp32). */
  readonly denseBytes: number
  readonly steps: number
  readonly totalWireBytes: number
  readonly totalDenseBytes: number
}

/** Residuals at least this long go to SIMD memory (see GradientReducer's #residualStorage). */
const SPACE_MIN_ELEMENTS = 1 << 20

/**
 * Smallest gradient that gets a space of its own (gradientBuffer): a space carries 2 MiB of
 * scratch, and below this the copies it saves are too small to notice.
 */
const GRADIENT_SPACE_MIN_ELEMENTS = 1 << 14

/**
 * The gradient buffer the reducer hands out (gradientBuffer), in one SIMD space with an arena for
 * the error-feedback residuals and fp16 message bits: the kernels then read the gradient and
 * write the result in place, where a gradient outside the space streams through scratch blocks.
 */
interface GradientSpace {
  readonly flat: Float32Array
  readonly arena: Float32Array
  used: number
  /** Arena regions by key, kept for the key when its residual is dropped and made again. */
  readonly regions: Map<string, Float32Array>
}

interface Range {
  readonly start: number
  readonly end: number
}

/**
 * Where an fp16 bucket's residual may be nonzero after a step that folded error feedback into the
 * ring: [lo, hi), valid for that residual array while the store's version is unchanged.
 */
interface NonzeroHint {
  readonly e: Float32Array
  readonly version: number
  readonly lo: number
  readonly hi: number
}

/**
 * fp16 error feedback folded into a ring all-reduce: the ring asks for this rank's values as it
 * needs them (ring.ts's HalfSource), over the gradient `g` (the all-reduce's own buffer).
 * - The segment this rank sends first, chunk by chunk just before it goes out: p = f32(g·s) + e,
 *   send half(p), e = p - value (halfFeedbackBits). This is the rank's one cast of its own values.
 * - A relay or the segment's owner: the message += f32(g·s) at fp32, rounded to binary16 to go on
 *   (addScaledIntoHalf; the owner writes the rounded values over g in the same pass), as a hop
 *   rounds any partial sum; no cast of the rank's own values, so
 *   nothing for its residual. Where the residual may still hold something (`nonzero`: from a
 *   checkpoint, or a step that cast another segment) it is added in and spent, e = 0.
 * So a step reads and writes the residual on about 1/p of the bucket instead of all of it, and the
 * first chunk goes out after one chunk's cast instead of the whole bucket's.
 */
class FeedbackHalfSource implements HalfSource {
  /** The range cast this call (where the residual is nonzero afterwards); empty as it starts. */
  lo = Number.POSITIVE_INFINITY
  hi = Number.NEGATIVE_INFINITY
  encodeMs = 0
  readonly #g: Float32Array
  readonly #e: Float32Array
  readonly #s: number
  readonly #out: Uint16Array
  readonly #nonzero: { readonly lo: number; readonly hi: number }

  constructor(g: Float32Array, e: Float32Array, s: number, out: Uint16Array, nonzero: { readonly lo: number; readonly hi: number }) {
    this.#g = g
    this.#e = e
    this.#s = s
    this.#out = out
    this.#nonzero = nonzero
  }

  #mayHold(off: number, n: number): boolean {
    return off < this.#nonzero.hi && off + n > this.#nonzero.lo
  }

  bits(off: number, n: number): Uint8Array {
    const t0 = performance.now()
    const out = this.#out.subarray(off, off + n)
    halfFeedbackBits(this.#g.subarray(off, off + n), this.#e.subarray(off, off + n), this.#s, out)
    this.lo = Math.min(this.lo, off)
    this.hi = Math.max(this.hi, off + n)
    this.encodeMs += performance.now() - t0
    return new Uint8Array(out.buffer, out.byteOffset, n * 2)
  }

  addInto(h: Uint16Array, off: number, n: number, final: boolean): void {
    addScaledIntoHalf(this.#g.subarray(off, off + n), this.#s, this.#mayHold(off, n) ? this.#e.subarray(off, off + n) : undefined, h, final)
  }

  load(off: number, n: number): void {
    const g = this.#g
    if (!this.#mayHold(off, n)) return scale(g, off, n, this.#s)
    const e = this.#e
    for (let i = off; i < off + n; i++) {
      g[i] = Math.fround(g[i] * this.#s) + e[i]
      e[i] = 0
    }
  }
}

/** The codec a config makes, or undefined for one that compresses nothing (its aggregation is 'none'). */
const codecFor = (config: ResolvedCompressionConfig): Codec | undefined => {
  const codec = createCompressor(config)
  return codec.aggregation === "none" ? undefined : codec
}

export class GradientReducer {
  readonly comm: Communicator
  /** Undefined when nothing is compressed. Switchable once (compression 'auto' decides after warm-up): see setCompression. */
  compressor: Codec | undefined
  readonly ef = new ErrorFeedback()
  readonly #opts: GradientReducerOptions
  #plan: { key: string; buckets: Range[] } | undefined
  readonly #gather = new Map<number, { words: Float32Array; gathered: Float32Array }>()
  /** A linear codec's domain vector and this rank's decoded message, per bucket. */
  readonly #linear = new Map<number, { domain: Float32Array; own: Float32Array }>()
  readonly #half = new Map<number, Uint16Array>()
  /** fp16 buckets' residuals: where they may be nonzero (FeedbackHalfSource). */
  readonly #nonzero = new Map<string, NonzeroHint>()
  #space: GradientSpace | undefined
  /** gradientBuffer's answer for an uncompressed gradient of n floats, decided once per n. */
  #plain: { n: number; buf: Float32Array | undefined } | undefined
  #stats = { wireBytes: 0, denseBytes: 0, steps: 0, totalWireBytes: 0, totalDenseBytes: 0 }

  constructor(comm: Communicator, opts: GradientReducerOptions) {
    this.comm = comm
    this.#opts = opts
    this.compressor = codecFor(opts.compression ?? "none")
    this.ef.allocate = (key, n) => this.#residualStorage(key, n)
  }

  /**
   * A buffer for the flat gradient of `n` elements that this reducer works on in place, like DDP's
   * gradient_as_bucket_view: pass it to reduceGradients filled with this step's gradient. It
   * shares a SIMD space with the residuals and fp16 messages, so error feedback reads the gradient
   * and writes the aggregate without copying them through scratch blocks (PowerSGD rank 4 on
   * 4 x [4096 x 1024], one process, with its correction paid in the next pass: 42 -> 33 ms per
   * step). Uncompressed, on a group with direct links, it comes from Communicator.allocate: the
   * ring reads its received frames into slots beside it and sums them in place. Undefined when
   * nothing would gain: a compressor without error feedback, uncompressed without a direct link,
   * a small gradient, or no SIMD. The same buffer comes back on every call with the same n;
   * reduceGradients accepts any other Float32Array too.
   */
  gradientBuffer(n: number): Float32Array | undefined {
    if (this.#space?.flat.length === n) return this.#space.flat
    const c = this.compressor
    if (c === undefined) return this.#plainBuffer(n)
    if (!c.errorFeedback || n < GRADIENT_SPACE_MIN_ELEMENTS || this.#space !== undefined) return undefined
    // residuals of at most n floats in all (one per bucket or per variable), the fp16 bits of
    // every bucket (n/2 floats), and 16-byte alignment for each region
    const made = simdSpace([n, n + Math.ceil(n / 2) + 4096])
    if (!made) return undefined
    this.#space = { flat: made[0], arena: made[1], used: 0, regions: new Map() }
    // residuals made before (restored from a checkpoint, say) and fp16 messages move into the arena
    if (this.ef.size > 0) this.ef.restore(this.ef.state())
    this.#half.clear()
    return made[0]
  }

  /**
   * The uncompressed gradient's buffer (gradientBuffer), decided once per length: the worker asks
   * on every step, and neither the links' survey nor a dropped allocation belongs in each one.
   */
  #plainBuffer(n: number): Float32Array | undefined {
    if (this.#plain?.n === n) return this.#plain.buf
    this.#plain = { n, buf: this.#makePlainBuffer(n) }
    return this.#plain.buf
  }

  #makePlainBuffer(n: number): Float32Array | undefined {
    const comm = this.comm as Communicator | undefined
    if (comm === undefined || n < GRADIENT_SPACE_MIN_ELEMENTS || !comm.transport.links.some((l) => l.via !== "nats")) return undefined
    const made = comm.allocate(n)
    return inSimdSpace(made) ? made : undefined
  }

  /** A zeroed region of the gradient space's arena for `key`, or undefined when it is full. */
  #arena(key: string, n: number): Float32Array | undefined {
    const sp = this.#space
    if (!sp) return undefined
    let r = sp.regions.get(key)
    if (r?.length === n) return r.fill(0)
    if (sp.used + n > sp.arena.length) return undefined
    r = sp.arena.subarray(sp.used, sp.used + n)
    sp.used += Math.ceil(n / 4) * 4
    sp.regions.set(key, r)
    return r
  }

  /**
   * Large residuals live in SIMD memory (collectives/simd.ts: a kernel instance's own memory),
   * where the fused error-feedback kernels of top-k and PowerSGD update them in place; a kernel
   * then reads each element once instead of through a copy (PowerSGD's three passes: 62 -> 49 ms
   * on a 4096 x 4096 matrix, one process). Once gradientBuffer has made the gradient space, every
   * residual goes to its arena while it has room, so the gradient is read in place as well.
   * Otherwise small residuals, or all without SIMD, are ordinary arrays: a space carries 2 MiB of
   * scratch.
   */
  #residualStorage(key: string, n: number): Float32Array {
    return this.#arena(key, n) ?? (n >= SPACE_MIN_ELEMENTS ? simdSpace([n])?.[0] : undefined) ?? new Float32Array(n)
  }

  /**
   * Switches the compressor between steps (every rank at the same step, or they disagree on the
   * wire format). Error-feedback residuals are kept as they are, not reset: a switch after
   * uncompressed steps (compression "auto" makes one) finds none unless a checkpoint restored
   * some, and a switch between codecs hands one codec's residuals to the next.
   */
  setCompression(c: ResolvedCompressionConfig): void {
    this.compressor = codecFor(c)
  }

  get stats(): ReducerStats {
    return { ...this.#stats }
  }

  #route(bytes: number): Route {
    if (this.#opts.route) return this.#opts.route(bytes)
    const a = this.#opts.algorithm
    return { algorithm: typeof a === "function" ? a(bytes) : a }
  }

  #buckets(layout: ReadonlyArray<GradientSlotInfo>): Range[] {
    const key = layout.map((s) => s.size).join(",")
    if (this.#plan?.key === key) return this.#plan.buckets
    const plan = planBuckets(
      layout.map((s) => s.size),
      this.#opts.bucketBytes ?? DEFAULT_BUCKET_BYTES,
      this.#opts.firstBucketBytes ?? DEFAULT_FIRST_BUCKET_BYTES
    )
    const buckets = plan.map((b) => {
      const start = layout[b.vars[0]].offset
      return { start, end: start + b.length }
    })
    this.#plan = { key, buckets }
    return buckets
  }

  /**
   * Reduces `flat` in place to the weighted mean over ranks. `scope` names the vector when one
   * reducer takes several (local SGD's fragments): each scope's buckets keep residuals of their own.
   * `holder`: every rank knows that only this rank's weight is above 0 (adaptive batching gave the
   * others no rows), so the mean is its gradient: without compression it is sent from there
   * (a broadcast per bucket), and the holder goes on without waiting for the others' zeros.
   */
  async reduceGradients(flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, weight: number, step: number, scope?: string, holder?: number): Promise<void> {
    const dense = flat.length * 4
    let wire = 0
    if (this.comm.worldSize === 1) {
      // Nothing to exchange; compression would only add error.
    } else if (holder !== undefined && this.compressor === undefined && Number.isInteger(holder) && holder >= 0 && holder < this.comm.worldSize) {
      wire = await this.#fromHolder(flat, layout, holder)
    } else if (this.compressor?.aggregation === "custom") {
      wire = await this.#custom(this.compressor, flat, layout, weight)
    } else {
      const scaleBy = this.compressor ? weight / (await this.#totalWeight(weight)) : 1
      const sent = await this.#eachBucket(flat, layout, (k, data) => this.#bucket(k, data, weight, scaleBy, step, scope))
      wire = sent.reduce((a, b) => a + b, 0)
    }
    const s = this.#stats
    s.wireBytes = wire
    s.denseBytes = dense
    s.steps++
    s.totalWireBytes += wire
    s.totalDenseBytes += dense
  }

  /** `run` over `flat`'s buckets, up to maxInFlight at once; what each returned, in bucket order. */
  async #eachBucket<T>(flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, run: (k: number, data: Float32Array) => Promise<T>): Promise<T[]> {
    const buckets = this.#buckets(layout)
    const maxInFlight = Math.max(1, this.#opts.maxInFlight ?? 2)
    let next = 0
    const out: T[] = []
    const worker = async (): Promise<void> => {
      while (next < buckets.length) {
        const k = next++
        out[k] = await run(k, flat.subarray(buckets[k]!.start, buckets[k]!.end))
      }
    }
    await Promise.all(Array.from({ length: Math.min(maxInFlight, buckets.length) }, worker))
    return out
  }

  /** The holder's gradient to every rank, bucket by bucket; the bytes one rank sends or takes. */
  async #fromHolder(flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, holder: number): Promise<number> {
    const f16 = this.#opts.wire === "f16"
    // (The communicator's path by size: a route may be a tuner's schedule of all-reduces.)
    await this.#eachBucket(flat, layout, (_, data) => this.comm.broadcast(data, holder, f16 ? { wire: "f16" } : {}))
    return flat.length * (f16 ? 2 : 4)
  }

  async #totalWeight(weight: number): Promise<number> {
    const w = Float32Array.of(weight)
    await this.comm.allReduce(w, { op: "sum", algorithm: "tree" })
    return w[0] > 0 ? w[0] : 1
  }

  async #bucket(k: number, data: Float32Array, weight: number, scaleBy: number, step: number, scope?: string): Promise<number> {
    const startMs = performance.now()
    const route = this.#route(data.length * 4)
    const algorithm = route.algorithm
    const via = pathOf(route)
    const c = this.compressor
    let encodeMs = 0
    let bytes: number
    if (!c) {
      const f16 = this.#opts.wire === "f16"
      await this.comm.allReduce(data, { op: "weightedMean", weight, algorithm, wire: f16 ? "f16" : "f32", ...via })
      bytes = data.length * (f16 ? 2 : 4)
    } else {
      const key = scope === undefined ? `bucket${k}` : `${scope}.bucket${k}`
      if (c.aggregation === "linear" && c.castsToWire) {
        // fp16: p = g·(w/W) + e is sent as binary16; the residual keeps what rounding dropped.
        // One fused pass over the bucket (scaling, residual update, rounding and the encode)
        // writes the message's bits, which the all-reduce sends and adds as they are; the
        // gradient is only read, then overwritten with the result.
        const t0 = performance.now()
        if (c.errorFeedback && findAllReduceAlgorithm(algorithm)?.takesHalfSource === true) {
          // error feedback inside the algorithm (the ring's FeedbackHalfSource): cast only the segment sent first
          const fresh = !this.ef.has(key)
          const e = this.ef.residual(key, data.length)
          const hint = this.#nonzero.get(key)
          const known = hint !== undefined && hint.e === e && hint.version === this.ef.version
          const src = new FeedbackHalfSource(data, e, scaleBy, this.#halfBuffer(k, data.length), fresh ? { lo: 0, hi: 0 } : known ? hint : { lo: 0, hi: data.length })
          // until this step completes, anything may be anywhere
          this.#nonzero.delete(key)
          await this.comm.allReduce(data, { op: "sum", algorithm, wire: "f16", halfSource: src, ...via })
          this.#nonzero.set(key, { e, version: this.ef.version, lo: src.lo, hi: src.hi })
          encodeMs = src.encodeMs
        } else {
          let halfInput: Uint16Array | undefined
          if (c.errorFeedback) {
            halfInput = this.#halfBuffer(k, data.length)
            halfFeedbackBits(data, this.ef.residual(key, data.length), scaleBy, halfInput)
          } else {
            scale(data, 0, data.length, scaleBy)
          }
          encodeMs = performance.now() - t0
          await this.comm.allReduce(data, { op: "sum", algorithm, wire: "f16", halfInput, ...via })
        }
        bytes = data.length * 2
      } else if (c.aggregation === "linear") {
        const t0 = performance.now()
        const bufs = this.#linearBuffers(k, data.length, c.domainLength(data.length))
        const ctx = { step, rank: this.comm.rank, key }
        if (c.errorFeedback) {
          // p = g·(w/W) + e in the residual; y = C(p) as it travels; e = p - D(y)
          const e = this.ef.residual(key, data.length)
          for (let i = 0; i < data.length; i++) e[i] += Math.fround(data[i] * scaleBy)
          c.toDomain(e, bufs.domain, ctx)
          if (c.wire === "f16") roundToHalf(bufs.domain)
          c.fromDomain(bufs.domain, bufs.own)
          for (let i = 0; i < data.length; i++) e[i] -= bufs.own[i]
        } else {
          scale(data, 0, data.length, scaleBy)
          c.toDomain(data, bufs.domain, ctx)
        }
        encodeMs = performance.now() - t0
        await this.comm.allReduce(bufs.domain, { op: "sum", algorithm, wire: c.wire, ...via })
        c.fromDomain(bufs.domain, data)
        bytes = bufs.domain.length * (c.wire === "f16" ? 2 : 4)
      } else if (c.aggregation === "allgather") {
        const t0 = performance.now()
        const n = c.wireBytes(data.length)
        // The message travels as float32 words (padded to a multiple of 4 bytes); message and
        // gather buffers are kept per bucket, so a step allocates nothing large.
        const bufs = this.#gatherBuffers(k, Math.ceil(n / 4))
        const out = new Uint8Array(bufs.words.buffer, 0, n)
        let msg
        if (c.errorFeedback) {
          // ErrorFeedback.compress with the w/W scaling folded into its p = g + e pass:
          // e += g·(w/W); send C(e); e -= D(C(e)) from this rank's own message.
          const e = this.ef.residual(key, data.length)
          if (c.encodeFeedback) {
            // the same, fused (top-k: one pass, and the residual's update without re-reading it;
            // int8: one kernel pass per block, while the block is in cache)
            msg = c.encodeFeedback(data, scaleBy, e, { step, rank: this.comm.rank, key }, out)
          } else {
            for (let i = 0; i < data.length; i++) e[i] += Math.fround(data[i] * scaleBy)
            msg = c.encode(e, { step, rank: this.comm.rank, key }, out)
            c.accumulate(msg, e, -1)
          }
        } else {
          scale(data, 0, data.length, scaleBy)
          msg = c.encode(data, { step, rank: this.comm.rank, key }, out)
        }
        if (msg.bytes.buffer !== bufs.words.buffer) out.set(msg.bytes)
        encodeMs = performance.now() - t0
        const gathered = await this.comm.allGather(bufs.words, { algorithm: "fanout", out: bufs.gathered, ...via })
        const stride = bufs.words.length * 4
        const all = new Uint8Array(gathered.buffer, gathered.byteOffset, gathered.byteLength)
        const msgs = Array.from({ length: this.comm.worldSize }, (_, r) => all.subarray(r * stride, r * stride + n))
        if (c.sumInto) c.sumInto(msgs, data)
        else {
          data.fill(0)
          for (const m of msgs) c.accumulate(m, data, 1)
        }
        bytes = n
      } else {
        throw new CodecContractError({ codec: c.name, reason: `aggregation "${c.aggregation}" has no per-bucket path in the gradient reducer` })
      }
    }
    const endMs = performance.now()
    const name = routeName(route)
    this.noteCall(data.length * 4, name, endMs - startMs)
    this.#opts.onBucket?.({ bucket: k, bytes, algorithm: name, startMs, endMs, encodeMs })
    return bytes
  }

  /**
   * Called after each bucket's all-reduce with the size the algorithm was chosen for (the
   * bucket's fp32 bytes), the route's name (routeName: the algorithm, with "/nats" or "/direct"
   * where the call named its path) and the call's time on this rank. For subclasses that
   * learn from it (AutoGradientReducer's tuner).
   */
  protected noteCall(_bytes: number, _algorithm: string, _ms: number): void {}

  /** The binary16 message of fp16 bucket k, kept between steps. */
  #halfBuffer(k: number, n: number): Uint16Array {
    let b = this.#half.get(k)
    if (!b || b.length !== n) {
      const r = this.#arena(`fp16 bits of bucket${k}`, Math.ceil(n / 2))
      b = r ? new Uint16Array(r.buffer, r.byteOffset, n) : new Uint16Array(n)
      this.#half.set(k, b)
    }
    return b
  }

  #linearBuffers(k: number, n: number, m: number): { domain: Float32Array; own: Float32Array } {
    let b = this.#linear.get(k)
    if (!b || b.domain.length !== m || b.own.length !== n) {
      b = { domain: new Float32Array(m), own: new Float32Array(n) }
      this.#linear.set(k, b)
    }
    return b
  }

  #gatherBuffers(k: number, words: number): { words: Float32Array; gathered: Float32Array } {
    let b = this.#gather.get(k)
    if (!b || b.words.length !== words) {
      b = { words: new Float32Array(words), gathered: new Float32Array(words * this.comm.worldSize) }
      this.#gather.set(k, b)
    }
    return b
  }

  /** A codec that runs its own rounds (PowerSGD): the whole step, per variable. */
  async #custom(codec: CustomCodec, flat: Float32Array, layout: ReadonlyArray<GradientSlotInfo>, weight: number): Promise<number> {
    const scaleBy = weight / (await this.#totalWeight(weight))
    let wire = 0
    // each round by its own size: the factors are a small fraction of the gradient
    const used = new Set<string>()
    const allReduce = async (buf: Float32Array): Promise<Float32Array> => {
      wire += buf.length * 4
      const route = this.#route(buf.length * 4)
      used.add(routeName(route))
      return this.comm.allReduce(buf, { op: "sum", algorithm: route.algorithm, ...pathOf(route) })
    }
    // The aggregate is written straight back over the gradient (`out`): by then its values live
    // on in the residual (or, without error feedback, were last read by the second round).
    const tensors = layout.map((s) => {
      const region = flat.subarray(s.offset, s.offset + s.size)
      return { key: s.name, shape: s.shape, grad: region, out: region }
    })
    const startMs = performance.now()
    await codec.reduce(tensors, allReduce, codec.errorFeedback ? this.ef : undefined, scaleBy)
    this.#opts.onBucket?.({ bucket: 0, bytes: wire, algorithm: [...used].join("+"), startMs, endMs: performance.now(), encodeMs: 0 })
    return wire
  }

  /** Copies rank 0's values into `buf` on every rank. */
  broadcast(buf: Float32Array): Promise<void> {
    return this.comm.broadcast(buf, 0).then(() => undefined)
  }

  /** Element-wise sum over ranks, in place. */
  sum(buf: Float32Array): Promise<void> {
    return this.comm.allReduce(buf, { op: "sum", algorithm: "tree" }).then(() => undefined)
  }

  /** Residuals, and the state of a codec that keeps its own (PowerSGD's warm-start factors), for a checkpoint. */
  state(): ReducerState {
    const c = this.compressor
    const own = c?.aggregation === "custom" && c.state ? c.state() : undefined
    return { residuals: this.ef.state(), ...(c && own !== undefined ? { [c.name]: own } : {}) }
  }

  restore(state: { readonly residuals?: Record<string, ArrayLike<number>>; readonly [codec: string]: unknown }): void {
    if (state.residuals) this.ef.restore(state.residuals)
    const c = this.compressor
    if (c?.aggregation === "custom" && c.restore && state[c.name] !== undefined) c.restore(state[c.name])
  }
}
