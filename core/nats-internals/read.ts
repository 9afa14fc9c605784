// Receiving from the socket into reused buffers.
//
// Node reads a socket into a fresh 64 KiB ArrayBuffer per read. Those are external memory, and on
// a 64 MiB all-reduce at p = 4 a rank receives 48-96 MiB per step: V8 answers with scavenges and
// full mark-compacts ("GC in old space requested"), 61 ms per rank and step uncompressed and
// 25 ms with fp16 (--trace-gc on the benchmark's ranks), a third and a fifth of their CPU.
//
// Here a plain TCP connection of nats.js's Node transport reads through the socket's `onread`
// into buffers from a small pool: each read is handed to the transport as a 'data' frame, as
// before, and the buffer goes back to the pool once the protocol parser has been through it
// (receive.ts calls releaseRead after each parse).
//
// That is safe because nothing keeps a view of a read buffer past its parse: nats.js's parser
// copies what spans reads (its DenoBuffer copies on construction and growth, and large messages go
// to receive.ts's pool), and the views it does hand on (a message that fits in one read, its
// subject and reply, an -ERR or INFO argument) are copied as they are dispatched (receive.ts).
// A read the parser never reaches (the connection closed) is left to the collector.
//
// TLS connections keep Node's own reads (TLS needs the socket's stream). GRADWIRE_NATS_READ_POOL=0
// turns it off (A/B runs). Installed by index.ts's installNatsPatches, and only after shapes.ts has
// found what this relies on (NodeTransport.prototype.dial returning a promise of the socket, and
// connect dialling through it).
import { createConnection, type Socket } from "node:net"
import { BufferPool } from "../chunking.ts"
import * as settings from "../settings.ts"

/** Bytes per read buffer (Node's own read size). */
export const READ_BYTES = 64 * 1024
/** At most 256 idle read buffers kept (16 MiB). */
const pool = new BufferPool({ maxIdleBytes: 256 * READ_BYTES, maxIdleBuffers: 256 })
/** Read buffers taken, of those reused from the pool, and given back (tests). */
export const readPoolStats = pool.stats

/** A pooled buffer as a plain Uint8Array (the pool lends Buffers, whose slice() is a view, not a copy). */
const take = (): Uint8Array => new Uint8Array(pool.take(READ_BYTES).buffer, 0, READ_BYTES)

/** Whether `x` is a view of a read buffer not yet given back. */
export const isReadView = (x: unknown): x is Uint8Array => x instanceof Uint8Array && pool.owns(x)

/** Gives the read buffer behind `x` back, once the parser is through it. Other views are ignored. */
export const releaseRead = (x: Uint8Array): void => {
  if (pool.owns(x)) pool.give(x)
}

interface TransportLike {
  options?: { tls?: unknown }
}
type Dial = (this: TransportLike, hp: { port: number; hostname: string }) => Promise<Socket>
type On = (this: Socket, ev: string | symbol, fn: (...args: any[]) => void) => Socket

const MARK = Symbol.for("gradwire.natsReadPatch")

/** dial as nats.js does it (connect, no delay, reject with the socket's error on close), reading through the pool. */
const pooledDial = (hp: { port: number; hostname: string }): Promise<Socket> =>
  new Promise<Socket>((resolve, reject) => {
    let dialError: Error | undefined
    // reads that came before the transport listens for 'data' (between its handlers)
    const queued: Uint8Array[] = []
    const flush = (): void => {
      while (queued.length > 0 && socket.listenerCount("data") > 0) socket.emit("data", queued.shift())
    }
    const socket: Socket = createConnection(
      {
        port: hp.port,
        host: hp.hostname,
        onread: {
          buffer: take,
          callback: (n: number, buf: Uint8Array): boolean => {
            queued.push(buf.subarray(0, n))
            flush()
            return true
          }
        }
      },
      () => {
        socket.removeAllListeners()
        resolve(socket)
      }
    )
    // the transport swaps its 'data' handler once (after the server's INFO); a listener added
    // later gets what was queued meanwhile
    const on = socket.on as On
    socket.on = function (this: Socket, ev: string | symbol, fn: (...args: any[]) => void): Socket {
      const r = on.call(this, ev, fn)
      if (ev === "data" && queued.length > 0) queueMicrotask(flush)
      return r
    } as typeof socket.on
    socket.on("error", (err: Error) => {
      dialError = err
    })
    socket.on("close", () => {
      socket.removeAllListeners()
      reject(dialError)
    })
    socket.setNoDelay(true)
  })

/** Wraps `NodeTransport.prototype.dial` (shapes.ts has checked it); a second call does nothing. */
export const installReadPatch = (NodeTransport: { prototype: object }): void => {
  const proto = NodeTransport.prototype as Record<PropertyKey, unknown>
  if (proto[MARK]) return
  const dial = proto.dial as Dial
  proto.dial = function (this: TransportLike, hp: { port: number; hostname: string }): Promise<Socket> {
    if (!settings.natsReadPool.read() || this.options?.tls || typeof hp?.port !== "number") return dial.call(this, hp)
    return pooledDial(hp)
  }
  proto[MARK] = true
}
