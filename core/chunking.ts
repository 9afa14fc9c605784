// Chunking: NATS refuses messages above the server's max_payload (1 MiB by default), so an encoded
// message larger than that is split into self-describing frames and put back together on the
// receiving side. Core NATS is at-most-once and keeps per-publisher order on one subscription,
// so a receiver sees each sender's frames in order or not at all: any gap is loss, and a
// message whose remaining frames stop coming is dropped by expire() and reported, never awaited.
// encodeFrames fuses wire encoding and splitting so a sender copies tensor bytes once in total.
//
// Frame layout (header integers little-endian):
//
//   0   "GWC" magic, then the format version (1)
//   4   u32 chunk index
//   8   u32 chunk count
//   12  u16 message-id length in bytes (UTF-8)
//   14  u16 header length = 24 + id length rounded up to a multiple of 8
//   16  u32 + u32 total payload length (low, high)
//   24  message id, zero padding up to the header length
//   hdr the payload slice; every frame but the last carries the same number of bytes
//
// The header length is a multiple of 8 so a single-frame payload keeps the alignment of the frame
// it arrives in, and the Reassembler writes multi-frame payloads into a buffer of their own starting
// at offset 0; either way wire.ts can view tensors in place when the alignment allows.
//
// Buffer reuse (BufferPool): a fresh 64 MiB buffer costs more in page faults than copying 64 MiB
// into it, so a steady sender or receiver of large messages can pass a pool to encodeFrames /
// splitMessage (the one frame buffer comes from it) and to the Reassembler (multi-frame payloads
// come from it). Each buffer then has one owner at a time and goes back to the pool only by an
// explicit give / release, and only once nothing reads it any more:
// - sender: nats.js does NOT copy a payload in publish(); it queues a reference and copies it into
//   its outbound buffer when it flushes (inline once 32 KiB are queued, else in a microtask, and
//   only while connected: during a reconnect it keeps the reference). Give the frames back after
//   `await nc.flush()` has resolved, never right after publish().
// - receiver: decodeMessage views tensors in place, so the payload (and every tensor decoded from
//   it) must be done with before reassembler.release(payload).
import { randomBytes } from "node:crypto"
import { ChunkError, ConfigError } from "./errors.ts"
import { encodeParts } from "./wire.ts"

const MAGIC0 = 0x47 // G
const MAGIC1 = 0x57 // W
const MAGIC2 = 0x43 // C
export const CHUNK_VERSION = 1
const FIXED_HEADER = 24
/** Longest message id, in UTF-8 bytes. */
export const MAX_ID_BYTES = 1024
const MAX_COUNT = 0xffffffff

const align8 = (n: number): number => n + ((8 - (n % 8)) % 8)
const encoder = new TextEncoder()
const decoder = new TextDecoder()
const EMPTY = new Uint8Array(0)

// Ids only need to be unique among messages in flight at one receiver, which may hear many
// senders: a random per-process prefix plus a counter is enough and costs nothing per message.
const processPrefix = randomBytes(6).toString("hex")
let counter = 0
const nextMessageId = (): string => `${processPrefix}.${(counter = (counter + 1) % Number.MAX_SAFE_INTEGER)}`

/** Bytes of frame header for a message id of this many UTF-8 bytes. */
export const chunkHeaderBytes = (idBytes: number): number => align8(FIXED_HEADER + idBytes)

const writeHeader = (
  out: Uint8Array,
  at: number,
  index: number,
  count: number,
  id: Uint8Array,
  headerBytes: number,
  total: number
): void => {
  out[at] = MAGIC0
  out[at + 1] = MAGIC1
  out[at + 2] = MAGIC2
  out[at + 3] = CHUNK_VERSION
  writeU32(out, at + 4, index)
  writeU32(out, at + 8, count)
  out[at + 12] = id.length & 0xff
  out[at + 13] = id.length >>> 8
  out[at + 14] = headerBytes & 0xff
  out[at + 15] = headerBytes >>> 8
  writeU32(out, at + 16, total % 0x100000000)
  writeU32(out, at + 20, Math.floor(total / 0x100000000))
  out.set(id, at + FIXED_HEADER)
  // Buffers from allocUnsafe hold stale memory: never let it onto the network.
  out.fill(0, at + FIXED_HEADER + id.length, at + headerBytes)
}

const writeU32 = (out: Uint8Array, at: number, v: number): void => {
  out[at] = v & 0xff
  out[at + 1] = (v >>> 8) & 0xff
  out[at + 2] = (v >>> 16) & 0xff
  out[at + 3] = (v >>> 24) & 0xff
}
const readU32 = (b: Uint8Array, at: number): number => (b[at] | (b[at + 1] << 8) | (b[at + 2] << 16) | (b[at + 3] << 24)) >>> 0

/**
 * Where encodeFrames / splitMessage / the Reassembler take big buffers from. `take(n)` returns a
 * Uint8Array of exactly n bytes at offset 0 of its own ArrayBuffer, owned by the caller until it is
 * handed to `give` (any view of that ArrayBuffer will do). Contents of a taken buffer are
 * unspecified; the users in this module write every byte before it is read or sent.
 */
export interface FramePool {
  take(bytes: number): Uint8Array
  give(buffer: Uint8Array): void
}

export interface BufferPoolOptions {
  /**
   * Most bytes kept idle for reuse. Default 256 MiB. A buffer given back past this (or past
   * maxIdleBuffers) takes the place of the longest idle ones, which are left to the GC; one larger
   * than this alone is left to the GC itself.
   */
  readonly maxIdleBytes?: number
  /** Most buffers kept idle for reuse. Default 8. */
  readonly maxIdleBuffers?: number
}

/**
 * A FramePool that keeps given-back buffers for reuse, so a stream of large messages stops paying
 * the page faults of fresh allocations. A request is served by the smallest idle buffer that holds
 * it and is at most twice its size, else by a new one. A full pool keeps the buffers given back
 * last (the sizes in use now: a collective that moved to larger frames would otherwise find the
 * pool full of an earlier call's smaller buffers and allocate every frame afresh; a 64 MiB tree
 * all-reduce at p = 8 on 2 cores took 5.9x gloo's time so, after calls of smaller sizes). Lent buffers are tracked weakly: one that is
 * never given back is garbage collected as usual. Giving back a buffer that is not lent out
 * (twice, or one it never lent) throws a ChunkError instead of letting two owners share memory.
 * Not shared between threads.
 */
export class BufferPool implements FramePool {
  readonly #idle: Array<ArrayBuffer> = []
  readonly #lent = new WeakSet<ArrayBuffer>()
  readonly #maxIdleBytes: number
  readonly #maxIdleBuffers: number
  #idleBytes = 0
  /** Buffers taken, of those how many were idle ones reused, and buffers given back. */
  readonly stats = { taken: 0, reused: 0, returned: 0 }

  constructor(options: BufferPoolOptions = {}) {
    this.#maxIdleBytes = positive("BufferPool.maxIdleBytes", options.maxIdleBytes, 256 * 1024 * 1024)
    this.#maxIdleBuffers = Math.floor(positive("BufferPool.maxIdleBuffers", options.maxIdleBuffers, 8))
  }

  /** Buffers waiting for reuse. */
  get idle(): number {
    return this.#idle.length
  }

  /** Bytes held by the buffers waiting for reuse. */
  get idleBytes(): number {
    return this.#idleBytes
  }

  /** Whether this buffer (any view of it) is lent out by this pool and not yet given back. */
  owns(buffer: Uint8Array): boolean {
    return this.#lent.has(buffer.buffer as ArrayBuffer)
  }

  take(bytes: number): Uint8Array {
    if (!Number.isSafeInteger(bytes) || bytes < 0) {
      throw new ChunkError({ reason: `BufferPool.take needs a byte count, got ${bytes}`, messageId: "" })
    }
    let best = -1
    for (let i = 0; i < this.#idle.length; i++) {
      const size = this.#idle[i].byteLength
      if (size >= bytes && size <= 2 * bytes && (best < 0 || size < this.#idle[best].byteLength)) best = i
    }
    let ab: ArrayBuffer
    this.stats.taken++
    if (best >= 0) {
      this.stats.reused++
      ab = this.#idle[best]
      this.#idle.splice(best, 1)
      this.#idleBytes -= ab.byteLength
    } else {
      // allocUnsafeSlow: an ArrayBuffer of its own, exactly this size, not zeroed.
      ab = Buffer.allocUnsafeSlow(bytes).buffer as ArrayBuffer
    }
    this.#lent.add(ab)
    return Buffer.from(ab, 0, bytes)
  }

  give(buffer: Uint8Array): void {
    const ab = buffer?.buffer as ArrayBuffer | undefined
    if (ab === undefined || !this.#lent.delete(ab)) {
      throw new ChunkError({
        reason: "BufferPool.give: this buffer is not lent out by this pool (given back twice, or never taken from it)",
        messageId: ""
      })
    }
    this.stats.returned++
    if (ab.byteLength > this.#maxIdleBytes) return
    this.#idle.push(ab)
    this.#idleBytes += ab.byteLength
    // the longest idle ones make room
    let drop = 0
    while (this.#idle.length - drop > this.#maxIdleBuffers || this.#idleBytes > this.#maxIdleBytes) this.#idleBytes -= this.#idle[drop++].byteLength
    if (drop > 0) this.#idle.splice(0, drop)
  }
}

/** Options of encodeFrames and splitMessage. */
export interface FrameOptions {
  /**
   * Take the one buffer all frames are views of from this pool instead of allocating it. The
   * caller gives it back with `pool.give(frames[0])` once the frames are sent AND the NATS client
   * has copied them (after `await nc.flush()`; see the note at the top of this module).
   */
  readonly pool?: FramePool
}

/** Where frame writing puts message bytes: `at` and `from`/`to` are offsets in the whole message. */
interface Sink {
  put(bytes: Uint8Array, at: number): void
  zero(from: number, to: number): void
}

// Lays out frames for a message of `total` bytes and lets `fill` write the message through a Sink
// that maps message offsets to frame offsets, so the bytes are copied once, straight into frames.
// All frames are views of one allocation (Buffer.allocUnsafe: fill must cover every byte).
const writeFrames = (
  total: number,
  maxPayload: number,
  messageId: string | number | undefined,
  fill: (sink: Sink) => void,
  pool: FramePool | undefined
): Array<Uint8Array> => {
  const given = messageId === undefined ? undefined : String(messageId)
  if (!Number.isSafeInteger(maxPayload) || maxPayload <= 0) {
    throw new ChunkError({ reason: `maxPayload must be a positive integer, got ${maxPayload}`, messageId: given ?? "" })
  }
  let id = given === undefined ? EMPTY : encoder.encode(given)
  if (id.length > MAX_ID_BYTES) {
    throw new ChunkError({ reason: `message id is ${id.length} bytes, above the limit of ${MAX_ID_BYTES}`, messageId: given ?? "" })
  }
  let headerBytes = chunkHeaderBytes(id.length)
  if (total + headerBytes <= maxPayload) {
    const frame = allocate(pool, headerBytes + total, given ?? "")
    try {
      writeHeader(frame, 0, 0, 1, id, headerBytes, total)
      fill({
        put: (bytes, at) => frame.set(bytes, headerBytes + at),
        zero: (from, to) => frame.fill(0, headerBytes + from, headerBytes + to)
      })
    } catch (error) {
      pool?.give(frame)
      throw error
    }
    return [frame]
  }
  const idText = given ?? nextMessageId()
  if (given === undefined) {
    id = encoder.encode(idText)
    headerBytes = chunkHeaderBytes(id.length)
  }
  const per = maxPayload - headerBytes
  if (per < 1) {
    throw new ChunkError({
      reason: `maxPayload ${maxPayload} cannot hold a ${headerBytes}-byte chunk header and any data`,
      messageId: idText
    })
  }
  const count = Math.ceil(total / per)
  if (count > MAX_COUNT) {
    throw new ChunkError({ reason: `${total} bytes would need ${count} chunks, above ${MAX_COUNT}`, messageId: idText })
  }
  const out = allocate(pool, total + count * headerBytes, idText)
  try {
    return fillFrames(out, total, per, count, id, headerBytes, fill)
  } catch (error) {
    pool?.give(out)
    throw error
  }
}

const allocate = (pool: FramePool | undefined, bytes: number, messageId: string): Uint8Array => {
  if (pool === undefined) return Buffer.allocUnsafe(bytes)
  const b = pool.take(bytes)
  if (!(b instanceof Uint8Array) || b.length !== bytes) {
    throw new ChunkError({ reason: `pool.take(${bytes}) returned ${b instanceof Uint8Array ? `${b.length} bytes` : "no Uint8Array"}`, messageId })
  }
  return b
}

const fillFrames = (
  out: Uint8Array,
  total: number,
  per: number,
  count: number,
  id: Uint8Array,
  headerBytes: number,
  fill: (sink: Sink) => void
): Array<Uint8Array> => {
  const frames = new Array<Uint8Array>(count)
  for (let i = 0, at = 0; i < count; i++) {
    const len = Math.min(per, total - i * per)
    writeHeader(out, at, i, count, id, headerBytes, total)
    frames[i] = out.subarray(at, at + headerBytes + len)
    at += headerBytes + len
  }
  // Message offset m lives in frame floor(m / per), after that frame's header.
  const physical = (m: number): number => m + (Math.floor(m / per) + 1) * headerBytes
  fill({
    put: (bytes, at) => {
      let done = 0
      while (done < bytes.length) {
        const m = at + done
        const n = Math.min(per - (m % per), bytes.length - done)
        out.set(bytes.subarray(done, done + n), physical(m))
        done += n
      }
    },
    zero: (from, to) => {
      for (let m = from; m < to; ) {
        const n = Math.min(per - (m % per), to - m)
        out.fill(0, physical(m), physical(m) + n)
        m += n
      }
    }
  })
  return frames
}

/**
 * Splits an encoded message into frames of at most `maxPayload` bytes each (header included).
 * A payload that fits, header included, becomes a single frame. The payload is copied once, into
 * one allocation that all frames are views of (taken from `options.pool` when given; see FrameOptions
 * for when to give it back). `messageId` must be unique among this sender's
 * messages in flight (one is generated when omitted and needed). Throws ChunkError when
 * `maxPayload` cannot hold a header and at least one payload byte.
 */
export const splitMessage = (
  payload: Uint8Array,
  maxPayload: number,
  messageId?: string | number,
  options: FrameOptions = {}
): Array<Uint8Array> => {
  if (!(payload instanceof Uint8Array)) {
    throw new ChunkError({ reason: "payload must be a Uint8Array", messageId: messageId === undefined ? "" : String(messageId) })
  }
  return writeFrames(payload.byteLength, maxPayload, messageId, (sink) => sink.put(payload, 0), options.pool)
}

/**
 * encodeMessage + splitMessage with one copy instead of two: tensor bytes go from the caller's
 * arrays straight into the frames. The frames reassemble to exactly encodeMessage(value).
 * Throws WireEncodeError (bad value) or ChunkError (bad maxPayload / id).
 */
export const encodeFrames = (
  value: unknown,
  maxPayload: number,
  messageId?: string | number,
  options: FrameOptions = {}
): Array<Uint8Array> => {
  const parts = encodeParts(value)
  return writeFrames(
    parts.byteLength,
    maxPayload,
    messageId,
    (sink) => {
      sink.put(parts.head, 0)
      let end = parts.head.length
      for (const { bytes, offset } of parts.blobs) {
        sink.zero(end, offset)
        sink.put(bytes, offset)
        end = offset + bytes.byteLength
      }
    },
    options.pool
  )
}

export interface ReassemblerOptions {
  /** Largest message accepted; a frame announcing more is refused before anything is allocated. Default 2 GiB. */
  readonly maxMessageBytes?: number
  /** Cap on the bytes held by all incomplete messages together. Default 4 GiB. */
  readonly maxPendingBytes?: number
  /** An incomplete message with no new frame for this long is dropped by expire(). Default 10 s. */
  readonly timeoutMs?: number
  /** Clock in milliseconds (tests inject one). Default Date.now. */
  readonly now?: () => number
  /**
   * Take multi-frame payload buffers from this pool instead of allocating each one. A delivered
   * payload then belongs to the caller until it calls `release(payload)`; the buffers of messages
   * that fail or expire go back to the pool by themselves.
   */
  readonly pool?: FramePool
}

interface Incomplete {
  readonly count: number
  readonly total: number
  readonly chunkSize: number
  readonly buffer: Uint8Array
  filled: number
  next: number
  deadline: number
}

interface Header {
  readonly index: number
  readonly count: number
  readonly total: number
  readonly headerBytes: number
  readonly id: string
}

// How long and how many ids of finished messages (delivered or failed) are remembered, so the
// leftovers of a failed message are dropped quietly (one error per message, not one per frame)
// and a stray repeat of a delivered message's frame is named as a duplicate.
const MAX_RECENT = 4096

/**
 * Puts chunked messages back together. Frames of several messages (different ids) may interleave;
 * frames of one message must arrive in order. Not shared between threads.
 */
export class Reassembler {
  readonly #partial = new Map<string, Incomplete>()
  readonly #recent = new Map<string, { readonly delivered: boolean; readonly until: number }>()
  readonly #maxMessageBytes: number
  readonly #maxPendingBytes: number
  readonly #timeoutMs: number
  readonly #now: () => number
  readonly #pool: FramePool | undefined
  // Pooled payloads handed out and not yet released, by buffer: release() accepts only the very
  // view push() returned, so a stale second release cannot free a buffer lent out again since.
  readonly #delivered = new WeakMap<ArrayBuffer, Uint8Array>()
  #pendingBytes = 0

  constructor(options: ReassemblerOptions = {}) {
    this.#maxMessageBytes = positive("Reassembler.maxMessageBytes", options.maxMessageBytes, 2 * 1024 ** 3)
    this.#maxPendingBytes = positive("Reassembler.maxPendingBytes", options.maxPendingBytes, 4 * 1024 ** 3)
    this.#timeoutMs = positive("Reassembler.timeoutMs", options.timeoutMs, 10_000)
    this.#now = options.now ?? Date.now
    this.#pool = options.pool
  }

  /**
   * Gives a payload returned by push() back to the pool (option `pool`), for reuse by a later
   * message. Call it only once nothing reads the payload, nor any tensor decoded from it, any more.
   * Returns true when the buffer went back; false for a payload that did not come from the pool
   * (a single-frame payload is a view into its frame; no pool configured) or that was already
   * released, so a consumer can release every payload it got without tracking which were pooled.
   */
  release(payload: Uint8Array): boolean {
    const ab = payload?.buffer as ArrayBuffer | undefined
    if (this.#pool === undefined || ab === undefined || this.#delivered.get(ab) !== payload) return false
    this.#delivered.delete(ab)
    this.#pool.give(payload)
    return true
  }

  /** Incomplete messages currently held. */
  get pending(): number {
    return this.#partial.size
  }

  /** Bytes allocated for incomplete messages. */
  get pendingBytes(): number {
    return this.#pendingBytes
  }

  /**
   * Takes one frame; returns the whole payload when this frame completes a message, else
   * undefined. A single-frame message is returned as a view into `frame` (no copy); a multi-frame
   * one in a buffer of its own, allocated once at its full size (or taken from the pool), starting
   * at offset 0 (8-aligned).
   * Throws ChunkError for a foreign or malformed frame, a duplicated, missing or out-of-order
   * chunk, a count/length that disagrees with earlier frames, or a message above the size limits.
   * After an error the message's state is dropped and its later frames are ignored; other
   * messages are unaffected.
   */
  push(frame: Uint8Array): Uint8Array | undefined {
    const h = parseHeader(frame)
    const sliceBytes = frame.length - h.headerBytes
    const now = this.#now()
    let p = this.#partial.get(h.id)

    if (h.count === 1) {
      if (p !== undefined) {
        this.#fail(h.id, now, `a single-frame message arrived while chunk ${p.next} of ${p.count} of this id was expected`)
      }
      if (sliceBytes !== h.total) {
        throw new ChunkError({ reason: `frame carries ${sliceBytes} bytes of a ${h.total}-byte message`, messageId: h.id })
      }
      return frame.subarray(h.headerBytes)
    }

    if (h.id === "") {
      throw new ChunkError({ reason: `chunk ${h.index} of ${h.count} has no message id`, messageId: "" })
    }
    if (p === undefined) {
      if (h.index !== 0) {
        const recent = this.#recent.get(h.id)
        if (recent !== undefined && recent.until > now) {
          if (!recent.delivered) return undefined // rest of a message already reported as failed
          this.#fail(h.id, now, `duplicated chunk ${h.index} of ${h.count} of a message already delivered`)
        }
        this.#fail(
          h.id,
          now,
          `missing chunk ${h.index === 1 ? "0" : `0-${h.index - 1}`} of ${h.count}: the first chunk seen is ${h.index}`
        )
      }
      this.#recent.delete(h.id)
      p = this.#start(h, sliceBytes, now)
    } else {
      if (h.count !== p.count || h.total !== p.total) {
        this.#fail(
          h.id,
          now,
          `chunk ${h.index} says ${h.count} chunks / ${h.total} bytes, earlier chunks said ${p.count} / ${p.total}`
        )
      }
      if (h.index < p.next) this.#fail(h.id, now, `duplicated chunk ${h.index} of ${h.count}`)
      if (h.index > p.next) {
        this.#fail(
          h.id,
          now,
          `missing chunk ${h.index - 1 === p.next ? p.next : `${p.next}-${h.index - 1}`} of ${h.count}: chunk ${h.index} arrived next`
        )
      }
      const expected = h.index === p.count - 1 ? p.total - p.filled : p.chunkSize
      if (sliceBytes !== expected) {
        this.#fail(h.id, now, `chunk ${h.index} of ${h.count} carries ${sliceBytes} bytes, expected ${expected}`)
      }
    }

    p.buffer.set(frame.subarray(h.headerBytes), p.filled) // the one copy on this side
    p.filled += sliceBytes
    p.next++
    p.deadline = now + this.#timeoutMs
    if (p.next < p.count) return undefined
    this.#partial.delete(h.id)
    this.#pendingBytes -= p.total
    this.#remember(h.id, true, now)
    if (this.#pool !== undefined) this.#delivered.set(p.buffer.buffer as ArrayBuffer, p.buffer)
    return p.buffer
  }

  /**
   * Drops every incomplete message that has had no frame for `timeoutMs` and returns one
   * ChunkError ("missing chunk ...") per dropped message. Call it periodically, e.g. every
   * timeoutMs / 2, or before giving up on a message you are waiting for.
   */
  expire(nowMs: number = this.#now()): Array<ChunkError> {
    const errors: Array<ChunkError> = []
    for (const [id, p] of this.#partial) {
      if (p.deadline > nowMs) continue
      this.#drop(id, p)
      this.#remember(id, false, nowMs)
      errors.push(
        new ChunkError({
          reason:
            `missing chunk ${p.next} of ${p.count}: nothing arrived for ${this.#timeoutMs} ms ` +
            `(had ${p.next} chunks, ${p.filled} of ${p.total} bytes)`,
          messageId: id
        })
      )
    }
    for (const [id, r] of this.#recent) if (r.until <= nowMs) this.#recent.delete(id)
    return errors
  }

  #start(h: Header, sliceBytes: number, now: number): Incomplete {
    if (h.total > this.#maxMessageBytes) {
      this.#fail(h.id, now, `message of ${h.total} bytes is above the limit of ${this.#maxMessageBytes} bytes (maxMessageBytes)`)
    }
    if (this.#pendingBytes + h.total > this.#maxPendingBytes) {
      this.#fail(
        h.id,
        now,
        `${h.total} more bytes would put incomplete messages above ${this.#maxPendingBytes} bytes (maxPendingBytes)`
      )
    }
    // Every chunk but the last has chunkSize bytes, so count and total must agree with it now,
    // before we allocate total bytes on the word of one frame.
    const chunkSize = sliceBytes
    if (chunkSize === 0 || (h.count - 1) * chunkSize >= h.total || h.count * chunkSize < h.total) {
      this.#fail(h.id, now, `${h.count} chunks of ${chunkSize} bytes cannot make a ${h.total}-byte message`)
    }
    let buffer: Uint8Array
    try {
      // allocUnsafeSlow: its own ArrayBuffer at offset 0, not zeroed (every byte is written
      // before the payload is handed out); a pool's buffers are alike.
      buffer = this.#pool === undefined ? Buffer.allocUnsafeSlow(h.total) : this.#pool.take(h.total)
      if (!(buffer instanceof Uint8Array) || buffer.length !== h.total || buffer.byteOffset !== 0) {
        throw new Error(`the pool returned a buffer of ${buffer?.length} bytes at offset ${buffer?.byteOffset}`)
      }
    } catch (error) {
      return this.#fail(h.id, now, `cannot allocate ${h.total} bytes: ${error instanceof Error ? error.message : String(error)}`)
    }
    const p: Incomplete = { count: h.count, total: h.total, chunkSize, buffer, filled: 0, next: 0, deadline: 0 }
    this.#partial.set(h.id, p)
    this.#pendingBytes += h.total
    return p
  }

  #drop(id: string, p: Incomplete): void {
    this.#partial.delete(id)
    this.#pendingBytes -= p.total
    this.#pool?.give(p.buffer) // never handed out: nobody else reads it
  }

  #remember(id: string, delivered: boolean, now: number): void {
    this.#recent.delete(id) // re-insert so the Map's order stays oldest-first
    this.#recent.set(id, { delivered, until: now + this.#timeoutMs })
    if (this.#recent.size > MAX_RECENT) this.#recent.delete(this.#recent.keys().next().value!)
  }

  #fail(id: string, now: number, reason: string): never {
    const p = this.#partial.get(id)
    if (p !== undefined) this.#drop(id, p)
    this.#remember(id, false, now)
    throw new ChunkError({ reason, messageId: id })
  }
}

const positive = (field: string, value: number | undefined, fallback: number): number => {
  if (value === undefined) return fallback
  if (typeof value !== "number" || !(value > 0) || !Number.isFinite(value)) {
    throw new ConfigError({ field, reason: `must be a positive number, got ${value}` })
  }
  return value
}

const parseHeader = (frame: Uint8Array): Header => {
  if (!(frame instanceof Uint8Array)) {
    throw new ChunkError({ reason: "frame must be a Uint8Array", messageId: "" })
  }
  if (frame.length < FIXED_HEADER || frame[0] !== MAGIC0 || frame[1] !== MAGIC1 || frame[2] !== MAGIC2) {
    throw new ChunkError({ reason: `not a gradwire chunk frame (${frame.length} bytes, bad magic or too short)`, messageId: "" })
  }
  if (frame[3] !== CHUNK_VERSION) {
    throw new ChunkError({
      reason: `chunk format version ${frame[3]} is not supported (this gradwire speaks version ${CHUNK_VERSION})`,
      messageId: ""
    })
  }
  const index = readU32(frame, 4)
  const count = readU32(frame, 8)
  const idBytes = frame[12] | (frame[13] << 8)
  const headerBytes = frame[14] | (frame[15] << 8)
  const totalHigh = readU32(frame, 20)
  const total = readU32(frame, 16) + totalHigh * 0x100000000
  if (idBytes > MAX_ID_BYTES || headerBytes !== chunkHeaderBytes(idBytes) || headerBytes > frame.length) {
    throw new ChunkError({ reason: `malformed chunk header (id ${idBytes} bytes, header ${headerBytes} bytes)`, messageId: "" })
  }
  const id = idBytes === 0 ? "" : decoder.decode(frame.subarray(FIXED_HEADER, FIXED_HEADER + idBytes))
  if (count === 0 || index >= count) {
    throw new ChunkError({ reason: `malformed chunk header (chunk ${index} of ${count})`, messageId: id })
  }
  if (totalHigh >= 0x200000) {
    throw new ChunkError({ reason: "malformed chunk header (total length above 2^53)", messageId: id })
  }
  return { index, count, total, headerBytes, id }
}
