// What a gradient codec implements, as the gradient reducer (and the in-process simulation) sees
// it. A codec declares one aggregation and provides that aggregation's hooks; the reducer runs the
// path the declaration names and nothing else, so a codec never runs as another one:
//
//   'none'       nothing is compressed: the plain fp32 weighted-mean all-reduce.
//   'linear'     C(a) + C(b) is a message of a + b: the all-reduce sums the codec's domain vectors
//                (fp32, or binary16 on the wire) and every rank decodes the sum once (LinearCodec).
//                fp16 is linear with C = the binary16 cast itself (`castsToWire`), which lets the
//                reducer fold error feedback into the all-reduce's own cast.
//   'allgather'  messages cannot be summed without decoding (top-k: different indices per rank;
//                sign bits; int8 scales): every rank gathers every message and decodes all of them
//                in rank order (the byte-message Compressor of compressor.ts).
//   'custom'     the codec runs its own rounds of fp32 sum all-reduces over whole variables
//                (PowerSGD: P, then Q), given an all-reduce callback (CustomCodec).
import type { Aggregation, Compressor, EncodeContext } from "./compressor-contract.ts"
import type { ErrorFeedback } from "./error-feedback.ts"

export type { Aggregation } from "./compressor-contract.ts"

interface CodecBase {
  /** The registry name (the `type` of its config). */
  readonly name: string
  readonly aggregation: Aggregation
  /** Whether the reducer keeps a residual for it (see error-feedback.ts). */
  readonly errorFeedback: boolean
}

/** 'none': sent as it is. */
export interface UncompressedCodec extends CodecBase {
  readonly aggregation: "none"
}

/**
 * 'linear': messages are vectors in the codec's domain that the all-reduce sums as they are. The
 * reducer, per bucket of n elements: p = g·(w/W) + e; y = C(p) (rounded to binary16 with wire
 * "f16", which is what travels); e = p - D(y); all-reduce sum of y; result = D(Σ y).
 */
export interface LinearCodec extends CodecBase {
  readonly aggregation: "linear"
  /** How the domain values travel: fp32, or binary16 with fp32 accumulation at every hop. */
  readonly wire: "f32" | "f16"
  /**
   * C is exactly the cast to the wire format (binary16, so `wire` must be "f16") and D the identity:
   * the reducer then lets the all-reduce make the cast, with error feedback folded into it (fp16).
   */
  readonly castsToWire: boolean
  /** Length of the domain vector for n elements. */
  domainLength(n: number): number
  /** out (domainLength(n) values) = C(x); x is only read. */
  toDomain(x: Float32Array, out: Float32Array, ctx?: EncodeContext): void
  /** out (n values) = D(y). */
  fromDomain(y: Float32Array, out: Float32Array): void
}

/** 'allgather': byte messages, gathered from every rank and decoded in rank order. */
export interface GatherCodec extends Compressor {
  readonly aggregation: "allgather"
}

/** One variable for a custom codec: its identity, shape, gradient and where the aggregate goes. */
export interface CustomTensor {
  readonly key: string
  readonly shape: ReadonlyArray<number>
  readonly grad: Float32Array
  readonly out?: Float32Array
}

/** Sum all-reduce over the group, in place, as the collective provides it. */
export type SumAllReduce = (buf: Float32Array) => Promise<Float32Array>

/** 'custom': the codec drives its own all-reduce rounds over whole variables. */
export interface CustomCodec extends CodecBase {
  readonly aggregation: "custom"
  /**
   * Reduces one step's variables to the sum over ranks of their scaled (·scale) gradients, into
   * each tensor's `out`, through `allReduce`; with `ef` it keeps its residuals there.
   */
  reduce(tensors: ReadonlyArray<CustomTensor>, allReduce: SumAllReduce, ef: ErrorFeedback | undefined, scale: number): Promise<unknown>
  /** State to keep in a checkpoint next to the residuals (under the codec's name). */
  state?(): unknown
  restore?(state: unknown): void
}

export type Codec = UncompressedCodec | LinearCodec | GatherCodec | CustomCodec
