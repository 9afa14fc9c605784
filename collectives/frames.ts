// The frame every collective message is: a fixed 40-byte binary header, carried in a NATS message
// header (hex, under "Gw"), and the payload as the message body: raw fp32 or fp16 bytes for data,
// a little JSON for control. Keeping the header out of the body lets a sender publish a view of
// its Float32Array as is (no staging copy per chunk) and lets a receiver reduce straight from the
// received bytes; the header's length is padded so the body lands 4-byte aligned.
//
// The header carries what a receiver needs to check a frame against its own call: which
// collective and options (opcode, variant), the buffer length (mismatches become a typed error),
// step, chunk and element offset; and a number: the partial weight for data, the cumulative bytes
// consumed for acks.
//
//   0 u8  magic 0x67         1 u8 kind            2 u8 flags        3 u8 opcode
//   4 u16 variant: low byte the algorithm's code (an all-reduce's registry code, or a broadcast's
//         or all-gather's own), high byte the call's options (Variant below)      6..7 reserved
//   8 u32 seq               12 u32 src           16 u32 step       20 u32 chunk
//  24 u32 length (elements of the whole buffer)  28 u32 offset (element offset of the payload)
//  32 f64 value
import { headers, type Msg, type MsgHdrs } from "@nats-io/nats-core"

export const HEADER_BYTES = 40
const MAGIC = 0x67
const HEADER_KEY = "Gw"
// "NATS/1.0\r\n" + "Gw: " + value + "\r\n\r\n" = 18 + value bytes; 2 pad chars + 80 hex = 100, a multiple of 4.
const PAD = "--"
/** Bytes the NATS header block adds to every message: max_payload must hold it plus the body. */
export const HEADER_BLOCK_BYTES = 100

export const Kind = {
  data: 1,
  ack: 2,
  hello: 3,
  abort: 4,
  ping: 5,
  pong: 6
} as const

export const Flag = {
  /** Payload is binary16 bits. */
  half: 1,
  /** Data frame published to a fan-out subject; its ack is for the sender's fan-out window. */
  fanout: 2,
  /** The sender's window is (nearly) full after this frame: acknowledge it as soon as it is consumed. */
  ackNow: 4
} as const

/** Which collective a data frame belongs to. */
export const Opcode = {
  barrier: 1,
  broadcast: 2,
  allGather: 3,
  reduceScatter: 4,
  allReduce: 5,
  shift: 6,
  /** Two ranks send each other a block (the direct links' per-pair timing); the others take their turn. */
  exchange: 7
} as const

/**
 * A frame's variant, one number the receiver compares with its own call's: the algorithm's code
 * (a whole byte, so up to 256 all-reduce algorithms) and the options every rank must agree on.
 */
export const Variant = {
  /** The reduce op's code (0-3), shifted into the options byte. */
  reduceShift: 8,
  reduceMask: 3 << 8,
  /** Values travel as binary16. */
  half: 1 << 10,
  /** An algorithm that can fan out was asked not to (relays instead). */
  relay: 1 << 11
} as const

export const variantOf = (algorithm: number, reduce: number, half: boolean, relay = false): number =>
  (algorithm & 0xff) | (reduce << Variant.reduceShift) | (half ? Variant.half : 0) | (relay ? Variant.relay : 0)

export interface Frame {
  readonly kind: number
  readonly flags: number
  readonly opcode: number
  readonly variant: number
  readonly seq: number
  readonly src: number
  readonly step: number
  readonly chunk: number
  readonly length: number
  readonly offset: number
  readonly value: number
  /** The message body (a view into the received bytes). */
  readonly payload: Uint8Array
  /** What the frame counts against its link's credits: header + payload. */
  readonly wireBytes: number
}

const scratch = new Uint8Array(HEADER_BYTES)
const view = new DataView(scratch.buffer)

/** The NATS header block for a frame header. */
export const frameHeaders = (
  kind: number,
  flags: number,
  opcode: number,
  variant: number,
  seq: number,
  src: number,
  step: number,
  chunk: number,
  length: number,
  offset: number,
  value: number
): MsgHdrs => {
  view.setUint8(0, MAGIC)
  view.setUint8(1, kind)
  view.setUint8(2, flags)
  view.setUint8(3, opcode)
  view.setUint16(4, variant, true)
  view.setUint16(6, 0, true)
  view.setUint32(8, seq, true)
  view.setUint32(12, src, true)
  view.setUint32(16, step, true)
  view.setUint32(20, chunk, true)
  view.setUint32(24, length, true)
  view.setUint32(28, offset, true)
  view.setFloat64(32, value, true)
  const h = headers()
  h.set(HEADER_KEY, PAD + Buffer.from(scratch.buffer, 0, HEADER_BYTES).toString("hex"))
  return h
}

/** Parses a received message; undefined for messages that are not collective frames. */
export const readFrame = (msg: Msg): Frame | undefined => {
  const value = msg.headers?.get(HEADER_KEY)
  if (!value || value.length !== PAD.length + 2 * HEADER_BYTES) return undefined
  const bytes = Buffer.from(value.slice(PAD.length), "hex")
  return frameOf(bytes, msg.data)
}

/** A frame from its 40 header bytes and its payload (the direct path's framing); undefined when they are no frame header. */
export const frameOf = (bytes: Uint8Array, payload: Uint8Array): Frame | undefined => {
  if (bytes.length !== HEADER_BYTES || bytes[0] !== MAGIC) return undefined
  const v = new DataView(bytes.buffer, bytes.byteOffset, HEADER_BYTES)
  return {
    kind: v.getUint8(1),
    flags: v.getUint8(2),
    opcode: v.getUint8(3),
    variant: v.getUint16(4, true),
    seq: v.getUint32(8, true),
    src: v.getUint32(12, true),
    step: v.getUint32(16, true),
    chunk: v.getUint32(20, true),
    length: v.getUint32(24, true),
    offset: v.getUint32(28, true),
    value: v.getFloat64(32, true),
    payload,
    wireBytes: HEADER_BYTES + payload.length
  }
}

/** Writes the 40 header bytes a NATS header block carries into `out` (the direct path sends them raw); false when it holds none. */
export const headerBytesInto = (h: MsgHdrs, out: Uint8Array): boolean => {
  const value = h.get(HEADER_KEY)
  if (!value || value.length !== PAD.length + 2 * HEADER_BYTES) return false
  return Buffer.from(out.buffer, out.byteOffset, HEADER_BYTES).write(value.slice(PAD.length), "hex") === HEADER_BYTES
}

/** A control message (hello, ping, pong, abort): header plus a JSON body. */
export const controlMessage = (kind: number, src: number, body: unknown): { headers: MsgHdrs; data: Uint8Array } => ({
  headers: frameHeaders(kind, 0, 0, 0, 0, src, 0, 0, 0, 0, 0),
  data: new TextEncoder().encode(JSON.stringify(body))
})

export const controlBody = (frame: Frame): unknown => JSON.parse(new TextDecoder().decode(frame.payload))
