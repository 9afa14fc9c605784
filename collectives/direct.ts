// The direct data path: bulk collective frames peer to peer over TCP (a Unix domain socket between
// ranks of one node), NATS staying the bus for control, small calls, discovery and the fallback.
//
// Every rank listens (DirectEndpoint.listen) and advertises the address in its communicator hello;
// a receiver dials each peer it takes frames from, one connection per direction, so a link's frames
// arrive in the order they were sent, as they do through NATS from one connection. The dialling
// side receives: a client socket can read into one buffer of its own (net's `onread`) instead of a
// fresh allocation per read, which doubles what a loopback link carries. The sender
// decides per call (communicator.ts): every frame of one call to one peer goes one way, so a
// receiver's per-link order holds; receivers take frames from both paths into the same handler.
// Flow control, deadlines and aborts are the communicator's as over NATS. A receiver's acks (the
// credits) go back on the reverse direction of the link it reads, which carries nothing else, so
// an ack never waits behind anyone's data; without a link they take the control connection.
// A sender uses a link once the receiver has said, in its hello, that it dialled it.
//
// Not an open door: each connection starts with a mutual challenge-response on the job's secret
// (HMAC-SHA256 over the other side's nonce, the group and the ranks; the secret itself never goes
// over the wire), so only members of this job's group exchange frames with it. A peer that fails it
// is told no, dropped and counted (`rejected`); a receiver that cannot connect or authenticate
// within the deadline takes that peer's frames over NATS, and connect() says why (the communicator
// passes it on in its hello). With `tls`, the connections run TLS 1.2 with the secret as pre-shared
// key (PSK, no certificates to hand out) and the challenge inside.
//
// Wire format after the handshake: per frame the 40 header bytes of frames.ts, the payload's byte
// count (u32 LE), the payload. A sender packs the three into one pooled buffer (one copy, one
// write; the buffer goes back when the kernel has the bytes), because the collectives may reuse a
// sent view at once, as they may with nats.js, which copies too; unless the caller hands the
// payload over (send's `written`): then a payload from 64 KiB on goes out as it is, in one
// gathered write after the prefix, and `written` says when the kernel has taken it. A receiver
// reads each payload into a buffer of its own (from the receive pool from 64 KiB, so
// releaseReceived gives it back), or where the endpoint's `place` says, once it has read the
// frame's header: a collective that expects just that frame may have it land in its result.
/** A handed-over payload from this size on is written without the copy (smaller ones are packed). */
const HANDOVER_MIN = 64 * 1024
/** Bytes per read on a receiving link (one buffer per link, reused). */
const READ_BYTES = 1024 * 1024
/** A payload's rest from this size on is read straight into the payload's buffer (no copy). */
const DIRECT_READ_MIN = 64 * 1024
import * as crypto from "node:crypto"
import * as fs from "node:fs"
import * as net from "node:net"
import * as os from "node:os"
import * as path from "node:path"
import * as tls from "node:tls"
import { BufferPool } from "../core/chunking.ts"
import { RECEIVE_POOL_MIN_BYTES, takeReceiveBuffer } from "../core/nats-internals/index.ts"
import { HEADER_BYTES, Kind, frameOf, type Frame } from "./frames.ts"

/** Where a rank listens: TCP always, a Unix domain socket too for peers on its node. */
export interface DirectAddress {
  readonly host: string
  readonly port: number
  readonly path?: string
}

export type TransportChoice = "auto" | "nats" | "direct"

const MAGIC = Buffer.from("GWD1")
const NONCE = 16
const MAC = 32
/** Per-frame prefix: the frame header, then the payload's byte count. */
const PREFIX = HEADER_BYTES + 4
/** A payload larger than this is a corrupt or hostile stream (chunks are at most max_payload). */
const MAX_PAYLOAD = 256 * 1024 * 1024
const PSK_CIPHERS = "PSK-AES128-GCM-SHA256:PSK-AES256-GCM-SHA384:PSK-CHACHA20-POLY1305"
const PSK_IDENTITY = "gradwire"

/** Send buffers: header + count + payload packed once, back when written. */
const sendPool = new BufferPool({ maxIdleBytes: 64 * 1024 * 1024, maxIdleBuffers: 64 })

const mac = (secret: Uint8Array, ...parts: Array<string | Uint8Array>): Buffer => {
  const h = crypto.createHmac("sha256", secret)
  for (const p of parts) h.update(p)
  return h.digest()
}

/** Hands out exactly n bytes at a time during a handshake; what arrives after it stays for the frame parser. */
class HandshakeReader {
  #buf: Buffer = Buffer.alloc(0)
  #want = 0
  #resolve: ((b: Buffer) => void) | undefined
  #reject: ((e: Error) => void) | undefined
  #ended = false
  /** Bytes read (copied: a reused read buffer changes under us). */
  push(chunk: Uint8Array): void {
    this.#buf = Buffer.concat([this.#buf, chunk])
    this.#pump()
  }
  end(): void {
    this.#ended = true
    this.#reject?.(new Error("the connection closed during the handshake"))
  }
  read(n: number): Promise<Buffer> {
    return new Promise((resolve, reject) => {
      this.#want = n
      this.#resolve = resolve
      this.#reject = reject
      this.#pump()
      const waiting = this.#resolve as ((b: Buffer) => void) | undefined
      if (waiting !== undefined && this.#ended) reject(new Error("the connection closed during the handshake"))
    })
  }
  #pump(): void {
    if (!this.#resolve || this.#buf.length < this.#want) return
    const out = this.#buf.subarray(0, this.#want)
    this.#buf = this.#buf.subarray(this.#want)
    const r = this.#resolve
    this.#resolve = undefined
    this.#reject = undefined
    r(out)
  }
  /** What arrived past the handshake. */
  rest(): Buffer {
    return this.#buf
  }
}

const withDeadline = <T>(p: Promise<T>, ms: number, what: string): Promise<T> =>
  new Promise<T>((resolve, reject) => {
    const t = setTimeout(() => reject(new Error(`${what} took longer than ${ms} ms`)), ms)
    p.then(
      (v) => (clearTimeout(t), resolve(v)),
      (e) => (clearTimeout(t), reject(e))
    )
  })

const NO_BYTES = new Uint8Array(0)

/** Splits a byte stream into frames, each payload in a buffer of its own (or where `place` puts it). */
class FrameParser {
  readonly #prefix = new Uint8Array(PREFIX)
  #have = 0
  #payload: Uint8Array | undefined
  #filled = 0
  readonly #emit: (f: Frame) => void
  readonly #fail: (reason: string) => void
  readonly #place: DirectEndpointOptions["place"]
  constructor(emit: (f: Frame) => void, fail: (reason: string) => void, place?: DirectEndpointOptions["place"]) {
    this.#emit = emit
    this.#fail = fail
    this.#place = place
  }
  push(chunk: Uint8Array): void {
    let at = 0
    while (at < chunk.length) {
      if (this.#payload === undefined) {
        const take = Math.min(PREFIX - this.#have, chunk.length - at)
        this.#prefix.set(chunk.subarray(at, at + take), this.#have)
        this.#have += take
        at += take
        if (this.#have < PREFIX) return
        const n = new DataView(this.#prefix.buffer).getUint32(HEADER_BYTES, true)
        if (n > MAX_PAYLOAD) return this.#fail(`a frame announced ${n} payload bytes (at most ${MAX_PAYLOAD})`)
        const head = n > 0 && this.#place !== undefined ? frameOf(this.#prefix.subarray(0, HEADER_BYTES), NO_BYTES) : undefined
        const target = head !== undefined && head.kind === Kind.data ? this.#place?.(head, n) : undefined
        this.#payload = target !== undefined && target.length === n ? target : n >= RECEIVE_POOL_MIN_BYTES ? takeReceiveBuffer(n) : new Uint8Array(n)
        this.#filled = 0
      }
      const p = this.#payload
      const take = Math.min(p.length - this.#filled, chunk.length - at)
      if (take > 0) p.set(chunk.subarray(at, at + take), this.#filled)
      this.#filled += take
      at += take
      if (this.#filled < p.length) return
      this.#complete()
    }
  }
  /**
   * Where the next socket read may go straight: the rest of the payload being received, when that
   * is large enough to be worth a read of its own (undefined: read into the link's buffer and push).
   */
  readTarget(): Uint8Array | undefined {
    const p = this.#payload
    if (p === undefined || p.length - this.#filled < DIRECT_READ_MIN) return undefined
    return p.subarray(this.#filled)
  }
  /** `n` bytes were read into readTarget()'s view. */
  advance(n: number): void {
    this.#filled += n
    if (this.#filled >= (this.#payload as Uint8Array).length) this.#complete()
  }
  #complete(): void {
    const f = frameOf(this.#prefix.subarray(0, HEADER_BYTES), this.#payload as Uint8Array)
    this.#payload = undefined
    this.#have = 0
    if (!f) return this.#fail("a frame header without the collectives' magic byte")
    this.#emit(f)
  }
}

export interface DirectEndpointOptions {
  readonly group: string
  readonly rank: number
  /** The job's secret (at least 16 bytes), handed to every rank over the bus. */
  readonly secret: Uint8Array
  /** Address to listen on. Default 127.0.0.1. */
  readonly host?: string
  /** Host peers dial (behind NAT, or listening on 0.0.0.0). Default: host. */
  readonly advertise?: string
  /** Also listen on a Unix domain socket for peers of this node. Default true (not on Windows). */
  readonly unixSocket?: boolean
  /** TLS 1.2 with the secret as pre-shared key. Default false. */
  readonly tls?: boolean
  /** Frames from authenticated peers. */
  readonly onFrame: (f: Frame) => void
  /**
   * Where a data frame's payload of `bytes` may be read, asked once its header (`head`, payload
   * empty) has arrived: a view of exactly that many bytes, or undefined for a buffer of its own.
   * The frame then reaches onFrame with that view as its payload.
   */
  readonly place?: (head: Frame, bytes: number) => Uint8Array | undefined
  /** An authenticated link closed or failed while the endpoint was open: "in" (frames from the peer) or "out" (to it). */
  readonly onLinkDown: (peer: number, direction: "in" | "out", reason: string) => void
}

interface Link {
  readonly socket: net.Socket
  readonly via: "tcp" | "unix"
}

/** One rank's end of the direct data path: its listener, the links it sends on and those it reads. */
export class DirectEndpoint {
  readonly address: DirectAddress
  /** Inbound connections dropped for failing authentication (or speaking something else). */
  rejected = 0
  /** Frames read where `place` said. */
  framesInPlace = 0
  bytesSent = 0
  bytesReceived = 0
  readonly #opts: DirectEndpointOptions
  readonly #servers: net.Server[]
  /** Links this rank sends on (peers that dialled it), by peer. */
  readonly #out = new Map<number, Link>()
  /** Links this rank reads (peers it dialled), by peer. */
  readonly #in = new Map<number, Link>()
  readonly #pending = new Set<net.Socket>()
  #closed = false

  private constructor(opts: DirectEndpointOptions, servers: net.Server[], address: DirectAddress) {
    this.#opts = opts
    this.#servers = servers
    this.address = address
    for (const s of servers) s.on(opts.tls ? "secureConnection" : "connection", (socket: net.Socket) => void this.#accept(socket, s === servers[0] ? "tcp" : "unix"))
  }

  static async listen(opts: DirectEndpointOptions): Promise<DirectEndpoint> {
    if (!(opts.secret instanceof Uint8Array) || opts.secret.length < 16) throw new RangeError("the direct path needs a job secret of at least 16 bytes")
    const host = opts.host ?? "127.0.0.1"
    const make = (): net.Server =>
      opts.tls
        ? tls.createServer({ ciphers: PSK_CIPHERS, maxVersion: "TLSv1.2", minVersion: "TLSv1.2", pskCallback: () => Buffer.from(opts.secret), pskIdentityHint: PSK_IDENTITY })
        : net.createServer({ noDelay: true })
    const listenOn = (srv: net.Server, where: net.ListenOptions): Promise<void> =>
      new Promise((resolve, reject) => {
        srv.once("error", reject)
        srv.listen(where, () => (srv.off("error", reject), resolve()))
      })
    const tcp = make()
    await listenOn(tcp, { host, port: 0 })
    // Links and listeners never keep a process alive by themselves (the bus connection does).
    tcp.unref()
    const port = (tcp.address() as net.AddressInfo).port
    const servers = [tcp]
    let sock: string | undefined
    if ((opts.unixSocket ?? true) && process.platform !== "win32") {
      // Linux: an abstract socket (no file, so nothing is left behind by a killed process; only
      // processes of this network namespace see it, and they must still pass the handshake).
      // Elsewhere a socket file in a directory of its own, removed when the listener closes.
      const abstract = process.platform === "linux"
      const dir = abstract ? undefined : fs.mkdtempSync(path.join(os.tmpdir(), "gw-direct-"))
      sock = dir === undefined ? `\0gw-direct-${crypto.randomBytes(12).toString("hex")}` : path.join(dir, "s")
      const uds = make()
      const clean = (): void => {
        if (dir !== undefined) fs.rmSync(dir, { recursive: true, force: true })
      }
      try {
        await listenOn(uds, { path: sock })
        uds.unref()
        servers.push(uds)
        uds.on("close", clean)
      } catch {
        clean()
        sock = undefined
      }
    }
    const shown = opts.advertise ?? (host === "0.0.0.0" || host === "::" ? os.hostname() : host)
    const address: DirectAddress = sock ? { host: shown, port, path: sock } : { host: shown, port }
    return new DirectEndpoint(opts, servers, address)
  }

  /** Whether this rank can send frames to the peer directly (the peer dialled it). */
  has(peer: number): boolean {
    return this.#out.has(peer)
  }

  /** How this rank sends to a peer: "unix", "tcp", or undefined (NATS). */
  via(peer: number): "tcp" | "unix" | undefined {
    return this.#out.get(peer)?.via
  }

  /** Whether this rank reads a link from the peer (it dialled the peer). */
  reads(peer: number): boolean {
    return this.#in.has(peer)
  }

  /**
   * Dials a peer (a Unix socket when `sameNode` and it has one, else TCP) and authenticates, within
   * `timeoutMs`, to read the frames the peer sends this rank. Returns undefined when the link is up,
   * else why not (the peer's frames then come over NATS).
   */
  async connect(peer: number, addr: DirectAddress, sameNode: boolean, timeoutMs: number): Promise<string | undefined> {
    const reasons: string[] = []
    for (const via of sameNode && addr.path ? (["unix", "tcp"] as const) : (["tcp"] as const)) {
      try {
        await this.#dial(peer, via, addr, timeoutMs)
        return undefined
      } catch (e) {
        reasons.push(e instanceof Error ? e.message : String(e))
      }
    }
    return reasons.join("; ")
  }

  async #dial(peer: number, via: "tcp" | "unix", addr: DirectAddress, timeoutMs: number): Promise<void> {
    if (this.#closed) throw new Error("the endpoint closed")
    const where = via === "unix" ? `${addr.path}` : `${addr.host}:${addr.port}`
    const target = via === "unix" ? { path: addr.path as string } : { host: addr.host, port: addr.port }
    // Reads go into one buffer per link; a handshake reader, then the frame parser, takes them.
    let sink: (chunk: Uint8Array) => void = () => {}
    const hs = new HandshakeReader()
    sink = (c) => hs.push(c)
    const readBuf = Buffer.allocUnsafe(READ_BYTES)
    // After the handshake the parser may offer the rest of a large payload as the next read's
    // target: the kernel's bytes land in the payload's own buffer, with no copy out of readBuf.
    let parser: FrameParser | undefined
    let into: Uint8Array | undefined
    const nextRead = (): Uint8Array => (into = parser?.readTarget()) ?? readBuf
    const onRead = (n: number, b: Uint8Array): boolean => {
      if (into !== undefined && b === into) {
        this.bytesReceived += n
        if (!broken) parser!.advance(n)
      } else sink(b.subarray(0, n))
      return true
    }
    const socket: net.Socket = this.#opts.tls
      ? tls.connect({
          ...target,
          ciphers: PSK_CIPHERS,
          maxVersion: "TLSv1.2",
          minVersion: "TLSv1.2",
          checkServerIdentity: () => undefined,
          pskCallback: () => ({ psk: Buffer.from(this.#opts.secret), identity: PSK_IDENTITY })
        })
      : net.connect({ ...target, onread: { buffer: nextRead, callback: onRead } })
    if (this.#opts.tls) socket.on("data", (c: Buffer) => sink(c))
    this.#pending.add(socket)
    socket.on("error", () => {})
    socket.on("close", () => hs.end())
    try {
      await withDeadline(
        new Promise<void>((resolve, reject) => {
          socket.once(this.#opts.tls ? "secureConnect" : "connect", () => resolve())
          socket.once("close", () => reject(new Error(`connecting to rank ${peer} at ${where} failed`)))
          socket.once("error", (e) => reject(new Error(`connecting to rank ${peer} at ${where}: ${e.message}`)))
        }),
        timeoutMs,
        `connecting to rank ${peer} at ${where}`
      )
      socket.setNoDelay(true)
      await withDeadline(this.#clientHandshake(socket, hs, peer), timeoutMs, `authenticating with rank ${peer}`)
      if (this.#closed) throw new Error("the endpoint closed")
    } catch (e) {
      socket.destroy()
      throw e
    } finally {
      this.#pending.delete(socket)
    }
    let broken = false
    const frames = new FrameParser(
      (f) => {
        if (f.src !== peer) {
          broken = true
          socket.destroy()
          return
        }
        this.#opts.onFrame(f)
      },
      () => {
        broken = true
        socket.destroy()
      },
      this.#opts.place === undefined
        ? undefined
        : (head, bytes) => {
            const at = this.#opts.place?.(head, bytes)
            if (at !== undefined && at.length === bytes) this.framesInPlace++
            return at
          }
    )
    sink = (chunk) => {
      this.bytesReceived += chunk.length
      if (!broken) frames.push(chunk)
    }
    if (!this.#opts.tls) parser = frames
    socket.unref()
    this.#in.set(peer, { socket, via })
    socket.on("close", () => {
      if (this.#in.get(peer)?.socket !== socket) return
      this.#in.delete(peer)
      if (!this.#closed) this.#opts.onLinkDown(peer, "in", broken ? "the peer sent a malformed frame" : "the connection closed")
    })
    const rest = hs.rest()
    if (rest.length > 0) sink(rest)
  }

  // Client (the receiving side): reads the server's nonce, answers with its own, the group, both
  // ranks and the MAC; then checks the server's verdict and MAC over its nonce.
  async #clientHandshake(socket: net.Socket, r: HandshakeReader, peer: number): Promise<void> {
    const { group, rank, secret } = this.#opts
    const hello = await r.read(MAGIC.length + NONCE)
    if (!hello.subarray(0, MAGIC.length).equals(MAGIC)) throw new Error(`rank ${peer}'s address does not speak the direct path`)
    const serverNonce = Buffer.from(hello.subarray(MAGIC.length))
    const clientNonce = crypto.randomBytes(NONCE)
    const g = Buffer.from(group)
    const head = Buffer.alloc(2 + 4 + 4)
    head.writeUInt16LE(g.length, 0)
    head.writeUInt32LE(rank, 2)
    head.writeUInt32LE(peer, 6)
    socket.write(Buffer.concat([MAGIC, head, g, clientNonce, mac(secret, "client", serverNonce, g, head)]))
    const status = await r.read(1).catch(() => Buffer.from([0]))
    if (status[0] !== 1) throw new Error(`rank ${peer} refused this rank's authentication: they hold different job secrets (or it belongs to another group)`)
    const answer = await r.read(MAC)
    if (!crypto.timingSafeEqual(answer, mac(secret, "server", clientNonce, g, head))) throw new Error(`rank ${peer} failed authentication: it does not hold this job's secret`)
  }

  // Server (the sending side): challenges the dialler; on success the socket is this rank's link to it.
  async #accept(socket: net.Socket, via: "tcp" | "unix"): Promise<void> {
    const { group, rank, secret } = this.#opts
    socket.on("error", () => {})
    if (this.#closed) return void socket.destroy()
    const r = new HandshakeReader()
    const onData = (c: Buffer): void => r.push(c)
    socket.on("data", onData)
    socket.on("close", () => r.end())
    let src = -1
    try {
      await withDeadline(
        (async () => {
          const nonce = crypto.randomBytes(NONCE)
          socket.write(Buffer.concat([MAGIC, nonce]))
          const first = await r.read(MAGIC.length + 10)
          if (!first.subarray(0, MAGIC.length).equals(MAGIC)) throw new Error("not the direct path's protocol")
          const head = Buffer.from(first.subarray(MAGIC.length))
          const gLen = head.readUInt16LE(0)
          src = head.readUInt32LE(2)
          const dst = head.readUInt32LE(6)
          if (gLen === 0 || gLen > 128) throw new Error(`a group name of ${gLen} bytes`)
          const more = await r.read(gLen + NONCE + MAC)
          const g = more.subarray(0, gLen)
          const clientNonce = more.subarray(gLen, gLen + NONCE)
          const theirs = more.subarray(gLen + NONCE)
          if (!crypto.timingSafeEqual(theirs, mac(secret, "client", nonce, g, head)) || g.toString() !== group || dst !== rank) {
            // Say no before closing, so an honest peer with the wrong secret knows why.
            socket.end(Buffer.from([0]))
            throw new Error("authentication failed")
          }
          socket.write(Buffer.concat([Buffer.from([1]), mac(secret, "server", clientNonce, g, head)]))
        })(),
        10_000,
        "an inbound handshake"
      )
    } catch {
      this.rejected++
      // give a refusal a moment to leave before the socket goes
      setTimeout(() => socket.destroy(), 100).unref()
      return
    }
    socket.off("data", onData)
    if (this.#closed) return void socket.destroy()
    socket.setNoDelay(true)
    socket.unref()
    // Data frames flow out on this socket; the dialler sends back only its acks for them (credits
    // on the reverse direction of the same connection: they never queue behind anyone's data).
    const acks = new FrameParser(
      (f) => {
        if (f.kind === Kind.ack && f.src === src) this.#opts.onFrame(f)
        else socket.destroy()
      },
      () => socket.destroy()
    )
    socket.on("data", (c: Buffer) => acks.push(c))
    const prev = this.#out.get(src)
    if (prev) prev.socket.destroy()
    this.#out.set(src, { socket, via })
    socket.on("close", () => {
      if (this.#out.get(src)?.socket !== socket) return
      this.#out.delete(src)
      if (!this.#closed) this.#opts.onLinkDown(src, "out", "the connection closed")
    })
  }

  /**
   * Sends one frame to a peer: header, count and payload packed into one pooled buffer. Throws
   * when the link is gone. With `written` the caller hands the payload over: it leaves it as it is
   * until `written` is called (once the kernel has every byte, or the link failed), and a large
   * one is written from where it lies, without the copy. `flushed`, when given, is called once the
   * kernel has the whole frame (or the link failed): what a socket's buffer could not take at once
   * stays in this process and moves only when its event loop runs.
   */
  send(peer: number, header: Uint8Array, payload: Uint8Array, written?: () => void, flushed?: () => void): void {
    const out = this.#out.get(peer)
    if (!out) throw new Error(`the direct link to rank ${peer} is gone`)
    const n = PREFIX + payload.length
    this.bytesSent += n
    if (written !== undefined && payload.length >= HANDOVER_MIN) {
      const prefix = Buffer.allocUnsafe(PREFIX)
      prefix.set(header.subarray(0, HEADER_BYTES), 0)
      prefix.writeUInt32LE(payload.length, HEADER_BYTES)
      // corked: the prefix and the payload leave in one gathered write
      out.socket.cork()
      out.socket.write(prefix)
      out.socket.write(payload, () => (written(), flushed?.()))
      out.socket.uncork()
      return
    }
    const buf = sendPool.take(n)
    buf.set(header.subarray(0, HEADER_BYTES), 0)
    new DataView(buf.buffer, buf.byteOffset + HEADER_BYTES, 4).setUint32(0, payload.length, true)
    buf.set(payload, PREFIX)
    out.socket.write(buf, () => (sendPool.give(buf), flushed?.()))
    written?.()
  }

  /** Sends an ack (a frame header without payload) back on the link this rank reads from the peer; false when there is none. */
  ack(peer: number, header: Uint8Array): boolean {
    const l = this.#in.get(peer)
    if (!l) return false
    const buf = Buffer.allocUnsafe(PREFIX)
    buf.set(header.subarray(0, HEADER_BYTES), 0)
    buf.writeUInt32LE(0, HEADER_BYTES)
    l.socket.write(buf)
    return true
  }

  /** Closes the listener and every link; pending writes are flushed first (end, then destroy after a grace period). */
  async close(): Promise<void> {
    if (this.#closed) return
    this.#closed = true
    const sockets = [...[...this.#out.values(), ...this.#in.values()].map((l) => l.socket), ...this.#pending]
    this.#out.clear()
    this.#in.clear()
    this.#pending.clear()
    await Promise.all([
      ...this.#servers.map((s) => new Promise<void>((resolve) => s.close(() => resolve()))),
      ...sockets.map(
        (s) =>
          new Promise<void>((resolve) => {
            if (s.destroyed) return resolve()
            const t = setTimeout(() => (s.destroy(), resolve()), 2_000)
            t.unref()
            s.once("close", () => (clearTimeout(t), resolve()))
            s.end()
          })
      )
    ])
  }
}
