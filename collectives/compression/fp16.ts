// fp16 cast: IEEE binary16, round-to-nearest-even, the 2x codec. Linear enough to be summed on the
// wire, so it is aggregated as 'linear' with C = the binary16 cast itself (castsToWire, see
// codec.ts) by an ordinary all-reduce with binary16 on the wire: the collective moves fp16,
// each hop accumulates in fp32 and rounds the partial sum back to fp16 to forward it. That hop
// rounding (<= 2^-11 relative, round-to-nearest-even, so not systematic) is left uncompensated,
// as in Horovod's and DDP's fp16 hooks. On a ring a rank casts its own values only on the segment
// it sends first, and its residual covers that cast; as a relay or owner it adds its values into
// the partial sum at fp32 (gradient-reducer.ts, FeedbackHalfSource). Other algorithms cast all of
// a rank's values, each with its residual.
//
// Wire: header (8 bytes, see compressor.ts) | n x uint16 (binary16 bits, little-endian).
// Total 8 + 2n bytes.
//
// The conversions themselves live in ../float16.ts, shared with the collectives' fp16 wire format
// (F. Giesen's round-to-nearest-even on the fp32 bits; decoding through a 65536-entry table).
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
  view,
  writeHeader
} from "./compressor.ts"

import * as Schema from "effect/Schema"
import { decodeHalf, encodeHalf, halfTable, roundToHalf } from "../float16.ts"
import type { LinearCodec } from "./codec.ts"
import { ErrorFeedbackOption, defineCodec } from "./registry.ts"

const WIRE = { id: 1, name: "fp16" } as const

/** binary16 bits -> value, for all 65536 patterns (the collectives' fp16 wire uses the same table). */
export const fp16Table = halfTable

export const fp16BitsToFp32 = (h: number): number => halfTable()[h & 0xffff]!

const scratch = new Float32Array(1)
const scratchHalf = new Uint16Array(1)

export const fp32ToFp16Bits = (x: number): number => {
  scratch[0] = x
  encodeHalf(scratch, scratchHalf)
  return scratchHalf[0]!
}

/** Bulk cast: out[i] = half bits of input[i], round-to-nearest-even. No allocation. */
export const encodeFp16 = encodeHalf

/** Bulk decode: out[i] = value of half bits h[i]. */
export const decodeFp16 = decodeHalf

export class Fp16Compressor implements Compressor, LinearCodec {
  readonly name = "fp16" as const
  readonly aggregation = "linear" as const
  readonly wire = "f16" as const
  /** The gradient reducer folds error feedback into the all-reduce's own cast (FeedbackHalfSource). */
  readonly castsToWire = true
  readonly errorFeedback: boolean

  constructor(options: { readonly errorFeedback?: boolean } = {}) {
    this.errorFeedback = options.errorFeedback ?? true
  }

  wireBytes(n: number): number {
    return HEADER_BYTES + 2 * n
  }

  encode(input: Float32Array, _ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const n = input.length
    const bytes = outBytes(this.wireBytes(n), out)
    writeHeader(bytes, WIRE, n)
    encodeFp16(input, new Uint16Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES, n))
    return { codec: "fp16", length: n, bytes }
  }

  private payload(msg: CompressedMessage | Uint8Array): Uint16Array {
    const b = bytesOf(msg)
    const n = readHeader(b, WIRE)
    checkSize(b, this.wireBytes(n), "fp16")
    return view(Uint16Array, b, HEADER_BYTES, n)
  }

  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array {
    const h = this.payload(msg)
    const dst = outFloats(h.length, out)
    decodeFp16(h, dst)
    return dst
  }

  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight = 1): void {
    const h = this.payload(msg)
    checkTarget(into, h.length, "fp16")
    const t = fp16Table()
    if (weight === 1) for (let i = 0; i < h.length; i++) into[i] += t[h[i]!]!
    else for (let i = 0; i < h.length; i++) into[i] += weight * t[h[i]!]!
  }

  domainLength(n: number): number {
    return n
  }

  /** out = the values of x rounded to binary16. */
  toDomain(x: Float32Array, out: Float32Array): void {
    out.set(x)
    roundToHalf(out)
  }

  fromDomain(y: Float32Array, out: Float32Array): void {
    if (out !== y) out.set(y)
  }
}

export const fp16Codec = defineCodec({
  name: "fp16",
  wireId: WIRE.id,
  aggregation: "linear",
  hint: "binary16 cast, 2x: summed in fp16 on the wire (fp32 at every hop), error feedback folded into the ring; about neutral for accuracy",
  shorthand: true,
  example: "fp16",
  schema: Schema.Struct({ type: Schema.Literal("fp16"), errorFeedback: ErrorFeedbackOption }),
  create: (c) => new Fp16Compressor({ errorFeedback: c.errorFeedback }),
  auto: { order: 0, config: { type: "fp16" } },
  wireRatio: () => 2
})
