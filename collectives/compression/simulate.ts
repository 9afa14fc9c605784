// In-process simulation of a compressed all-reduce across p ranks, computing the aggregate the
// way the gradient reducer does for the aggregation a codec declares (same encodes, same decode
// order, same fp32 rounding), so tests can check the math of compression and error feedback
// without NATS. Also the key helper for re-compressing ring hops, and a model of one
// (simulateRequantizingRing) that the reducer does not run.
import type { Codec, LinearCodec } from "./codec.ts"
import type { Compressor, EncodeContext } from "./compressor.ts"
import type { ErrorFeedback } from "./error-feedback.ts"
import { decodeFp16, encodeFp16 } from "./fp16.ts"
import { halfFeedbackBits, roundToHalf } from "../float16.ts"
import type { AllReduceSum, PowerSgdCompressor } from "./powersgd.ts"

/** Any registered codec (codec.ts); the name is kept from when there were only two kinds. */
export type AnyCompressor = Codec

/**
 * Residual key of the point where rank r re-compresses segment `segment` of tensor `key` in a
 * ring of `worldSize` ranks (simulateRequantizingRing). In a fixed ring every rank compresses each
 * segment exactly once per step (as origin, as an intermediate hop, or as the segment's owner
 * before the all-gather), so (key, p, segment) identifies one compress point per rank. A different
 * world size is a different layout, hence a different key.
 */
export const ringSegmentKey = (key: string, worldSize: number, segment: number): string => `${key}#ring${worldSize}.${segment}`

/** Ring segment boundaries, as the collectives split a buffer: [lo, hi) of segment c. */
export const ringSegment = (n: number, p: number, c: number): readonly [number, number] => [
  Math.floor((c * n) / p),
  Math.floor(((c + 1) * n) / p)
]

export interface SimulateOptions {
  /** Tensor identity (residual key). Default "t". */
  readonly key?: string
  readonly step?: number
  /** Required for PowerSGD: the gradient's shape. Default [n]. */
  readonly shape?: ReadonlyArray<number>
}

const encodeWith = (
  c: Compressor,
  ef: ReadonlyArray<ErrorFeedback> | null,
  rank: number,
  key: string,
  x: Float32Array,
  ctx: EncodeContext
) => (ef ? ef[rank].compress(c, key, x, ctx) : c.encode(x, { ...ctx, key }))

/** PowerSGD's step-by-step form (begin, second, finish), which lets p instances run in lock step. */
const lockstep = (c: Codec): c is PowerSgdCompressor & Codec => typeof (c as Partial<PowerSgdCompressor>).begin === "function"

/**
 * The sum over ranks of what each rank's gradient becomes after compression and aggregation, as
 * every rank would see it (they all see the same). `compressor` is one instance shared by all
 * ranks, or one per rank (PowerSGD keeps per-rank state, so it needs one per rank). `ef` is one
 * store per rank, or null for no error feedback. p = 1 communicates nothing, so nothing is
 * compressed. By the aggregation the codec declares (codec.ts):
 *
 * - 'allgather': every rank encodes its own p = g + e; all decode all messages in rank order.
 * - 'linear' with castsToWire (fp16), as a ring with error feedback folded in: segment c starts at
 *   rank c, which casts its p = g + e there (residual e = p - half(p)); each following rank adds
 *   its g + e in fp32 (spending e there: e = 0) and rounds the partial sum to fp16 to forward it,
 *   the last (the owner) rounding the full sum for the all-gather. So a rank's residual ends
 *   nonzero only on the segment it starts. Without error feedback, the same with e = 0 throughout.
 * - 'linear' otherwise: every rank's y = C(g + e) (rounded to binary16 for wire "f16"),
 *   e = g + e - D(y); the y summed in rank order (the network's ring adds in its own order, so
 *   the two agree to fp32 rounding), then D of the sum.
 * - 'custom' (PowerSGD, in lock step): the two fp32 sum rounds.
 * - 'none': the plain sum.
 */
export const simulateCompressedAllReduce = (
  workersGrads: ReadonlyArray<Float32Array>,
  compressor: AnyCompressor | ReadonlyArray<AnyCompressor>,
  ef: ReadonlyArray<ErrorFeedback> | null,
  options: SimulateOptions = {}
): Float32Array => {
  const p = workersGrads.length
  const n = p === 0 ? 0 : workersGrads[0].length
  for (const g of workersGrads) if (g.length !== n) throw new RangeError("all ranks must bring gradients of one length")
  const comps = Array.isArray(compressor) ? (compressor as ReadonlyArray<AnyCompressor>) : workersGrads.map(() => compressor as AnyCompressor)
  if (comps.length !== p) throw new RangeError(`${comps.length} compressors for ${p} ranks`)
  if (ef && ef.length !== p) throw new RangeError(`${ef.length} error-feedback stores for ${p} ranks`)
  const key = options.key ?? "t"
  const step = options.step
  if (p <= 1) return p === 0 ? new Float32Array(0) : workersGrads[0].slice()
  const first = comps[0]

  switch (first.aggregation) {
    case "custom": {
      if (!lockstep(first)) throw new TypeError(`codec ${first.name} has no lock-step form (begin) to simulate; run its reduce() over inProcessAllReduce`)
      const shape = options.shape ?? [n]
      const rounds = comps.map((c, r) => (c as PowerSgdCompressor).begin([{ key, shape, grad: workersGrads[r] }], ef ? ef[r] : undefined))
      const sum1 = sumInOrder(rounds.map((x) => x.first))
      const seconds = rounds.map((x) => x.second(sum1))
      const sum2 = seconds[0] === null ? null : sumInOrder(seconds as Array<Float32Array>)
      const outs = rounds.map((x) => x.finish(sum2)[0])
      return outs[0]
    }
    case "allgather": {
      const cs = comps as ReadonlyArray<Compressor>
      const msgs = workersGrads.map((g, r) => encodeWith(cs[r], ef, r, key, g, { rank: r, step }))
      const out = new Float32Array(n)
      for (let r = 0; r < p; r++) cs[0].accumulate(msgs[r], out)
      return out
    }
    case "linear":
      if (first.castsToWire) return halfRing(workersGrads, first, ef, key)
      return linearSum(workersGrads, comps as ReadonlyArray<LinearCodec>, ef, key, step)
    case "none":
      return sumInOrder(workersGrads)
  }
}

/** fp16's ring with error feedback folded in (see simulateCompressedAllReduce). */
const halfRing = (workersGrads: ReadonlyArray<Float32Array>, first: LinearCodec, ef: ReadonlyArray<ErrorFeedback> | null, key: string): Float32Array => {
  const p = workersGrads.length
  const n = workersGrads[0].length
  const res = ef && first.errorFeedback ? workersGrads.map((_, r) => ef[r].residual(key, n)) : null
  const out = new Float32Array(n)
  for (let c = 0; c < p; c++) {
    const [lo, hi] = ringSegment(n, p, c)
    const half = new Uint16Array(hi - lo)
    // the origin's cast of its own values, with its residual
    const acc = workersGrads[c].slice(lo, hi)
    if (res) halfFeedbackBits(workersGrads[c].subarray(lo, hi), res[c].subarray(lo, hi), 1, half)
    else encodeFp16(acc, half)
    decodeFp16(half, acc)
    for (let j = 1; j < p; j++) {
      const r = (c + j) % p
      const g = workersGrads[r]
      const e = res?.[r]
      for (let i = lo; i < hi; i++) {
        acc[i - lo] += e ? Math.fround(g[i] + e[i]) : g[i]
        if (e) e[i] = 0
      }
      roundFp16(acc, half) // forwarded as fp16; after the owner's addition, its all-gather message
    }
    out.set(acc, lo)
  }
  return out
}

/** A linear codec's generic path (see simulateCompressedAllReduce), as the gradient reducer runs it. */
const linearSum = (
  workersGrads: ReadonlyArray<Float32Array>,
  cs: ReadonlyArray<LinearCodec>,
  ef: ReadonlyArray<ErrorFeedback> | null,
  key: string,
  step: number | undefined
): Float32Array => {
  const n = workersGrads[0].length
  const m = cs[0].domainLength(n)
  const sum = new Float32Array(m)
  const own = new Float32Array(n)
  workersGrads.forEach((g, r) => {
    const c = cs[r]
    const y = new Float32Array(m)
    const e = ef && c.errorFeedback ? ef[r].residual(key, n) : undefined
    if (e) for (let i = 0; i < n; i++) e[i] += g[i]
    c.toDomain(e ?? g, y, { key, rank: r, step })
    if (c.wire === "f16") roundToHalf(y)
    if (e) {
      c.fromDomain(y, own)
      for (let i = 0; i < n; i++) e[i] -= own[i]
    }
    for (let i = 0; i < m; i++) sum[i] += y[i]
  })
  const out = new Float32Array(n)
  cs[0].fromDomain(sum, out)
  return out
}

/**
 * A model of a ring all-reduce whose every hop decodes what it receives, adds its raw gradient
 * and re-compresses with the residual of its (key, p, segment) compress point; the owner
 * compresses the full segment sum once for the all-gather. The gradient reducer does not run it
 * (it all-gathers codecs that cannot be summed): kept to show how p-1 re-compressions compound.
 */
export const simulateRequantizingRing = (
  workersGrads: ReadonlyArray<Float32Array>,
  compressor: Compressor | ReadonlyArray<Compressor>,
  ef: ReadonlyArray<ErrorFeedback> | null,
  options: SimulateOptions = {}
): Float32Array => {
  const p = workersGrads.length
  const n = p === 0 ? 0 : workersGrads[0].length
  const cs = Array.isArray(compressor) ? (compressor as ReadonlyArray<Compressor>) : workersGrads.map(() => compressor as Compressor)
  const key = options.key ?? "t"
  if (p <= 1) return p === 0 ? new Float32Array(0) : workersGrads[0].slice()
  const out = new Float32Array(n)
  for (let c = 0; c < p; c++) {
    const [lo, hi] = ringSegment(n, p, c)
    const acc = new Float32Array(hi - lo)
    for (let j = 0; j < p; j++) {
      const r = (c + j) % p
      const g = workersGrads[r]
      for (let i = lo; i < hi; i++) acc[i - lo] += g[i]
      const msg = encodeWith(cs[r], ef, r, ringSegmentKey(key, p, c), acc, { rank: r, step: options.step })
      cs[r].decode(msg, acc) // what the next rank (or, for the owner, everyone) receives
    }
    out.set(acc, lo)
  }
  return out
}

const roundFp16 = (x: Float32Array, scratch: Uint16Array): void => {
  encodeFp16(x, scratch)
  decodeFp16(scratch, x)
}

const sumInOrder = (xs: ReadonlyArray<Float32Array>): Float32Array => {
  const out = new Float32Array(xs[0].length)
  for (const x of xs) for (let i = 0; i < x.length; i++) out[i] += x[i]
  return out
}

/**
 * p in-process sum all-reduce callbacks for PowerSGD's async `reduce`: each call waits until all p
 * ranks have called, then every rank gets its own copy of the sum (in rank order). Successive
 * calls form successive rounds.
 */
export const inProcessAllReduce = (p: number): Array<AllReduceSum> => {
  let pending: Array<{ buf: Float32Array; resolve: (x: Float32Array) => void }> = []
  return Array.from({ length: p }, (_, rank) => (buf: Float32Array) =>
    new Promise<Float32Array>((resolve) => {
      pending[rank] = { buf, resolve }
      if (pending.filter(Boolean).length === p) {
        const round = pending
        pending = []
        const sum = sumInOrder(round.map((x) => x.buf))
        for (const x of round) x.resolve(sum.slice())
      }
    })
  )
}
