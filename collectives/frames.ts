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
//         or all-gather's own), high byte the call's options (Variant below)
//   6 u16 pieces: 0, or the number of NATS messages a data frame larger than max_payload was
//         split into (every piece carries the frame's header; Flag.more on all but the last)
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
  ackNow: 4,
  /** A piece of a frame split over several NATS messages, with more of it to follow (splitFrame). */
  more: 8
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
  /** 0, or how many messages the frame was split into (this is one piece of it: splitFrame). */
  readonly pieces: number
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
  return scratchHeaders()
}

/** The NATS header block for the 40 bytes in `scratch`. */
const scratchHeaders = (): MsgHdrs => {
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
    pieces: v.getUint16(6, true),
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

/**
 * A data frame's payload cut into pieces of at most `maxBody` bytes (a multiple of 4), each with
 * the frame's header plus its piece count and, on all but the last, Flag.more: for a frame that
 * must go through NATS but exceeds its max_payload (the direct links carry larger frames). The
 * receiver puts them together again (FrameAssembler). Undefined when the payload fits as it is.
 */
export const splitFrame = (h: MsgHdrs, payload: Uint8Array, maxBody: number): Array<{ headers: MsgHdrs; data: Uint8Array }> | undefined => {
  if (payload.length <= maxBody) return undefined
  const piece = Math.max(4, maxBody - (maxBody % 4))
  const count = Math.ceil(payload.length / piece)
  if (count > 0xffff || !headerBytesInto(h, scratch)) return undefined
  const out: Array<{ headers: MsgHdrs; data: Uint8Array }> = []
  const flags = view.getUint8(2)
  view.setUint16(6, count, true)
  for (let i = 0; i < count; i++) {
    view.setUint8(2, i < count - 1 ? flags | Flag.more : flags & ~Flag.more)
    out.push({ headers: scratchHeaders(), data: payload.subarray(i * piece, Math.min(payload.length, (i + 1) * piece)) })
  }
  return out
}

/**
 * Puts split frames (splitFrame) together again. Pieces of one frame come from one sender on one
 * subject, so in order; each is copied into a buffer from `take` (sized for the piece count) and
 * handed to `release`, and the last one yields the whole frame, with the wire bytes the sender
 * counted for it. A piece that does not fit what the first announced drops the frame (its call
 * then fails at its deadline, naming the sender).
 */
export class FrameAssembler {
  readonly #open = new Map<string, { seq: number; buf: Uint8Array; at: number }>()
  readonly #take: (bytes: number) => Uint8Array
  readonly #release: (payload: Uint8Array) => void
  constructor(take: (bytes: number) => Uint8Array, release: (payload: Uint8Array) => void) {
    this.#take = take
    this.#release = release
  }

  /** Frames being put together now. */
  get open(): number {
    return this.#open.size
  }

  /** Frames put together so far. */
  assembled = 0

  /** The whole frame once `f` was its last piece; undefined while pieces are missing (or it was dropped). */
  add(f: Frame): Frame | undefined {
    const key = `${f.src}/${f.seq}/${f.step}/${f.chunk}/${f.offset}/${f.flags & Flag.fanout}`
    let o = this.#open.get(key)
    if (!o) {
      // a frame's first piece opens it (one whose first piece was dropped is dropped whole)
      if (f.pieces < 2 || !(f.flags & Flag.more)) {
        this.#release(f.payload)
        return undefined
      }
      o = { seq: f.seq, buf: this.#take(f.pieces * f.payload.length), at: 0 }
      this.#open.set(key, o)
    }
    if (o.at + f.payload.length > o.buf.length) {
      this.#open.delete(key)
      this.#release(f.payload)
      return undefined
    }
    o.buf.set(f.payload, o.at)
    o.at += f.payload.length
    this.#release(f.payload)
    if (f.flags & Flag.more) return undefined
    this.#open.delete(key)
    this.assembled++
    const payload = o.buf.subarray(0, o.at)
    return { ...f, flags: f.flags & ~Flag.more, pieces: 0, payload, wireBytes: HEADER_BYTES + payload.length }
  }

  /** Drops the pieces of call `seq` (it ended: one that failed halfway may leave some). */
  drop(seq: number): void {
    for (const [k, o] of this.#open) if (o.seq === seq) this.#open.delete(k)
  }

  clear(): void {
    this.#open.clear()
  }
}

/** A control message (hello, ping, pong, abort): header plus a JSON body. */
export const controlMessage = (kind: number, src: number, body: unknown): { headers: MsgHdrs; data: Uint8Array } => ({
  headers: frameHeaders(kind, 0, 0, 0, 0, src, 0, 0, 0, 0, 0),
  data: new TextEncoder().encode(JSON.stringify(body))
})

export const controlBody = (frame: Frame): unknown => JSON.parse(new TextDecoder().decode(frame.payload))
