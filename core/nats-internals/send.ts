// Sending large messages without a fresh buffer per flush.
//
// nats.js (@nats-io/nats-core 3.x) queues a publish as [protocol line, payload, CRLF] in its
// outbound DataBuffer and, on flush, packs them into a new Uint8Array of their total size, which
// it hands to socket.write. For a 1 MiB gradient chunk that is a fresh 1 MiB allocation per
// message: page faults on first touch, and external memory that V8 answers with garbage
// collections ("external memory pressure"; with the receive side's per-message buffers, about 60
// ms per rank per step on a 64 MiB all-reduce at p = 4, counted with --trace-gc, before this and
// the receive pool of receive.ts). Here large flushes pack into buffers taken from a pool, and a
// buffer goes back to the pool when the socket's write callback says the kernel has the bytes.
// The bytes written and their order are unchanged: the same one copy into one buffer, one write.
//
// nats.js keeps a published payload by reference until it flushes, which is at once or in a
// microtask while connected, but not before a reconnect while disconnected. A received message
// that a collective passes on is given back to the receive pool (receive.ts) after the
// current task; so while the connection cannot flush, such a payload is copied when published.
//
// Installed by index.ts's installNatsPatches, and only after shapes.ts has found what this relies
// on (ProtocolHandler.prototype.flushPending and sendCommand, an outbound with `buffers`,
// `byteLength` and `reset`, a transport with a `_send` that returns a promise settled by the write
// callback). The per-flush checks below stay: a handler that is not connected yet, or a transport
// without `_send`, keeps nats.js's own flush.
import { BufferPool } from "../chunking.ts"
import { isPooledReceive } from "./receive.ts"

/** Flushes below this many bytes keep nats.js's own packing (small buffers are cheap to allocate). */
export const SEND_POOL_MIN_BYTES = 64 * 1024
/** At most 64 MiB of idle buffers kept (a window's worth of 1 MiB chunks and more). */
const pool = new BufferPool({ maxIdleBytes: 64 * 1024 * 1024, maxIdleBuffers: 64 })
/** Buffers taken, reused from the pool, and given back (tests). */
export const sendPoolStats = pool.stats

interface Outbound {
  buffers: Uint8Array[]
  byteLength: number
  reset(): void
  size(): number
}
interface Handler {
  infoReceived: boolean
  connected: boolean
  outbound: Outbound
  transport: { _send?: (frame: Uint8Array) => Promise<void> }
}

const MARK = Symbol.for("gradwire.natsSendPatch")

/** Wraps `ProtocolHandler.prototype.flushPending` and `sendCommand` (shapes.ts has checked them); a second call does nothing. */
export const installSendPatch = (ProtocolHandler: { prototype: object }): void => {
  const proto = ProtocolHandler.prototype as Record<PropertyKey, unknown>
  if (proto[MARK]) return
  const flush = proto.flushPending as (this: Handler) => void
  proto.flushPending = function (this: Handler): void {
    const ob = this.outbound
    const tr = this.transport
    if (
      !this.infoReceived ||
      !this.connected ||
      !ob ||
      !Array.isArray(ob.buffers) ||
      typeof ob.byteLength !== "number" ||
      ob.byteLength < SEND_POOL_MIN_BYTES ||
      typeof tr?._send !== "function"
    ) {
      flush.call(this)
      return
    }
    const n = ob.byteLength
    const frame = pool.take(n)
    let at = 0
    for (const b of ob.buffers) {
      frame.set(b, at)
      at += b.byteLength
    }
    ob.reset()
    // settled by socket.write's callback (or at once when the transport is closed); a write error
    // is ignored here as nats.js does: the read side or the heartbeat notices a dead connection
    const back = (): void => pool.give(frame)
    tr._send(frame).then(back, back)
  }
  const sendCommand = proto.sendCommand as (this: Handler, cmd: unknown, ...payloads: Uint8Array[]) => void
  proto.sendCommand = function (this: Handler, cmd: unknown, ...payloads: Uint8Array[]): void {
    if (!(this.infoReceived && this.connected)) {
      for (let i = 0; i < payloads.length; i++) if (payloads[i] instanceof Uint8Array && isPooledReceive(payloads[i])) payloads[i] = payloads[i].slice()
    }
    sendCommand.call(this, cmd, ...payloads)
  }
  proto[MARK] = true
}
