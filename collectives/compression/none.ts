// The identity codec: raw fp32. It lets uncompressed tensors (and the 'none' config) flow through
// the same encode / accumulate path, and is the baseline the benchmarks compare against.
//
// Wire: header (8) | values: float32[n]. Total 8 + 4n bytes. Aggregation: 'none' (the gradient
// reducer sends an uncompressed bucket with the plain fp32 weighted-mean all-reduce).
import * as Schema from "effect/Schema"
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
import type { UncompressedCodec } from "./codec.ts"
import { defineCodec } from "./registry.ts"

const WIRE = { id: 0, name: "none" } as const

export class NoneCompressor implements Compressor, UncompressedCodec {
  readonly name = "none" as const
  readonly aggregation = "none" as const
  /** Nothing is lost, so there is nothing to feed back. */
  readonly errorFeedback = false

  wireBytes(n: number): number {
    return HEADER_BYTES + 4 * n
  }

  encode(input: Float32Array, _ctx?: EncodeContext, out?: Uint8Array): CompressedMessage {
    const n = input.length
    const bytes = outBytes(this.wireBytes(n), out)
    writeHeader(bytes, WIRE, n)
    new Float32Array(bytes.buffer, bytes.byteOffset + HEADER_BYTES, n).set(input)
    return { codec: "none", length: n, bytes }
  }

  private payload(msg: CompressedMessage | Uint8Array): Float32Array {
    const b = bytesOf(msg)
    const n = readHeader(b, WIRE)
    checkSize(b, this.wireBytes(n), "none")
    return view(Float32Array, b, HEADER_BYTES, n)
  }

  decode(msg: CompressedMessage | Uint8Array, out?: Float32Array): Float32Array {
    const v = this.payload(msg)
    const dst = outFloats(v.length, out)
    dst.set(v)
    return dst
  }

  accumulate(msg: CompressedMessage | Uint8Array, into: Float32Array, weight = 1): void {
    const v = this.payload(msg)
    checkTarget(into, v.length, "none")
    if (weight === 1) for (let i = 0; i < v.length; i++) into[i] += v[i]
    else for (let i = 0; i < v.length; i++) into[i] += weight * v[i]
  }
}

export const noneCodec = defineCodec({
  name: "none",
  wireId: WIRE.id,
  aggregation: "none",
  hint: "no compression: fp32, the weighted mean all-reduced as it is",
  shorthand: true,
  example: "none",
  schema: Schema.Struct({ type: Schema.Literal("none") }),
  create: () => new NoneCompressor()
})
