// Sign / 1-bit compression with a scale (EF-signSGD, Karimireddy et al. 2019): each element
// becomes its sign, each chunk carries one fp32 scale = mean |x| over the chunk, so decode is
// scale·sign(x). ~32x. Biased on its own; error feedback is what makes it converge.
//
// Aggregation: 'allgather'. Sign bits cannot be added, and re-signing a partial sum at every hop
// would need a residual per hop and lose far more than int8 does, so every rank gathers all p
// messages and accumulates their decoded values in rank order (the sum; the caller divides as it
// does for any all-reduce).
//
// Wire: header (8) | chunkSize: uint32 (a multiple of 8) | scales: float32[ceil(n/chunkSize)] |
// bits: uint8[ceil(n/8)], element i at bit (i % 8) of byte i/8: the fp32 sign bit, 1 = negative
// (so -0 decodes as -scale, +0 as +scale; with error feedback the difference is fed back anyway). Total 12 + 4·ceil(n/chunkSize) + ceil(n/8) bytes.
import * as Schema from "effect/Schema"
import { WireDecodeError } from "../../core/errors.ts"
import type { GatherCodec } from "./codec.ts"
import { ErrorFeedbackOption, PositiveInt, defineCodec } from "./registry.ts"
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

export const SIGN_DEFAULT_CHUNK = 4096

/** ±1 for the 8 bits of every byte value: decode is one lookup and one multiply per element. */
const SIGNS = (() => {
  const t = new Float32Array(256 * 8)
  for (let b = 0; b < 256; b++) for (let j = 0; j < 8; j++) t[b * 8 + j] = (b >>> j) & 1 ? -1 : 1
  return t
})()

const WIRE = { id: 4, name: "sign" } as const

export class SignCompressor implements Compressor, GatherCodec {
  readonly name = "sign" as const
  readonly aggregation = "allgather" as const
  readonly errorFeedback: boolean
  readonly chunkSize: number

  constructor(options: { readonly chunkSize?: number; readonly errorFeedback?: boolean } = {}) {
    this.errorFeedback = options.errorFeedback ?? true
    this.chunkSize = options.chunkSize ?? SIGN_DEFAULT_CHUNK
    if (!Number.isInteger(this.chunkSize) || this.chunkSize < 8 || this.chunkSize % 8 !== 0) {
      throw new RangeError(`sign chunkSize must be a positive multiple of 8, got ${this.chunkSize}`)
    }
  }

  wireBytes(n: number): number {
    return HEADER_BYTES + 4 + 4 * Math.ceil(n / this.chunkSize) + Math.ceil(n / 8)
  }

  encode(input: Float32Array, _ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const n = input.length
    const c = this.chunkSize
    const chunks = Math.ceil(n / c)
    const bytes = outBytes(this.wireBytes(n), out)
    writeHeader(bytes, WIRE, n)
    writeU32(bytes, HEADER_BYTES, c)
    const scales = new Float32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES + 4, chunks)
    const bitsAt = HEADER_BYTES + 4 + 4 * chunks
    // the sign bit straight from the fp32 bits: one pass computes the scale and the bits together
    const u = new Uint32Array(input.buffer, input.byteOffset, n)
    for (let k = 0; k < chunks; k++) {
      const lo = k * c
      const hi = Math.min(n, lo + c)
      let sum = 0
      let i = lo
      // chunks start on byte boundaries (chunkSize % 8 == 0), so a byte never spans two chunks
      for (; i + 8 <= hi; i += 8) {
        sum += Math.abs(input[i]) + Math.abs(input[i + 1]) + Math.abs(input[i + 2]) + Math.abs(input[i + 3]) +
          Math.abs(input[i + 4]) + Math.abs(input[i + 5]) + Math.abs(input[i + 6]) + Math.abs(input[i + 7])
        bytes[bitsAt + (i >>> 3)] = (u[i] >>> 31) | ((u[i + 1] >>> 31) << 1) | ((u[i + 2] >>> 31) << 2) | ((u[i + 3] >>> 31) << 3) |
          ((u[i + 4] >>> 31) << 4) | ((u[i + 5] >>> 31) << 5) | ((u[i + 6] >>> 31) << 6) | ((u[i + 7] >>> 31) << 7)
      }
      if (i < hi) {
        let byte = 0
        for (let j = i; j < hi; j++) {
          sum += Math.abs(input[j])
          byte |= (u[j] >>> 31) << (j - i)
        }
        bytes[bitsAt + (i >>> 3)] = byte
      }
      scales[k] = sum / (hi - lo)
    }
    return { codec: "sign", length: n, bytes }
  }

  private parse(msg: CompressedMessage | Uint8Array): { n: number; c: number; scales: Float32Array; bits: Uint8Array } {
    const b = bytesOf(msg)
    const n = readHeader(b, WIRE)
    if (b.byteLength < HEADER_BYTES + 4) throw new WireDecodeError({ reason: "sign message truncated before its chunk size" })
    const c = readU32(b, HEADER_BYTES)
    if (c < 8 || c % 8 !== 0) throw new WireDecodeError({ reason: `sign message has chunk size ${c}, not a positive multiple of 8` })
    const chunks = Math.ceil(n / c)
    checkSize(b, HEADER_BYTES + 4 + 4 * chunks + Math.ceil(n / 8), "sign")
    const scales = view(Float32Array, b, HEADER_BYTES + 4, chunks)
    const bits = b.subarray(HEADER_BYTES + 4 + 4 * chunks)
    return { n, c, scales, bits }
  }

  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array {
    const { n, c, scales, bits } = this.parse(msg)
    const dst = outFloats(n, out)
    for (let k = 0, lo = 0; lo < n; k++, lo += c) {
      const s = scales[k]
      const hi = Math.min(n, lo + c)
      for (let i = lo; i < hi; i += 8) {
        const base = bits[i >>> 3] * 8
        const end = Math.min(hi, i + 8)
        for (let j = i; j < end; j++) dst[j] = s * SIGNS[base + j - i]
      }
    }
    return dst
  }

  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight = 1): void {
    const { n, c, scales, bits } = this.parse(msg)
    checkTarget(into, n, "sign")
    for (let k = 0, lo = 0; lo < n; k++, lo += c) {
      // scale·(±1) is exact in fp32, so weight ±1 adds exactly what decode() yields
      const s = weight * scales[k]
      const hi = Math.min(n, lo + c)
      for (let i = lo; i < hi; i += 8) {
        const base = bits[i >>> 3] * 8
        const end = Math.min(hi, i + 8)
        for (let j = i; j < end; j++) into[j] += s * SIGNS[base + j - i]
      }
    }
  }
}

export const signCodec = defineCodec({
  name: "sign",
  wireId: WIRE.id,
  aggregation: "allgather",
  hint: "one sign bit per element and an fp32 scale per chunk (EF-signSGD), ~32x; all-gathered",
  example: { type: "sign" },
  schema: Schema.Struct({
    type: Schema.Literal("sign"),
    chunkSize: Schema.optionalKey(PositiveInt.check(Schema.makeFilter((n: number) => n % 8 === 0, { expected: "a multiple of 8" }))),
    errorFeedback: ErrorFeedbackOption
  }),
  create: (c) => new SignCompressor({ chunkSize: c.chunkSize ?? SIGN_DEFAULT_CHUNK, errorFeedback: c.errorFeedback }),
  // 32 bits an element become 1, plus 32 bits of scale a chunk
  wireRatio: (c) => 32 / (1 + 32 / (c.chunkSize ?? SIGN_DEFAULT_CHUNK))
})
