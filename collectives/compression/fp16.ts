// fp16 cast: IEEE binary16, round-to-nearest-even, the 2x codec. Linear enough to be summed on the
// wire, so it is aggregated with an ordinary all-reduce ('allreduce'): the collective moves fp16,
// each hop accumulates in fp32 and rounds the partial sum back to fp16 to forward it. That hop
// rounding (<= 2^-11 relative, round-to-nearest-even, so not systematic) is left uncompensated,
// as in Horovod's and DDP's fp16 hooks; the residual kept per rank covers its own cast.
//
// Wire: header (8 bytes, see compressor.ts) | n x uint16 (binary16 bits, little-endian).
// Total 8 + 2n bytes.
//
// Encoding uses the bit-level algorithm of F. Giesen ("float_to_half_fast3_rtne") on the fp32 bits;
// decoding is one lookup in a 65536-entry table (256 KiB, built on first use).
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

let table: Float32Array | undefined

/** binary16 bits -> value, for all 65536 patterns. */
export const fp16Table = (): Float32Array => {
  if (table) return table
  const t = new Float32Array(65536)
  for (let h = 0; h < 65536; h++) {
    const e = (h >>> 10) & 0x1f
    const m = h & 0x3ff
    let v: number
    if (e === 0) v = m * 2 ** -24
    else if (e === 31) v = m === 0 ? Infinity : NaN
    else v = (1 + m / 1024) * 2 ** (e - 15)
    t[h] = h & 0x8000 ? -v : v
  }
  table = t
  return t
}

export const fp16BitsToFp32 = (h: number): number => fp16Table()[h & 0xffff]!

/** One fp32 (given as its value and its bits) to binary16 bits, round-to-nearest-even. */
const toHalf = (value: number, bits: number): number => {
  const sign = (bits >>> 16) & 0x8000
  const f = bits & 0x7fffffff
  if (f >= 0x47800000) return sign | (f > 0x7f800000 ? 0x7e00 : 0x7c00) // >= 65536, Inf, NaN
  if (f < 0x38800000) {
    // below 2^-14: subnormal half (or zero). Adding 0.5 in fp32 puts the half's ulp (2^-24) at
    // fp32's last mantissa bit, so fp32 rounding does the round-to-nearest-even for us.
    return sign | ((Math.fround(Math.abs(value) + 0.5) - 0.5) * 16777216)
  }
  // normal: rebias the exponent, add 0xfff (+1 when the kept lsb is odd) to round to nearest even;
  // a carry out of the mantissa correctly bumps the exponent, up to Inf for [65520, 65536).
  return sign | ((f - 0x38000000 + 0xfff + ((f >>> 13) & 1)) >>> 13)
}

const scratch = new Float32Array(1)
const scratchBits = new Uint32Array(scratch.buffer)

export const fp32ToFp16Bits = (x: number): number => {
  scratch[0] = x
  return toHalf(scratch[0]!, scratchBits[0]!)
}

/** Bulk cast: out[i] = half bits of input[i]. No allocation. */
export const encodeFp16 = (input: Float32Array, out: Uint16Array): void => {
  const n = input.length
  const bits = new Uint32Array(input.buffer, input.byteOffset, n)
  for (let i = 0; i < n; i++) {
    const b = bits[i]!
    const f = b & 0x7fffffff
    // the common case inline; the rare ones (tiny, huge, non-finite) through toHalf
    if (f >= 0x38800000 && f < 0x47800000) out[i] = ((b >>> 16) & 0x8000) | ((f - 0x38000000 + 0xfff + ((f >>> 13) & 1)) >>> 13)
    else out[i] = toHalf(input[i]!, b)
  }
}

/** Bulk decode: out[i] = value of half bits h[i]. */
export const decodeFp16 = (h: Uint16Array, out: Float32Array): void => {
  const t = fp16Table()
  for (let i = 0; i < h.length; i++) out[i] = t[h[i]!]!
}

export class Fp16Compressor implements Compressor {
  readonly name = "fp16" as const
  readonly aggregation = "allreduce" as const
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
    writeHeader(bytes, "fp16", n)
    encodeFp16(input, new Uint16Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES, n))
    return { codec: "fp16", length: n, bytes }
  }

  private payload(msg: CompressedMessage | Uint8Array): Uint16Array {
    const b = bytesOf(msg)
    const n = readHeader(b, "fp16")
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
}
