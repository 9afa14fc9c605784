// The byte-message contract of a gradient codec, and the common 8-byte header of its messages.
// The collectives layer only needs this file to move gathered messages: encode on the sender,
// `accumulate` (decode-and-add) on the receiver. How a codec is aggregated across ranks is what it
// declares in codec.ts; codecs aggregated by all-gather implement this contract, and others may
// (fp16, none) for benchmarks and tests.
//
// Wire header (all codecs, little-endian, 8 bytes so every payload starts 4-byte aligned):
//   byte 0      magic 0xC7
//   byte 1      codec id: the codec's wireId in the registry (0 none, 1 fp16, 2 int8, 3 topk, 4 sign)
//   byte 2      format version (1)
//   byte 3      reserved, 0
//   bytes 4..7  n: uint32, element count of the dense tensor the message stands for
// The codec's payload follows (see each codec module). Typed-array views over the payload assume a
// little-endian host; every platform Node and tfjs run on is, and we refuse to load otherwise
// rather than put byte-swapped gradients on the wire.
import { WireDecodeError } from "../../core/errors.ts"
import { codecByWireId } from "./registry.ts"

export type { Aggregation, CompressedMessage, Compressor, EncodeContext, WireCodec } from "./compressor-contract.ts"
import type { CompressedMessage, WireCodec } from "./compressor-contract.ts"

export const MAGIC = 0xc7
export const FORMAT_VERSION = 1
export const HEADER_BYTES = 8

if (new Uint8Array(new Uint16Array([1]).buffer)[0] !== 1) {
  throw new Error("gradwire compression requires a little-endian host")
}

export const bytesOf = (msg: CompressedMessage | Uint8Array): Uint8Array => (msg instanceof Uint8Array ? msg : msg.bytes)

export const writeHeader = (out: Uint8Array, codec: WireCodec, n: number): void => {
  out[0] = MAGIC
  out[1] = codec.id
  out[2] = FORMAT_VERSION
  out[3] = 0
  out[4] = n & 0xff
  out[5] = (n >>> 8) & 0xff
  out[6] = (n >>> 16) & 0xff
  out[7] = (n >>> 24) & 0xff
}

export const readU32 = (b: Uint8Array, at: number): number =>
  (b[at]! | (b[at + 1]! << 8) | (b[at + 2]! << 16) | (b[at + 3]! << 24)) >>> 0

export const writeU32 = (b: Uint8Array, at: number, v: number): void => {
  b[at] = v & 0xff
  b[at + 1] = (v >>> 8) & 0xff
  b[at + 2] = (v >>> 16) & 0xff
  b[at + 3] = (v >>> 24) & 0xff
}

/** Reads and checks the header; returns the dense length. */
export const readHeader = (b: Uint8Array, expect: WireCodec): number => {
  if (b.byteLength < HEADER_BYTES) {
    throw new WireDecodeError({ reason: `compressed message of ${b.byteLength} bytes is shorter than its ${HEADER_BYTES}-byte header` })
  }
  if (b[0] !== MAGIC) throw new WireDecodeError({ reason: `not a compressed gradient (magic byte 0x${b[0]!.toString(16)})` })
  if (b[2] !== FORMAT_VERSION) {
    throw new WireDecodeError({ reason: `compressed gradient format version ${b[2]} is not supported (this build reads ${FORMAT_VERSION})` })
  }
  const id = b[1]!
  if (id !== expect.id) {
    throw new WireDecodeError({
      reason: `message was encoded with codec ${codecByWireId(id)?.name ?? `#${id}`}, decoder is ${expect.name}: ranks disagree on the compression config`
    })
  }
  return readU32(b, 4)
}

/** Codec name from a message header (a registered codec's), so a receiver can pick the decoder. */
export const codecOf = (msg: CompressedMessage | Uint8Array): string => {
  const b = bytesOf(msg)
  const name = b.byteLength >= HEADER_BYTES && b[0] === MAGIC ? codecByWireId(b[1]!)?.name : undefined
  if (!name) throw new WireDecodeError({ reason: "not a compressed gradient message" })
  return name
}

export const checkSize = (b: Uint8Array, expected: number, codec: string): void => {
  if (b.byteLength !== expected) {
    throw new WireDecodeError({ reason: `${codec} message is ${b.byteLength} bytes, its header implies ${expected} (truncated or corrupted)` })
  }
}

export const checkTarget = (into: Float32Array, n: number, codec: string): void => {
  if (into.length !== n) {
    throw new WireDecodeError({ reason: `${codec} message holds ${n} elements but the target buffer has ${into.length}: ranks disagree on the tensor length` })
  }
}

/**
 * A typed-array view of `count` elements at byte offset `at` of `b`. Messages straight off the
 * network may sit at any byte offset; an unaligned payload is copied once rather than read
 * element by element through a DataView.
 */
export const view = <T extends Float32Array | Uint32Array | Uint16Array>(
  ctor: { new (buffer: ArrayBufferLike, byteOffset: number, length: number): T; readonly BYTES_PER_ELEMENT: number },
  b: Uint8Array,
  at: number,
  count: number
): T => {
  const offset = b.byteOffset + at
  if (offset % ctor.BYTES_PER_ELEMENT === 0) return new ctor(b.buffer, offset, count)
  // a real copy: Buffer#slice (msgpack and NATS hand out Buffers) would return another view
  const copy = new Uint8Array(count * ctor.BYTES_PER_ELEMENT)
  copy.set(b.subarray(at, at + copy.byteLength))
  return new ctor(copy.buffer, 0, count)
}

/** Output buffer of `size` bytes: the caller's when it fits, else a fresh one. */
export const outBytes = (size: number, out?: Uint8Array): Uint8Array =>
  out && out.byteLength >= size && out.byteOffset % 4 === 0 ? out.subarray(0, size) : new Uint8Array(size)

export const outFloats = (n: number, out?: Float32Array): Float32Array => {
  if (!out) return new Float32Array(n)
  if (out.length !== n) throw new WireDecodeError({ reason: `decode target has ${out.length} elements, message holds ${n}` })
  return out
}
