// Receiving large messages without the quadratic-ish buffer growth of the nats.js parser.
//
// nats.js (@nats-io/nats-core 3.x) reassembles a message that spans socket reads in a DenoBuffer
// that starts at the size of the first read's remainder and doubles as reads arrive: a 1 MiB
// message read in 64 KiB pieces is allocated 4 times and its bytes copied about 2.6 times. The
// parser knows the final size (the MSG line's byte count) from the start, so before each read is
// parsed we grow a pending message buffer once to hold the whole message: one allocation and one
// copy of what had arrived. The parser's own logic is untouched; we only reserve capacity through
// DenoBuffer's public grow(). Measured on a 64 MiB all-reduce at p = 4 (bench compression):
// see docs/benchmarks.md.
//
// From 64 KiB on, that buffer comes from a pool instead of a fresh allocation: a collective that
// is done with a received message (added it in, copied it out, or published it on) gives it back
// with releaseReceived, and the next large message is read into it. Fresh buffers per message
// cost page faults and external memory that V8 answers with garbage collections; on a 64 MiB
// all-reduce at p = 4 the ranks' GC time fell from about 140 to 30 ms per step (--cpu-prof).
// A message nobody gives back is left to the collector as before.
//
// The same hook lets the socket's read buffers be reused (read.ts): the views the parser hands
// on from a read (a message that fits in it, the message's subject and reply, an -ERR or INFO
// argument) are copied as they are dispatched, and the read buffer goes back after the parse.
//
// Installed by index.ts's installNatsPatches, and only after shapes.ts has found what this relies
// on (Parser.prototype.parse, its `dispatcher`, `ma.size`, and a pending `msgBuf` with `capacity`,
// `length`, `grow`, `_buf` and `_off`). The checks below stay: they cost a few property reads per
// parse and keep a state the probe did not reach (no pending message) on nats.js's own path.
import { BufferPool } from "../chunking.ts"
import { isReadView, releaseRead } from "./read.ts"

const WRAPPED = Symbol.for("gradwire.natsDispatchWrapped")

interface PendingBuffer {
  readonly capacity: number
  readonly length: number
  grow(n: number): void
  /** DenoBuffer's contents are _buf[_off..]; a pooled buffer is swapped in through these. */
  _buf?: Uint8Array
  _off?: number
}
interface ParserState {
  msgBuf?: PendingBuffer
  ma?: { size?: number }
}

/** Messages from this size on are received into pooled buffers (when the consumer gives them back). */
export const RECEIVE_POOL_MIN_BYTES = 64 * 1024
/** At most 64 MiB of idle buffers kept (a window's worth of 1 MiB chunks and more). */
const pool = new BufferPool({ maxIdleBytes: 64 * 1024 * 1024, maxIdleBuffers: 64 })
/** Buffers taken for messages, reused from the pool, and given back (tests). */
export const receivePoolStats = pool.stats
/** Buffers released and waiting for the end of the current task to go back. */
const releasing = new WeakSet<ArrayBuffer>()

/** Whether `data` is a view of a pooled receive buffer not yet given back (send.ts copies those when it cannot flush at once). */
export const isPooledReceive = (data: Uint8Array): boolean => pool.owns(data)

/**
 * A buffer from the receive pool for a message received by other means (the collectives' direct
 * path): releaseReceived gives it back like a NATS message's.
 */
export const takeReceiveBuffer = (bytes: number): Uint8Array => pool.take(bytes)

/**
 * Gives the buffer of a received message back for later messages, once its consumer is done with
 * every view of it (a collective that has added it in, copied it out, or published it on). Views
 * of other buffers are ignored, as is a second release. The buffer is reused only after the
 * current task, so a publish of it that nats.js flushes in a microtask has been copied out first.
 */
export const releaseReceived = (data: Uint8Array): void => {
  const b = data.buffer as ArrayBuffer
  if (!pool.owns(data) || releasing.has(b)) return
  releasing.add(b)
  setImmediate(() => {
    releasing.delete(b)
    pool.give(data)
  })
}

const MARK = Symbol.for("gradwire.natsReceivePatch")

/** Wraps `Parser.prototype.parse` (shapes.ts has checked it); a second call does nothing. */
export const installReceivePatch = (Parser: { prototype: object }): void => {
  const proto = Parser.prototype as Record<PropertyKey, unknown>
  if (proto[MARK]) return
  const parse = proto.parse as (this: ParserState, buf: Uint8Array) => void
  proto.parse = function (this: ParserState, buf: Uint8Array): void {
    const pending = this.msgBuf
    const size = this.ma?.size
    if (pending && typeof size === "number" && pending.capacity < size && size > pending.length) {
      const cur = pending._buf
      if (size >= RECEIVE_POOL_MIN_BYTES && cur instanceof Uint8Array && typeof pending._off === "number") {
        // the message's bytes so far into a pooled buffer that holds it whole
        const into = new Uint8Array(pool.take(size).buffer, 0, cur.length - pending._off)
        into.set(cur.subarray(pending._off))
        pending._buf = into
        pending._off = 0
      } else if (typeof pending.grow === "function") {
        pending.grow(size - pending.length)
      }
    }
    // views of a pooled read buffer leave the parser only through its dispatcher: copy them there
    // (new Uint8Array(view) copies whatever the view's class; a Buffer's slice() would not)
    const d = (this as { dispatcher?: { push(item: unknown): void } }).dispatcher
    if (d && typeof d.push === "function" && !(d as { [WRAPPED]?: boolean })[WRAPPED]) {
      const real = d
      ;(this as { dispatcher?: unknown }).dispatcher = {
        [WRAPPED]: true,
        push(item: { data?: unknown; msg?: { subject?: unknown; reply?: unknown } }): void {
          if (isReadView(item.data)) item.data = new Uint8Array(item.data)
          if (item.msg) {
            if (isReadView(item.msg.subject)) item.msg.subject = new Uint8Array(item.msg.subject)
            if (isReadView(item.msg.reply)) item.msg.reply = new Uint8Array(item.msg.reply)
          }
          real.push(item)
        }
      }
    }
    parse.call(this, buf)
    // the read buffer back to read.ts's pool, unless a view could have escaped unwrapped
    if ((this as { dispatcher?: { [WRAPPED]?: boolean } }).dispatcher?.[WRAPPED]) releaseRead(buf)
  }
  proto[MARK] = true
}
